"""Sparse soft top-k (Sander, Puigcerver, Djolonga, Peyré, Blondel; ICML 2023), a PyTorch port of the method.

"Fast, Differentiable and Sparse Top-k: a Convex Analysis Perspective", §3-4. With w = (1_k, 0_{n-k}), the
permutahedron P(w) is the capped simplex C_k = {y ∈ [0, 1]^n : Σ y = k}, and the relaxed top-k mask is

    mask(x) = argmax_{y ∈ C_k} ⟨x, y⟩ - (λ/p) ‖y‖_p^p,       λ = 1/β  (docs/conventions.md),

for p = 2 (the Euclidean projection of βx onto C_k; piecewise linear) and p = 4/3 (the paper's default; C¹
in x). Both are exactly sparse: items below a soft margin get an exact 0, items above it an exact 1. Since
λ only scales x, everything is computed on z = βx with λ = 1.

- **PAV solver** (``solver="pav"``, paper §4.2, Prop. 4 and 5): sort z descending to s, solve the isotonic
  problem v = argmin_{v_1 ≥ … ≥ v_n} Σ_i (1/q)|s_i - v_i|^q + ⟨w, v⟩ (q = p/(p-1): 2 or 4) by pool
  adjacent violators, output y = (s - v)^{q-1}, un-permuted. A pooled block B takes the value γ solving
  Σ_B (s_i - γ)^{q-1} = Σ_B w_i: the block mean of s - w for q = 2, the real root of a depressed cubic for
  q = 4 (kept as the block's count, mean and centred second and third moments, merged without
  cancellation; the root from the cancellation-free form of Cardano's formula, polished by Newton steps).
  O(n) after the O(n log n) sort: a numba kernel over the rows on the CPU; on CUDA (``backend="auto"``) the
  Triton kernels of :mod:`diffrank.kernels.sparse_soft_topk`, one program per row, in the same float64
  operations (no host copy; ``backend="torch"`` copies CUDA inputs to the host for the numba kernel instead).
  Singleton blocks return their w_i (0 or 1) exactly.
- **VJP** (paper §4.3): the isotonic Jacobian is block diagonal. Within a pooled block, with
  a_i = (q-1)(s_i - γ)^{q-2} (1 for p = 2, 3 y_i^{2/3} for p = 4/3),
  ∂L/∂s_i = a_i (g_i - Σ_B a g / Σ_B a); singleton blocks (exact 0 / 1) pass no gradient. O(n), in torch ops
  (scatter-adds over the blocks). With a written as a function of the mask, the VJP is differentiable again:
  exact second derivatives for both p (for p = 2 the mask is piecewise linear, its curvature 0).
- ``torch.func`` / ``torch.compile``: the PAV (numba or Triton) is a ``torch.library`` custom op (compile calls
  it instead of tracing into numba), the Functions take no ``ctx`` and map under ``vmap`` by folding into the batch.
- **Dykstra solver** (``solver="dykstra"``, p = 2 only; paper §4.2 "Dykstra", the GPU-friendly variant):
  Dykstra's alternating projections onto the odd-pair and the even-pair order constraints (each a pairwise
  average of violating neighbours), batched in torch in the input's compute dtype. Approximate: it stops
  after ``max_iter`` iterations or when an iterate moves less than ``tolerance`` (z units). Its VJP is the
  p = 2 block VJP above on the blocks read off the iterate (neighbours closer than √``tolerance``).
  The mask sums to k to rounding (pair averages keep Σ v), but may leave [0, 1] by the residual. An item
  whose y = s - v is within the rounding of s (8 ulp of the row's largest |s|) of its w returns w exactly: past
  βx ~ 1 / ε of the dtype, s - v alone would round to 0 or 2 where the exact mask is 1.

- **Magnitude** (:func:`sparse_soft_topk_magnitude`, paper §3.3): a soft x ∘ mask(|x|) by the weighted
  isotonic problem on sorted |x| (blocks: a ratio of sums for p = 2, a depressed cubic for p = 4/3), its
  VJP block by block. A function, not an operator (it returns values, not a membership).
"""

from __future__ import annotations

import math
import numbers
import warnings

import numba
import numpy as np
import torch
from torch import Tensor

from diffrank.operators._vmap import fold_vmap
from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import (
    TOPK_MEMBERSHIP,
    RankingOperator,
    beta_repr,
    check_beta,
    check_int,
    check_k,
    check_scores_shape,
    refuse_double_backward,
)

SOLVERS = ("pav", "dykstra")
# |βx| above this is refused for p = 4/3: the block moments hold (βx)^3 summed over up to 1e6+ items
_MAX_Z_CUBIC = 1e75


def _check_p(p) -> float:
    """p as a float, 2 or 4/3 (within 1e-9; the string ``"4/3"`` is accepted too)."""
    if isinstance(p, str) and p.replace(" ", "") == "4/3":
        return 4.0 / 3.0
    try:
        pf = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"p must be 2 or 4/3, got {p!r}") from None
    if abs(pf - 2.0) < 1e-9:
        return 2.0
    if abs(pf - 4.0 / 3.0) < 1e-9:
        return 4.0 / 3.0
    raise ValueError(f"p must be 2 or 4/3 (the p-norm regularisers with closed-form PAV blocks), got {p!r}")


@numba.njit(cache=True, nogil=True)
def _cubic_root(cnt, m2, m3, w):  # pragma: no cover - compiled
    """Real root t of Σ_B (d_i - t)^3 = w with d centred (Σ d = 0, Σ d² = m2, Σ d³ = m3), i.e.
    t³ + P t + Q = 0 with P = 3 m2 / cnt >= 0, Q = (w - m3) / cnt (one real root, increasing cubic)."""
    P = 3.0 * m2 / cnt
    Q = (w - m3) / cnt
    r = max(math.sqrt(P), abs(Q) ** (1.0 / 3.0))
    if r == 0.0:
        return 0.0
    Pn, Qn = P / (r * r), Q / (r * r * r)  # |Pn|, |Qn| <= 1: nothing below overflows
    D = math.sqrt(Qn * Qn / 4.0 + Pn * Pn * Pn / 27.0)
    A = (abs(Qn) / 2.0 + D) ** (1.0 / 3.0)
    Bc = Pn / (3.0 * A)
    # A - Bc = |Q| / (A² + A Bc + Bc²): Cardano's root without subtracting nearly equal numbers
    t = -Qn / (A * A + Pn / 3.0 + Bc * Bc)
    for _ in range(2):
        f = t * t * t + Pn * t + Qn
        fp = 3.0 * t * t + Pn
        if fp > 0.0:
            t -= f / fp
    return t * r


@numba.njit(cache=True, nogil=True)
def _pav_topk(s, k, cubic, y, a, start):  # pragma: no cover - compiled
    """Decreasing PAV for the capped-simplex mask of every row of s (sorted descending), w = (1_k, 0).

    Writes y (the mask in sorted order), a (the VJP weights a_i, 0 on singleton blocks) and start (each
    position's block start)."""
    B, n = s.shape
    bst = np.empty(n, np.int64)
    cnt = np.empty(n, np.float64)
    mean = np.empty(n, np.float64)
    m2 = np.empty(n, np.float64)
    m3 = np.empty(n, np.float64)
    wsum = np.empty(n, np.float64)
    val = np.empty(n, np.float64)
    for b in range(B):
        top = -1
        for i in range(n):
            top += 1
            wi = 1.0 if i < k else 0.0
            bst[top] = i
            cnt[top] = 1.0
            mean[top] = s[b, i]
            m2[top] = 0.0
            m3[top] = 0.0
            wsum[top] = wi
            val[top] = s[b, i] - wi
            while top > 0 and val[top - 1] < val[top]:
                na, nb = cnt[top - 1], cnt[top]
                nt = na + nb
                d = mean[top] - mean[top - 1]
                # Chan et al.'s pairwise update of the centred moments (no Σ s³ - … cancellation)
                m3[top - 1] = (m3[top - 1] + m3[top] + d * d * d * na * nb * (na - nb) / (nt * nt)
                               + 3.0 * d * (na * m2[top] - nb * m2[top - 1]) / nt)
                m2[top - 1] = m2[top - 1] + m2[top] + d * d * na * nb / nt
                mean[top - 1] = mean[top - 1] + d * nb / nt
                cnt[top - 1] = nt
                wsum[top - 1] += wsum[top]
                top -= 1
                if cubic:
                    val[top] = mean[top] + _cubic_root(cnt[top], m2[top], m3[top], wsum[top])
                else:
                    val[top] = mean[top] - wsum[top] / cnt[top]
        for j in range(top + 1):
            lo = bst[j]
            hi = bst[j + 1] if j < top else n
            if hi - lo == 1:
                y[b, lo] = wsum[j]
                a[b, lo] = 0.0
                start[b, lo] = lo
                continue
            gam = val[j]
            for i in range(lo, hi):
                r = s[b, i] - gam
                if r < 0.0:
                    r = 0.0
                if cubic:
                    yi = r * r * r
                    a[b, i] = 3.0 * r * r
                else:
                    yi = r
                    a[b, i] = 1.0
                y[b, i] = min(yi, 1.0)
                start[b, i] = lo


@numba.njit(cache=True, nogil=True)
def _pav_topk_mag(z, k, cubic, lam, y, a, c, den, start):  # pragma: no cover - compiled
    """Decreasing PAV of the magnitude problem on every row of z = |x|/λ sorted descending, w = (1_k, 0):
    argmin_{u_1 >= … >= u_n} Σ (1/q)|z_i - u_i|^q + (λ/2) Σ w_i u_i² (Sander et al. 2023, §3.3, in z units).

    A block's u solves Σ_B (z_i - u)^{q-1} = λ W u (W = Σ_B w): u = Σ z / (|B| + λ W) for q = 2, the real root of
    |B| t³ + (3 M2 + λ W) t + (λ W mean - M3) = 0, u = mean + t, for q = 4. Writes the magnitude
    y = r^{q-1} + λ r (r = z - u ≥ 0), a_i = (q-1) r^{q-2}, c_i = a_i + λ (∂y/∂r), the block's Σ a + λ W and
    each position's block start."""
    B, n = z.shape
    bst = np.empty(n, np.int64)
    cnt = np.empty(n, np.float64)
    mean = np.empty(n, np.float64)
    m2 = np.empty(n, np.float64)
    m3 = np.empty(n, np.float64)
    wsum = np.empty(n, np.float64)
    val = np.empty(n, np.float64)
    for b in range(B):
        top = -1
        for i in range(n):
            top += 1
            wi = 1.0 if i < k else 0.0
            bst[top] = i
            cnt[top] = 1.0
            mean[top] = z[b, i]
            m2[top] = 0.0
            m3[top] = 0.0
            wsum[top] = wi
            if cubic:
                val[top] = z[b, i] + _depressed_root(lam * wi, lam * wi * z[b, i])
            else:
                val[top] = z[b, i] / (1.0 + lam * wi)
            while top > 0 and val[top - 1] < val[top]:
                na, nb = cnt[top - 1], cnt[top]
                nt = na + nb
                d = mean[top] - mean[top - 1]
                m3[top - 1] = (m3[top - 1] + m3[top] + d * d * d * na * nb * (na - nb) / (nt * nt)
                               + 3.0 * d * (na * m2[top] - nb * m2[top - 1]) / nt)
                m2[top - 1] = m2[top - 1] + m2[top] + d * d * na * nb / nt
                mean[top - 1] = mean[top - 1] + d * nb / nt
                cnt[top - 1] = nt
                wsum[top - 1] += wsum[top]
                top -= 1
                lw = lam * wsum[top]
                if cubic:
                    val[top] = mean[top] + _depressed_root((3.0 * m2[top] + lw) / cnt[top],
                                                           (lw * mean[top] - m3[top]) / cnt[top])
                else:
                    val[top] = mean[top] * cnt[top] / (cnt[top] + lw)
        for j in range(top + 1):
            lo = bst[j]
            hi = bst[j + 1] if j < top else n
            tot = 0.0
            for i in range(lo, hi):
                r = z[b, i] - val[j]
                if r < 0.0:
                    r = 0.0
                if cubic:
                    y[b, i] = r * r * r + lam * r
                    a[b, i] = 3.0 * r * r
                else:
                    y[b, i] = (1.0 + lam) * r
                    a[b, i] = 1.0
                c[b, i] = a[b, i] + lam
                tot += a[b, i]
                start[b, i] = lo
            for i in range(lo, hi):
                den[b, i] = tot + lam * wsum[j]


@numba.njit(cache=True, nogil=True)
def _depressed_root(P, Q):  # pragma: no cover - compiled
    """The real root of t³ + P t + Q = 0 for P >= 0 (see :func:`_cubic_root`)."""
    r = max(math.sqrt(P), abs(Q) ** (1.0 / 3.0))
    if r == 0.0:
        return 0.0
    Pn, Qn = P / (r * r), Q / (r * r * r)
    D = math.sqrt(Qn * Qn / 4.0 + Pn * Pn * Pn / 27.0)
    A = (abs(Qn) / 2.0 + D) ** (1.0 / 3.0)
    Bc = Pn / (3.0 * A)
    t = -Qn / (A * A + Pn / 3.0 + Bc * Bc)
    for _ in range(2):
        f = t * t * t + Pn * t + Qn
        fp = 3.0 * t * t + Pn
        if fp > 0.0:
            t -= f / fp
    return t * r


def _check_range(z: np.ndarray, cubic: bool) -> None:
    """Raise unless the float64 solve can hold βx: finite, and |βx| <= 1e75 for p = 4/3 (its blocks hold cubes).
    Inside the custom ops, where the values are on the host anyway (no read under vmap / compile)."""
    zmax = float(np.abs(z).max()) if z.size else 0.0
    if not math.isfinite(zmax) or (cubic and zmax > _MAX_Z_CUBIC):
        raise ValueError(f"beta * |scores| = {zmax:.3g} is out of the range the p = {4 / 3 if cubic else 2:.4g} solve "
                         f"holds (finite float64{', <= 1e75' if cubic else ''}); lower beta or rescale the scores")


def _check_range_device(z: Tensor, cubic: bool) -> None:
    """:func:`_check_range` on the device: one read of a flag (a host synchronisation, no data copied)."""
    if z.numel() == 0:
        return
    zmax = z.abs().amax()
    ok = torch.isfinite(zmax) & (zmax <= _MAX_Z_CUBIC) if cubic else torch.isfinite(zmax)
    if not bool(ok):
        _check_range(np.array([float(zmax)]), cubic)  # raises, with the message of the host check


def _pav_host(s: Tensor, k: int, cubic: bool, triton: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_pav_topk` on the sorted ``s`` ``(B, n)``: ``(y, a, start)`` on ``s``'s device (float64, float64,
    int64); with ``triton`` by :func:`diffrank.kernels.sparse_soft_topk.pav_topk` on the device, else on float64
    CPU copies. Under ``torch.compile`` it runs as the custom op :data:`_pav_op` (compile calls it instead of tracing
    into numba or Triton); eagerly it is called directly (the dispatch of a custom op costs ~0.1 ms)."""
    if triton:
        from diffrank.kernels.sparse_soft_topk import pav_topk

        s = s.detach().double()
        _check_range_device(s, cubic)
        return pav_topk(s, int(k), bool(cubic))
    sn = s.detach().to("cpu", torch.float64).contiguous().numpy()
    _check_range(sn, cubic)
    y, a = np.empty_like(sn), np.empty_like(sn)
    start = np.empty(sn.shape, np.int64)
    _pav_topk(sn, int(k), bool(cubic), y, a, start)
    dev = s.device
    return torch.from_numpy(y).to(dev), torch.from_numpy(a).to(dev), torch.from_numpy(start).to(dev)


_pav_op = torch.library.custom_op("diffrank::sparse_topk_pav", mutates_args=())(_pav_host)


@_pav_op.register_fake
def _(s: Tensor, k: int, cubic: bool, triton: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    f = torch.empty_like(s, dtype=torch.float64)
    return f, torch.empty_like(f), torch.empty_like(s, dtype=torch.int64)


def _block_vjp(gs: Tensor, a: Tensor, start: Tensor) -> Tensor:
    """The isotonic block VJP in sorted order (Sander et al. 2023, §4.3): a_i (g_i - Σ_B a g / Σ_B a) within each block
    B (``start``: each position's block start; 0 where Σ_B a = 0). Plain torch ops: differentiable in ``gs`` and
    ``a``, vmappable, traceable."""
    num = torch.zeros_like(gs).scatter_add(-1, start, a * gs)
    den = torch.zeros_like(gs).scatter_add(-1, start, a)
    ratio = (num / den.clamp_min(torch.finfo(den.dtype).tiny)).gather(-1, start)
    return a * (gs - ratio)


def _unsort(v: Tensor, perm: Tensor) -> Tensor:
    """``v`` in sorted order back to the items' order (out-of-place, differentiable)."""
    return torch.zeros_like(v).scatter(-1, perm, v)


class _PAVMask(torch.autograd.Function):
    """mask(z) for z = βx ``(B, n)`` by sort + PAV; backward by the block VJP. Returns float64 (and, for the backward,
    the sort permutation, the p = 2 weights and the block starts as non-differentiable outputs).

    The backward is written in torch ops on the output: for p = 4/3 its weights a_i = 3 r_i² = 3 y_i^{2/3} are a
    function of the mask y, so a recorded backward differentiates them through this Function again: second
    derivatives are exact (for p = 2, a is piecewise constant and the mask piecewise linear). ``vmap`` folds the
    mapped dimension into the batch (:func:`~diffrank.operators._vmap.fold_vmap`); the PAV is a custom op. With
    ``triton`` the PAV runs in the Triton kernel on z's device, else in numba on the host.
    """

    twice_differentiable = True  # read by diffrank.losses.newton

    @staticmethod
    def forward(z: Tensor, k: int, cubic: bool, triton: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        s, perm = torch.sort(z.double(), dim=-1, descending=True, stable=True)
        y, a, start = (_pav_op if torch.compiler.is_compiling() else _pav_host)(s, k, cubic, triton)
        return _unsort(y, perm), perm, a, start

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.cubic = inputs[2]
        ctx.save_for_backward(*output)

    @staticmethod
    def vmap(info, in_dims, z, k, cubic, triton):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return fold_vmap(info, in_dims, _PAVMask.apply, (z, k, cubic, triton))

    @staticmethod
    def backward(ctx, g: Tensor | None, *_):
        if g is None:
            return None, None, None, None
        mask, perm, a, start = ctx.saved_tensors
        if ctx.cubic and torch.is_grad_enabled():
            # recorded: a = 3 y^{2/3} on pooled blocks (a > 0 there), 0 on singletons, as a function of the mask (the
            # same values as the saved a), so that the double backward differentiates it
            ys = mask.gather(-1, perm)
            pos = a > 0
            a = torch.where(pos, 3 * torch.where(pos, ys, 1.0).pow(2.0 / 3.0), 0.0)
        return _unsort(_block_vjp(g.double().gather(-1, perm), a, start), perm), None, None, None


def _pair_project(v: Tensor, offset: int) -> Tensor:
    """Projection onto {v_i >= v_{i+1} for the pairs (offset, offset+1), (offset+2, offset+3), …}: a violating
    pair is replaced by its mean (the pairs are disjoint, so the projection is pairwise)."""
    n = v.shape[-1]
    m = (n - offset) // 2
    if m == 0:
        return v
    mid = v[:, offset: offset + 2 * m].reshape(v.shape[0], m, 2)
    avg = mid.mean(-1, keepdim=True)
    bad = (mid[..., :1] < mid[..., 1:])
    mid = torch.where(bad, avg.expand_as(mid), mid).reshape(v.shape[0], 2 * m)
    return torch.cat([v[:, :offset], mid, v[:, offset + 2 * m:]], dim=-1)


def isotonic_dykstra(u: Tensor, max_iter: int, tolerance: float, check_every: int = 10) -> tuple[Tensor, int, float]:
    """Approximate argmin_{v_1 >= … >= v_n} ½‖v - u‖² by Dykstra's algorithm on the two pair-constraint sets.

    Sander et al. 2023, §4.2 (Dykstra's projection algorithm, odd / even pairs). Batched over rows.

    Args:
        u: ``(B, n)`` floating targets.
        max_iter: iteration cap (each iteration projects onto both sets).
        tolerance: stop once an iterate moves less than this (max abs change, checked every ``check_every``).
        check_every: iterations between convergence checks (each is one host synchronisation).

    Returns:
        ``(v (B, n), iterations, last max change)``.
    """
    x = u
    p = torch.zeros_like(u)
    q = torch.zeros_like(u)
    it, change = 0, float("inf")
    while it < max_iter:
        prev = x
        y = _pair_project(x + p, 0)
        p = x + p - y
        x = _pair_project(y + q, 1)
        q = y + q - x
        it += 1
        if it % check_every == 0 or it == max_iter:
            change = float((x - prev).detach().abs().max()) if x.numel() else 0.0
            if change < tolerance:
                break
    return x, it, change


class _DykstraMask(torch.autograd.Function):
    """mask(z) for p = 2 by sort + Dykstra; backward by the block-mean VJP on the iterate's blocks (a piecewise
    constant Jacobian: a recorded backward differentiates to the exact 0 curvature). Extra outputs as
    :class:`_PAVMask`. A run that stops above the tolerance warns (here, where the iterations run on plain tensors:
    no side channel out of a ``vmap`` / ``grad``)."""

    twice_differentiable = True  # read by diffrank.losses.newton

    @staticmethod
    def forward(z: Tensor, k: int, max_iter: int, tolerance: float) -> tuple[Tensor, ...]:
        if not bool(torch.isfinite(z).all()):
            raise ValueError(f"beta * scores overflow {z.dtype} (out of range); lower beta or rescale the scores")
        s, perm = torch.sort(z, dim=-1, descending=True, stable=True)
        w = torch.zeros_like(s)
        w[:, :k] = 1.0
        v, it, change = isotonic_dykstra(s - w, max_iter, tolerance)
        if change >= tolerance and max_iter > 0:
            warnings.warn(f"sparse soft top-k (Dykstra): stopped after {it} iterations with change {change:.2e} >= "
                          f"tolerance {tolerance:g}; raise max_iter", RuntimeWarning, stacklevel=2)
        y = s - v
        # y = s - v carries the rounding of numbers of the size of s (~ulp(max |s|)). Where y is within that of its
        # w, the item is an exact 0 / 1, as in the exact solution: y = w. Without this, once ulp(|βx|) > 1 (βx beyond
        # 1 / ε of the dtype: 2^24 in float32), s - (s - 1) rounds to 0 or 2 and the mask no longer sums to k
        noise = 8 * torch.finfo(s.dtype).eps * s.abs().amax(-1, keepdim=True)
        y = torch.where((y - w).abs() <= noise, w, y)
        # neighbours closer than √tolerance share a block (the iterate's spread inside a block is ~20-100× as large
        # as the last change, more than the tolerance itself); a singleton (an exact 0 / 1 item) has no gradient
        same = (v[:, 1:] - v[:, :-1]).abs() <= tolerance ** 0.5
        new = torch.cat([torch.ones_like(v[:, :1], dtype=torch.bool), ~same], dim=-1)  # (B, 1) even for n = 1
        start = torch.where(new, torch.arange(s.shape[-1], device=s.device).expand_as(s), 0).cummax(-1).values
        size = torch.zeros_like(s).scatter_add_(-1, start, torch.ones_like(s)).gather(-1, start)
        a = (size > 1).to(s.dtype)
        return _unsort(y, perm), perm, a, start

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*output[1:])

    @staticmethod
    def vmap(info, in_dims, z, k, max_iter, tolerance):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return fold_vmap(info, in_dims, _DykstraMask.apply, (z, k, max_iter, tolerance))

    @staticmethod
    def backward(ctx, g: Tensor | None, *_):
        if g is None:
            return None, None, None, None
        perm, a, start = ctx.saved_tensors
        return _unsort(_block_vjp(g.gather(-1, perm), a, start), perm), None, None, None


def sparse_soft_topk_mask(x: Tensor, k: int, beta: float = 10.0, p: float = 4 / 3, solver: str = "pav",
                          max_iter: int = 500, tolerance: float = 1e-9, backend: str = "auto") -> Tensor:
    """The relaxed top-k mask argmax_{y ∈ C_k} ⟨x, y⟩ - (λ/p)‖y‖_p^p, λ = 1/β (Sander et al. 2023, Eq. (8)).

    Args:
        x: ``(B, n)`` float32 / float64 scores (finite; validated by the caller).
        k: integer in [1, n].
        beta: β = 1/λ > 0 (the paper's default λ = 0.1 is β = 10).
        p: 2 or 4/3.
        solver: ``"pav"`` (exact) or ``"dykstra"`` (p = 2 only; approximate, batched torch).
        max_iter, tolerance: Dykstra's iteration cap and stopping change (z = βx units).
        backend: where the PAV runs (:mod:`diffrank.operators.backend`): ``"auto"`` the Triton kernel on CUDA
            inputs (no host copy) and numba on the CPU, ``"torch"`` numba (CUDA inputs copied to the host and
            back), ``"triton"`` the Triton kernel (on the CPU under ``TRITON_INTERPRET=1``). Dykstra is PyTorch
            operations on the input's device either way.

    Returns:
        ``(B, n)`` mask in [0, 1] summing to k (float64 for PAV, x's dtype for Dykstra); exact zeros and ones
        outside the soft margin (PAV).

    Raises:
        ValueError: p not 2 or 4/3, Dykstra with p = 4/3, k outside [1, n], a float β not finite and > 0, or βx
            beyond the range the solve can hold (float64 overflow; |βx| > 1e75 for p = 4/3, whose blocks hold
            cubes); an unknown backend.
        TypeError: k not an integer.
        RuntimeError: ``backend="triton"`` on a CPU tensor without ``TRITON_INTERPRET=1``.
    """
    p = _check_p(p)
    check_backend(backend)
    k = check_k(k, x.shape[-1])
    if not isinstance(beta, Tensor):  # a tensor β is the operator's, checked at each of its calls
        beta = check_beta(beta)
    z = x * beta
    if solver == "dykstra":
        if p != 2.0:
            raise ValueError("solver='dykstra' solves the p = 2 problem only; use solver='pav' for p = 4/3")
        return _DykstraMask.apply(z, k, max_iter, tolerance)[0]
    return _PAVMask.apply(x.double() * beta, k, p != 2.0, use_triton(backend, x))[0]


def _pav_mag_host(zs: Tensor, k: int, cubic: bool, lam: float,
                  triton: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`_pav_topk_mag` on the sorted ``zs`` ``(B, n)``: ``(y, a, c, den, start)`` on its device (float64; start
    int64); with ``triton`` by :func:`diffrank.kernels.sparse_soft_topk.pav_topk_magnitude` on the device, else on a
    float64 CPU copy. A custom op under ``torch.compile`` (as :func:`_pav_host`)."""
    if triton:
        from diffrank.kernels.sparse_soft_topk import pav_topk_magnitude

        zs = zs.detach().double()
        _check_range_device(zs, cubic)
        return pav_topk_magnitude(zs, int(k), bool(cubic), float(lam))
    zn = zs.detach().to("cpu", torch.float64).contiguous().numpy()
    _check_range(zn, cubic)
    y, a, c, den = (np.empty_like(zn) for _ in range(4))
    start = np.empty(zn.shape, np.int64)
    _pav_topk_mag(zn, int(k), bool(cubic), float(lam), y, a, c, den, start)
    return tuple(torch.from_numpy(t).to(zs.device) for t in (y, a, c, den, start))


_pav_mag_op = torch.library.custom_op("diffrank::sparse_topk_pav_magnitude", mutates_args=())(_pav_mag_host)


@_pav_mag_op.register_fake
def _(zs: Tensor, k: int, cubic: bool, lam: float,
      triton: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    f = torch.empty_like(zs, dtype=torch.float64)
    return f, torch.empty_like(f), torch.empty_like(f), torch.empty_like(f), torch.empty_like(zs, dtype=torch.int64)


class _PAVMagnitude(torch.autograd.Function):
    """The magnitude y(z) for z = |x|/λ ``(B, n)`` by sort + PAV; backward block by block in torch ops:
    out_j = c_j g_j - (a_j / den_B) Σ_B c g, ∂u/∂z_j = a_j / (Σ_B a + λ W); a block with den = 0 (tied zeros) moves
    u with its common z (∂u/∂z_j = 1/|B|). For p = 2 the weights are constants (exact second derivatives, the
    magnitude is piecewise linear); for p = 4/3 they depend on z through the block's root, which the backward does
    not carry: its double backward raises :class:`~diffrank.operators.base.DoubleBackwardError`."""

    twice_differentiable = False  # p = 4/3 refuses (read by diffrank.losses.newton)

    @staticmethod
    def forward(z: Tensor, k: int, cubic: bool, lam: float, triton: bool) -> tuple[Tensor, ...]:
        zs, perm = torch.sort(z.double(), dim=-1, descending=True, stable=True)
        y, a, c, den, start = (_pav_mag_op if torch.compiler.is_compiling() else _pav_mag_host)(zs, k, cubic, lam,
                                                                                                 triton)
        return _unsort(y, perm), perm, a, c, den, start

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.cubic = inputs[2]
        ctx.save_for_backward(inputs[0], *output[1:])

    @staticmethod
    def vmap(info, in_dims, z, k, cubic, lam, triton):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return fold_vmap(info, in_dims, _PAVMagnitude.apply, (z, k, cubic, lam, triton))

    @staticmethod
    def backward(ctx, g: Tensor | None, *_):
        if g is None:
            return None, None, None, None, None
        z, perm, a, c, den, start = ctx.saved_tensors
        cg = c * g.double().gather(-1, perm)
        scg = torch.zeros_like(cg).scatter_add(-1, start, cg).gather(-1, start)
        size = torch.zeros_like(cg).scatter_add(-1, start, torch.ones_like(cg)).gather(-1, start)
        w = torch.where(den > 0, a / torch.where(den > 0, den, 1.0), 1.0 / size)
        gz = _unsort(cg - w * scg, perm)
        if ctx.cubic:
            # the weights depend on z but are saved as constants: tie gz to z (a zero term) so that differentiating it
            # reaches the refusal instead of returning a silent 0 curvature
            return refuse_double_backward((gz + 0 * z, None, None, None, None), "sparse_soft_topk_magnitude(p=4/3)",
                                          "p=2")
        return gz, None, None, None, None


def sparse_soft_topk_magnitude(x: Tensor, k: int, beta: float = 10.0, p: float = 4 / 3,
                               backend: str = "auto") -> Tensor:
    """The relaxed top-k in magnitude (Sander et al. 2023, §3.3): a soft x ∘ mask_k(|x|), exactly sparse.

    Sorted |x| = s, w = (1_k, 0), λ = 1/β: v = argmin_{v_1 ≥ … ≥ v_n} Σ (1/(q λ^{q-1}))|s_i - v_i|^q + ½ Σ w_i v_i²
    by PAV (blocks in closed form: a mean for p = 2, a depressed cubic for p = 4/3), and
    out = sign(x) · (((s - v)/λ)^{q-1} + (s - v)), un-permuted. The k largest |x| far from the rest keep x
    exactly, the others far below give an exact 0; as β → ∞ it is x ∘ hardmask_k(|x|). VJP block by block.

    Args:
        x: ``(B, n)`` float32 / float64 finite scores (any sign).
        k: integer in [1, n].
        beta: β = 1/λ > 0.
        p: 2 or 4/3.
        backend: where the PAV runs, as in :func:`sparse_soft_topk_mask`.

    Returns:
        ``(B, n)`` float64, the sign of x, |out| ≤ |x|.

    Raises:
        ValueError: p not 2 or 4/3, k outside [1, n], β not a finite number > 0 (or a tensor that requires grad: no
            ∂/∂β here), ``x`` not 2-D or on the meta device, β|x| beyond the range the solve holds, or an unknown
            backend.
        TypeError: ``x`` not a floating tensor, k not an integer.
        RuntimeError: ``backend="triton"`` on a CPU tensor without ``TRITON_INTERPRET=1``.
    """
    p = _check_p(p)
    check_backend(backend)
    n = check_scores_shape(x, "x")
    k = check_k(k, n)
    lam = 1.0 / check_beta(beta, owner="sparse_soft_topk_magnitude")  # a float: ∂/∂β is not given here
    z = x.double().abs() / lam
    # y = r^{q-1} + λ r with r = (s - v)/λ is already in score units; autograd chains |x|/λ and the sign
    return torch.sign(x.detach()).double() * _PAVMagnitude.apply(z, int(k), p != 2.0, lam, use_triton(backend, x))[0]


class SparseSoftTopK(RankingOperator):
    """Sparse soft top-k mask (Sander, Puigcerver, Djolonga, Peyré, Blondel; ICML 2023, §3-4); λ = 1/β.

    ``topk_membership(scores (B, n), ks)`` → ``(B, len(ks), n)``: for each k the mask
    argmax_{y ∈ C_k} ⟨x, y⟩ - (λ/p)‖y‖_p^p, in [0, 1], summing to k, exactly 0 / 1 outside a margin of
    width O(λ) around the k-th score (see the module docstring for the solvers and the VJP). Computed in
    float64 (PAV) or the compute dtype (Dykstra); cast back to the input dtype. On CUDA the PAV runs in a Triton
    kernel (``backend="auto"``): no method copies the scores to the host.

    Args:
        beta: β = 1/λ > 0; a 0-d tensor that requires grad is learnable (``learnable_beta``).
        p: 2 (projection onto the capped simplex) or 4/3 (the paper's default, C¹).
        solver: ``"pav"`` (exact; numba on the CPU, Triton on CUDA) or ``"dykstra"`` (p = 2; batched torch,
            approximate).
        max_iter: Dykstra's iteration cap (paper's code: 500).
        tolerance: Dykstra's stopping change in βx units; a run that stops above it warns.
        backend: where the PAV runs (``"auto"``, ``"torch"``, ``"triton"``; see :func:`sparse_soft_topk_mask`).

    Raises:
        ValueError: bad β, p, solver, backend, ``dykstra`` with p = 4/3, max_iter < 1 or tolerance <= 0; at call time,
            β·scores out of range (see :func:`sparse_soft_topk_mask`).
    """

    capabilities = frozenset({TOPK_MEMBERSHIP})
    permutation_equivariant = True
    learnable_beta = True  # z = βx enters the solve as a tensor: autograd gives ∂/∂β = Σ x ∂/∂z
    hard_beta = 4.0  # exact 0 / 1 once β × (gap around the k-th score) >= 1 (both p)
    low_memory = True  # no (B, m, n) buffer but for the permutation (diffrank.operators.memory)
    paper = "Sander, Puigcerver, Djolonga, Peyré, Blondel, ICML 2023, §3-4 (p = 4/3 or 2; exactly sparse)"
    parameter = "λ = 1/β (weight of the p-norm regulariser)"

    def __init__(self, beta: float | Tensor = 10.0, p: float = 4 / 3, solver: str = "pav", max_iter: int = 500,
                 tolerance: float = 1e-9, backend: str = "auto") -> None:
        super().__init__(beta)
        self.p = _check_p(p)
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if solver == "dykstra" and self.p != 2.0:
            raise ValueError("solver='dykstra' solves the p = 2 problem only; use solver='pav' for p = 4/3")
        max_iter = check_int(max_iter, "max_iter")
        if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not tolerance > 0:
            raise ValueError(f"tolerance must be a number > 0, got {tolerance!r}")
        self.solver, self.max_iter, self.tolerance = solver, max_iter, float(tolerance)
        self.backend = check_backend(backend)

    def _topk_membership(self, x: Tensor, ks: list[int]) -> Tensor:
        """``(B, len(ks), n)``: the mask for each k (one sort + one PAV / Dykstra run per k)."""
        return torch.stack([sparse_soft_topk_mask(x, k, self.beta, self.p, self.solver, self.max_iter,
                                                  self.tolerance, self.backend) for k in ks], dim=1)

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, p={self.p:.4g}, solver={self.solver!r}, backend={self.backend!r}"
