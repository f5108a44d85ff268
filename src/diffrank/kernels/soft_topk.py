"""Fused Triton kernels for SOFT top-k membership (Xie et al., NeurIPS 2020), two anchors, Newton dual.

With the anchors y = (0, 1), masses (k/n, (n-k)/n), uniform item masses 1/n and x = -s, the entropic OT
plan is fixed by one scalar per row (see :func:`diffrank.operators.soft_topk._two_anchor_newton`):

    A_i = n Γ_i0 = σ(z_i + Δ),   z_i = (C_i1 - C_i0)/ε = (1 + 2 s_i) / (ε · norm),   Σ_i σ(z_i + Δ) = k.

- Forward: one program per (sample, k) solves the 1-D equation for Δ on chip by the same safeguarded
  Newton iteration as the PyTorch path (same start from the k-th and (k+1)-th largest scores, same bracket,
  same stopping rule |Σ σ - k| < 1e-13 n or a collapsed bracket), then writes A in closed form. Each
  iteration is one pass over the row (Σ σ and Σ σ(1 - σ)); the row stays in L1/L2 between passes.
- Backward: implicit differentiation of the same equation (paper App. H, Thm 3, reduced to two anchors):
  with σ'_i = σ(h_i) σ(-h_i), ∂L/∂s_i = (2 / (ε norm)) σ'_i (v_i - v̄), v̄ = Σ σ' v / Σ σ'. One program per
  (sample, k), two passes; a saturated row (Σ σ' = 0) has derivative 0, as the PyTorch pseudo-inverse gives.

Everything is float64, as in the PyTorch path: at small ε the logits z_i reach 1e4-1e6, where float32's
spacing (1e-3-0.1) would move A by up to 0.02. The cost normalisation (``norm``) is computed by the caller
and treated as a constant (detached), as in the PyTorch path. No limit on n (rows are walked in blocks).

Launch functions only (:func:`newton_forward`, :func:`newton_backward`): the autograd Function, its recorded
backward and vmap rule are the operator's, in :mod:`diffrank.operators.soft_topk`. On the CPU the kernels run under
``TRITON_INTERPRET=1`` (tests); :class:`~diffrank.operators.soft_topk.SoftTopK` uses them for CUDA inputs with
``backend="auto"`` and always with ``backend="triton"``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from diffrank.kernels._common import block_size


@triton.jit
def _sigmoid(h):
    """σ(h) from e^{-|h|} only (no overflow for either sign)."""
    e = tl.exp(-tl.abs(h))
    return tl.where(h >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _soft_topk_fwd(s_ptr, start_ptr, k_ptr, scale_ptr, a_ptr, delta_ptr, stat_ptr, n, M, max_iter,
                   BLOCK: tl.constexpr):
    """Program per row r = b M + m: Δ_r by safeguarded Newton, then A[r] = σ(z + Δ_r).

    ``scale`` (B,) = 1/(ε norm) in float64; ``start`` (R, 2): the scores of ranks ⌊k⌋ and ⌊k⌋ + 1 (clamped
    to [1, n-1]); ``stat`` (R, 2) ← (iterations, final |Σ σ - k|).
    """
    pid = tl.program_id(0)
    b = pid // M
    s_row = s_ptr + b * n
    scale = tl.load(scale_ptr + b)
    target = tl.load(k_ptr + pid)
    lo_s = tl.load(start_ptr + 2 * pid).to(tl.float64)
    hi_s = tl.load(start_ptr + 2 * pid + 1).to(tl.float64)
    delta = -((1.0 + 2.0 * lo_s) * scale + (1.0 + 2.0 * hi_s) * scale) / 2.0
    zmax = tl.full([BLOCK], float("-inf"), tl.float64)
    zmin = tl.full([BLOCK], float("inf"), tl.float64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        z = (1.0 + 2.0 * tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float64)) * scale
        zmax = tl.maximum(zmax, tl.where(mask, z, float("-inf")))
        zmin = tl.minimum(zmin, tl.where(mask, z, float("inf")))
    # Σσ < k at lo and > k at hi (σ(±40) ≈ 4e-18)
    lo = -tl.max(zmax, axis=0) - 40.0
    hi = -tl.min(zmin, axis=0) + 40.0
    thr = 1e-13 * n
    it = tl.full([], 0, tl.int32)
    done = tl.full([], 0, tl.int32)
    phi = delta * 0.0
    prev = delta * 0.0 + float("inf")  # |phi| of the previous iteration
    while (it < max_iter) & (done == 0):
        acc = tl.zeros([BLOCK], tl.float64)
        dacc = tl.zeros([BLOCK], tl.float64)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            z = (1.0 + 2.0 * tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float64)) * scale
            sig = tl.where(mask, _sigmoid(z + delta), 0.0)
            acc += sig
            dacc += sig * (1.0 - sig)
        phi = tl.sum(acc, axis=0) - target
        it += 1
        # a row is done when its sum is exact to rounding or its bracket has collapsed
        done = ((tl.abs(phi) < thr) | ((hi - lo) <= 1e-15 * (1.0 + tl.abs(delta)))).to(tl.int32)
        up = phi > 0
        hi = tl.where(up, delta, hi)
        lo = tl.where(up, lo, delta)
        # a step outside the bracket (a saturated row has slope 0: the step is huge) bisects instead, and so
        # does one after a Newton step that did not halve |phi| (two steep sigmoids make Newton ping-pong
        # between them inside the bracket, which then shrinks by 1e-3 per iteration)
        step = delta - phi / tl.maximum(tl.sum(dacc, axis=0), 1e-300)
        inside = (step >= lo) & (step <= hi) & (tl.abs(phi) <= 0.5 * prev)
        prev = tl.abs(phi)
        delta = tl.where(done != 0, delta, tl.where(inside, step, (lo + hi) / 2.0))
    tl.store(delta_ptr + pid, delta)
    tl.store(stat_ptr + 2 * pid, it.to(tl.float64))
    tl.store(stat_ptr + 2 * pid + 1, tl.abs(phi))
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        z = (1.0 + 2.0 * tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float64)) * scale
        tl.store(a_ptr + pid * n + offs, _sigmoid(z + delta).to(a_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _soft_topk_bwd(s_ptr, scale_ptr, delta_ptr, g_ptr, ds_ptr, n, M, BLOCK: tl.constexpr):
    """Program per row r: ds[r] = 2 scale σ' (v - v̄), v̄ = Σ σ' v / Σ σ' (implicit function theorem)."""
    pid = tl.program_id(0)
    b = pid // M
    s_row = s_ptr + b * n
    scale = tl.load(scale_ptr + b)
    delta = tl.load(delta_ptr + pid)
    wsum = tl.zeros([BLOCK], tl.float64)
    gsum = tl.zeros([BLOCK], tl.float64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        h = (1.0 + 2.0 * tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float64)) * scale + delta
        w = tl.where(mask, _sigmoid(h) * _sigmoid(-h), 0.0)
        g = tl.load(g_ptr + pid * n + offs, mask=mask, other=0.0).to(tl.float64)
        wsum += w
        gsum += w * g
    total = tl.sum(wsum, axis=0)
    gbar = tl.sum(gsum, axis=0) / tl.maximum(total, 1e-300)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        h = (1.0 + 2.0 * tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float64)) * scale + delta
        w = _sigmoid(h) * _sigmoid(-h)
        g = tl.load(g_ptr + pid * n + offs, mask=mask, other=0.0).to(tl.float64)
        tl.store(ds_ptr + pid * n + offs, 2.0 * scale * w * (g - gbar), mask=mask)


# items per block of a row; longer rows loop over blocks (the tests lower it). 1 024 float64 lanes over 4 warps
# spill on sm_80 (docs/gpu.md, budgets); 512 hold in 95-104 registers
_MAX_BLOCK = 512


def newton_forward(scores: Tensor, ks: Tensor, scale: Tensor, max_iter: int) -> tuple[Tensor, Tensor, int, float]:
    """SOFT top-k memberships A[b, m] = σ(z_b + Δ_bm) with Σ_i A = k_m by the fused two-anchor Newton solve (Xie et
    al. 2020, eq. (4)), forward launch only (the autograd Function is
    :class:`~diffrank.operators.soft_topk._SoftTopKNewton`).

    Args:
        scores: ``(B, n)`` float32 / float64 on CUDA (or the CPU under ``TRITON_INTERPRET=1``), finite.
        ks: ``(M,)`` float64 targets, integers in [1, n - 1].
        scale: ``(B,)`` float64 1 / (ε · norm).
        max_iter: Newton iteration cap.

    Returns:
        ``(A, Δ, iterations, error)``: A ``(B, M, n)`` of the scores' dtype, Δ ``(B, M)`` float64 (row-indexed,
        for vmap's folding), the largest iteration count and final |Σ_i A_i - k| over rows (one host
        synchronisation).

    Raises:
        Nothing of its own: the caller validates the inputs.
    """
    s = scores.contiguous()
    B, n = s.shape
    M = ks.shape[0]
    # Newton's start as in the PyTorch path: midway between the logits of ranks ⌊k⌋ and ⌊k⌋ + 1
    idx = ks.floor().long().clamp(1, n - 1)
    top = s.topk(int(idx.max()) + 1, dim=-1).values.double()  # (B, max idx + 1), descending
    start = torch.stack([top[:, idx - 1], top[:, idx]], dim=-1).contiguous()  # (B, M, 2)
    kr = ks.double().repeat(B).contiguous()
    a = torch.empty(B, M, n, dtype=scores.dtype, device=s.device)
    delta = torch.empty(B * M, dtype=torch.float64, device=s.device)
    stat = torch.empty(B * M, 2, dtype=torch.float64, device=s.device)
    _soft_topk_fwd[(B * M,)](s, start, kr, scale, a, delta, stat, n, M, int(max_iter),
                             BLOCK=block_size(n, _MAX_BLOCK))
    it_err = stat.amax(0).tolist()  # one host synchronisation, as the PyTorch path's stopping rule
    return a, delta.view(B, M), int(it_err[0]), it_err[1]  # Δ (B, M): row-indexed, for vmap's folding


def newton_backward(s: Tensor, scale: Tensor, delta: Tensor, a: Tensor, grad_a: Tensor) -> Tensor:
    """VJP of :func:`newton_forward` by implicit differentiation (paper App. H): ∂L/∂s_i = 2 scale σ'_i (v_i - v̄).

    Args:
        s: ``(B, n)`` scores; scale: ``(B,)``; delta: ``(B, M)`` the forward's Δ; a: ``(B, M, n)`` its output;
        grad_a: ``(B, M, n)`` upstream.

    Returns:
        ``(B, n)`` gradient of the scores' dtype.

    Raises:
        Nothing of its own.
    """
    B, n = s.shape
    M = a.shape[1]
    ds = torch.empty(B, M, n, dtype=torch.float64, device=s.device)
    _soft_topk_bwd[(B * M,)](s, scale, delta.contiguous(), grad_a.contiguous(), ds, n, M,
                             BLOCK=block_size(n, _MAX_BLOCK))
    return ds.sum(1).to(s.dtype)
