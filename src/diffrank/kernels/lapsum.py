"""Triton kernels for LapSum (Struski, Bednarczyk, Podolak, Tabor, ICML 2025): top-k, rank, sort, permutation.

Same quantities as the PyTorch path (:mod:`diffrank.operators.lapsum`), in the scaled coordinate
u = -β s of the scores sorted in descending order (u ascending; the sort is ``torch.sort``):

- Knot sums (paper §4.1): B_i = 1 + Σ_{j<i} e^{u_j - u_i} and A_i = 1 + Σ_{j>i} e^{u_i - u_j} are the
  linear recurrences B_i = 1 + e^{u_{i-1} - u_i} B_{i-1} and A_i = 1 + e^{u_i - u_{i+1}} A_{i+1}: one
  forward and one reverse ``tl.associative_scan`` over (multiplier, offset) pairs. Every multiplier is
  <= 1 (u ascending), so nothing overflows and no logarithm is needed (PyTorch: ``logcumsumexp``).
  Lap(u_i) = i + ½ + ½(A_i - B_i) (the knots) and the soft rank R = Lap + ½ (Thm 3.2) come out of the
  same pass.
- Inverse Lap⁻¹(w) (§4.1, eq. (4)): a binary search of w among the knots, then the closed-form root of
  the quadratic in e^u, written as in the PyTorch path (log space, one branch per side).
- Top-k membership (Thm 3.3): p = F(t + β s), F the standard Laplace CDF; its VJP (App. C.2) is two
  passes over the row: ⟨v, π⟩ with π = softmax(-|x|), then ∂/∂s = ½ β e^{-|x|} (v - ⟨v, π⟩).
- Rank VJP (App. C.2): g_l = ½ β [Σ_{j<l} e^{u_j-u_l} v_j + Σ_{j>l} e^{u_l-u_j} v_j - v_l (A_l + B_l - 2)],
  the same two recurrences with offsets e^{·} v (signed v is fine: no logarithm).
- Inverse VJP (soft sort / permutation backward; App. C.2): Σ_m v_m softmax_l(-|t_m - u_l|). Each t_m lies
  in a known gap u_{c-1} < t_m <= u_c, so its normaliser is O(1) from A_c and B_{c-1}; the targets' weights
  are summed per gap (an atomic add per target) and spread over the knots by the same two recurrences:
  O(n + M) per row, where the PyTorch path merges sorted thresholds and knots.

Sizes: every kernel walks its row in blocks of ``BLOCK`` (a scan block carries its prefix into the next),
so there is no limit on n; one program per sample (scans, top-k VJP), per (sample, block of targets)
(inverse) or per (sample, k) (top-k forward). Arithmetic in float32, or float64 for float64 scores.

Launch functions only (forward and backward of top-k, rank and inverse): the autograd Functions, their
recorded (double) backward and vmap rules are LapSum's own, in :mod:`diffrank.operators.lapsum`. On the CPU the
kernels run under ``TRITON_INTERPRET=1`` (tests); :class:`~diffrank.operators.lapsum.LapSum` uses them for CUDA
inputs with ``backend="auto"`` and always with ``backend="triton"``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from diffrank._shared import unsort
from diffrank.kernels._common import block_size

_KNOTS, _RANK_VJP, _INVERSE_VJP = 0, 1, 2


@triton.jit
def _affine(a1, b1, a2, b2):
    """Composition of x -> a1 x + b1, then x -> a2 x + b2 (associative, not commutative)."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _pick(x, at, BLOCK: tl.constexpr):
    """x[at] of a 1-D block as a 0-d tensor."""
    return tl.sum(tl.where(tl.arange(0, BLOCK) == at, x, 0.0), axis=0)


@triton.jit
def _lapsum_scan(s_ptr, beta_ptr, v_ptr, ab_ptr, below_ptr, above_ptr, out_ptr, n,
                 MODE: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row of descending scores ``s`` (B, n).

    MODE 0 (knots): below ← B, above ← A, out ← Lap(u_i) (knots). MODE 1 (rank VJP, v in sorted order,
    ab = A + B - 2): out ← g. MODE 2 (inverse VJP): v = L, ab = R, the (B, n + 1) per-gap sums of
    :func:`_lapsum_inverse_gaps`; out ← Σ_{c<=l} e^{u_c - u_l} L_c + Σ_{c>l} e^{u_l - u_{c-1}} R_c.
    ``below`` / ``above`` are (B, n) scratch rows in the compute dtype.
    """
    row = tl.program_id(0)
    DT = out_ptr.dtype.element_ty
    beta = tl.load(beta_ptr).to(DT)
    base = row * n
    carry = tl.sum(tl.zeros([BLOCK], DT), axis=0)
    # forward: below_i = Σ_{j<i} e^{u_j - u_i} v_j = a_i (below_{i-1} + v_{i-1}), a_i = e^{u_{i-1} - u_i}
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        has_prev = mask & (offs > 0)
        u = -beta * tl.load(s_ptr + base + offs, mask=mask, other=0.0).to(DT)
        u_prev = -beta * tl.load(s_ptr + base + offs - 1, mask=has_prev, other=0.0).to(DT)
        a = tl.where(has_prev, tl.exp(tl.where(has_prev, u_prev - u, 0.0)), 0.0)
        if MODE == 1:
            off = a * tl.load(v_ptr + base + offs - 1, mask=has_prev, other=0.0).to(DT)
        elif MODE == 2:
            off = tl.load(v_ptr + row * (n + 1) + offs, mask=mask, other=0.0)
        else:
            off = a
        prod, acc = tl.associative_scan((a, off), 0, _affine)
        below = prod * carry + acc
        tl.store(below_ptr + base + offs, below, mask=mask)
        carry = _pick(below, BLOCK - 1, BLOCK)
    # the reverse pass reads `below` back, possibly from other threads of this program
    tl.debug_barrier()
    carry = tl.sum(tl.zeros([BLOCK], DT), axis=0)
    nblocks = tl.cdiv(n, BLOCK)
    # reverse: above_i = Σ_{j>i} e^{u_i - u_j} v_j = a_i (above_{i+1} + v_{i+1}), a_i = e^{u_i - u_{i+1}};
    # padding past n gets a = 0, so it feeds nothing into the last real item
    for j in range(0, nblocks):
        offs = (nblocks - 1 - j) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        has_next = (offs + 1) < n
        u = -beta * tl.load(s_ptr + base + offs, mask=mask, other=0.0).to(DT)
        u_next = -beta * tl.load(s_ptr + base + offs + 1, mask=has_next, other=0.0).to(DT)
        a = tl.where(has_next, tl.exp(tl.where(has_next, u - u_next, 0.0)), 0.0)
        if MODE == 1:
            off = a * tl.load(v_ptr + base + offs + 1, mask=has_next, other=0.0).to(DT)
        elif MODE == 2:
            off = tl.load(ab_ptr + row * (n + 1) + offs + 1, mask=mask, other=0.0)
        else:
            off = a
        prod, acc = tl.associative_scan((a, off), 0, _affine, reverse=True)
        above = prod * carry + acc
        carry = _pick(above, 0, BLOCK)
        below = tl.load(below_ptr + base + offs, mask=mask, other=0.0)
        if MODE == 1:
            v = tl.load(v_ptr + base + offs, mask=mask, other=0.0).to(DT)
            ab = tl.load(ab_ptr + base + offs, mask=mask, other=0.0).to(DT)
            out = 0.5 * beta * (below + above - v * ab)
        elif MODE == 2:
            out = below + above
        else:
            out = offs.to(DT) + 0.5 + 0.5 * (above - below)
            tl.store(above_ptr + base + offs, 1.0 + above, mask=mask)
            tl.store(below_ptr + base + offs, 1.0 + below, mask=mask)
        tl.store(out_ptr + base + offs, out, mask=mask)


@triton.jit
def _lapsum_inverse(s_ptr, beta_ptr, a_ptr, b_ptr, knot_ptr, w_ptr, t_ptr, c_ptr, n, M, steps,
                    TBLOCK: tl.constexpr):
    """Program (row, block of targets): t = Lap⁻¹(w) in u-space, ``t`` (B, M), and its gap c = #knots < w
    (``c`` (B, M) int32); w >= n gives +inf."""
    row = tl.program_id(0)
    DT = t_ptr.dtype.element_ty
    beta = tl.load(beta_ptr).to(DT)
    base = row * n
    offs = tl.program_id(1) * TBLOCK + tl.arange(0, TBLOCK)
    mask = offs < M
    w = tl.load(w_ptr + row * M + offs, mask=mask, other=0.5).to(DT)
    # c = #knots < w (torch.searchsorted, left); `steps` = bit length of n halvings close every interval
    lo = tl.zeros([TBLOCK], tl.int32)
    hi = tl.zeros([TBLOCK], tl.int32) + n
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        kv = tl.load(knot_ptr + base + mid, mask=mask & active, other=0.0)
        right = kv < w
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (right == 0), mid, hi)
    c = lo
    e = w - c.to(DT)
    i_lo = tl.minimum(tl.maximum(c - 1, 0), n - 1)
    i_hi = tl.minimum(c, n - 1)
    u_lo = -beta * tl.load(s_ptr + base + i_lo, mask=mask, other=0.0).to(DT)
    u_hi = -beta * tl.load(s_ptr + base + i_hi, mask=mask, other=0.0).to(DT)
    lb_lo = tl.log(tl.load(b_ptr + base + i_lo, mask=mask, other=1.0))
    la_hi = tl.log(tl.load(a_ptr + base + i_hi, mask=mask, other=1.0))
    # log z, z = |e| + sqrt(e² + q), in log space (q underflows for knots far apart): z = √q (r + sqrt(r² + 1))
    half_log_q = 0.5 * (la_hi + lb_lo + (u_lo - u_hi))
    # e = 0 (integer targets): log|e| = -inf, so r = 0 and z = √q; written out to keep log(0) away
    nonzero = e != 0
    log_abs_e = tl.log(tl.where(nonzero, tl.abs(e), 1.0))
    log_r = tl.where(nonzero, log_abs_e - half_log_q, float("-inf"))
    r = tl.exp(tl.minimum(log_r, 20.0))
    # asinh(r); below 1e-4 the series r - r³/6 is exact to rounding and avoids log(1 + tiny)
    asinh_r = tl.where(r < 1e-4, r - r * r * r / 6.0, tl.log(r + tl.sqrt(r * r + 1.0)))
    log_z = tl.where(log_r > 20.0, 0.6931471805599453 + log_abs_e, half_log_q + asinh_r)
    # the two roots of the quadratic are algebraically equal; each branch avoids a cancellation
    t_mid = tl.where(e > 0, u_hi + log_z - la_hi, u_lo - log_z + lb_lo)
    u_first = -beta * tl.load(s_ptr + base).to(DT)
    u_last = -beta * tl.load(s_ptr + base + n - 1).to(DT)
    t_left = u_first + tl.log(2.0 * w) - tl.log(tl.load(a_ptr + base))
    t_right = u_last - tl.log(tl.maximum(2.0 * (n - w), 0.0)) + tl.log(tl.load(b_ptr + base + n - 1))
    t = tl.where(c == 0, t_left, tl.where(c == n, t_right, t_mid))
    tl.store(t_ptr + row * M + offs, t, mask=mask)
    tl.store(c_ptr + row * M + offs, c, mask=mask)


@triton.jit
def _lapsum_inverse_gaps(s_ptr, beta_ptr, a_ptr, b_ptr, t_ptr, c_ptr, v_ptr, l_ptr, r_ptr, n, M,
                         TBLOCK: tl.constexpr):
    """Program (row, block of targets) of the inverse VJP: each t_m lies in the gap c_m (u_{c-1} < t <= u_c).

    With q = v / N, N = Σ_l e^{-|t - u_l|} = e^{u_{c-1} - t} B_{c-1} + e^{t - u_c} A_c (O(1) per target),
    adds q e^{t - u_c} to L[c] and q e^{u_{c-1} - t} to R[c] (``l``, ``r``: (B, n + 1), zeroed), both factors
    scaled by the larger one; the scan of MODE 2 then spreads them over the knots. Every exponent is <= 0
    up to rounding.
    """
    row = tl.program_id(0)
    DT = t_ptr.dtype.element_ty
    beta = tl.load(beta_ptr).to(DT)
    base = row * n
    offs = tl.program_id(1) * TBLOCK + tl.arange(0, TBLOCK)
    mask = offs < M
    t = tl.load(t_ptr + row * M + offs, mask=mask, other=0.0)
    c = tl.load(c_ptr + row * M + offs, mask=mask, other=0)
    v = tl.load(v_ptr + row * M + offs, mask=mask, other=0.0).to(DT)
    has_lo = mask & (c > 0)
    has_hi = mask & (c < n)
    u_lo = -beta * tl.load(s_ptr + base + c - 1, mask=has_lo, other=0.0).to(DT)
    u_hi = -beta * tl.load(s_ptr + base + c, mask=has_hi, other=0.0).to(DT)
    # both weights relative to the larger one: mid-gap in a gap of width > 1400 (float64) both underflow
    d_lo = tl.where(has_lo, u_lo - t, float("-inf"))
    d_hi = tl.where(has_hi, t - u_hi, float("-inf"))
    top = tl.where(mask, tl.maximum(d_lo, d_hi), 0.0)
    e_lo = tl.exp(d_lo - top)
    e_hi = tl.exp(d_hi - top)
    norm = e_lo * tl.load(b_ptr + base + c - 1, mask=has_lo, other=0.0) \
        + e_hi * tl.load(a_ptr + base + c, mask=has_hi, other=0.0)
    q = v / tl.where(mask, norm, 1.0)
    tl.atomic_add(l_ptr + row * (n + 1) + c, q * e_hi, mask=has_hi)
    tl.atomic_add(r_ptr + row * (n + 1) + c, q * e_lo, mask=has_lo)


@triton.jit
def _lapsum_topk_fwd(s_ptr, beta_ptr, t_ptr, k_ptr, p_ptr, n, M, BLOCK: tl.constexpr):
    """Program per (row, target): p[row, m, :] = F(t + β s), or ones for k >= n (``s`` unsorted)."""
    pid = tl.program_id(0)
    DT = t_ptr.dtype.element_ty
    beta = tl.load(beta_ptr).to(DT)
    s_row = s_ptr + (pid // M) * n
    t = tl.load(t_ptr + pid)
    full = tl.load(k_ptr + pid).to(DT) >= n
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = t + beta * tl.load(s_row + offs, mask=mask, other=0.0).to(DT)
        e = tl.exp(-tl.abs(x))
        p = tl.where(full, 1.0, tl.where(x <= 0, 0.5 * e, 1.0 - 0.5 * e))
        tl.store(p_ptr + pid * n + offs, p.to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _lapsum_topk_bwd(s_ptr, beta_ptr, t_ptr, k_ptr, g_ptr, ds_ptr, dk_ptr, n, M, BLOCK: tl.constexpr):
    """Program per row: ds[row] = Σ_m ½ β e^{-|x|} (v - ⟨v, π⟩), dk[row, m] = ⟨v, π⟩ (no atomics)."""
    b = tl.program_id(0)
    DT = t_ptr.dtype.element_ty
    beta = tl.load(beta_ptr).to(DT)
    s_row = s_ptr + b * n
    for m in range(0, M):
        pid = b * M + m
        t = tl.load(t_ptr + pid)
        live = tl.where(tl.load(k_ptr + pid).to(DT) < n, 1.0, 0.0).to(DT)
        tot = tl.zeros([BLOCK], DT)
        dot = tl.zeros([BLOCK], DT)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            x = t + beta * tl.load(s_row + offs, mask=mask, other=0.0).to(DT)
            ex = tl.where(mask, tl.exp(-tl.abs(x)), 0.0) * live
            g = tl.load(g_ptr + pid * n + offs, mask=mask, other=0.0).to(DT)
            tot += ex
            dot += ex * g
        total = tl.sum(tot, axis=0)
        # a full row (k = n), or one whose e^{-|x|} all underflow, has no derivative (and 0/0 stays out)
        vpi = tl.where(total > 0, tl.sum(dot, axis=0) / tl.where(total > 0, total, 1.0), 0.0)
        tl.store(dk_ptr + pid, vpi)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            x = t + beta * tl.load(s_row + offs, mask=mask, other=0.0).to(DT)
            ex = tl.where(mask, tl.exp(-tl.abs(x)), 0.0) * live
            g = tl.load(g_ptr + pid * n + offs, mask=mask, other=0.0).to(DT)
            ds = tl.load(ds_ptr + b * n + offs, mask=mask, other=0.0)
            tl.store(ds_ptr + b * n + offs, ds + 0.5 * beta * ex * (g - vpi), mask=mask)


_MAX_BLOCK = 1024  # items per block of a row; longer rows loop over blocks (the tests lower it)


def _dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _beta(beta: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    # passed through memory: a Python float argument would reach the kernel rounded to float32
    return torch.tensor([beta], dtype=dtype, device=device)


def _knots(s_sorted: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(A, B, knots), each ``(B, n)``, of descending scores ``s_sorted``."""
    R, n = s_sorted.shape
    a, b, knots = (torch.empty(R, n, dtype=beta.dtype, device=s_sorted.device) for _ in range(3))
    _lapsum_scan[(R,)](s_sorted, beta, s_sorted, s_sorted, b, a, knots, n, MODE=_KNOTS, BLOCK=block_size(n, _MAX_BLOCK))
    return a, b, knots


def _tblock(M: int) -> int:
    return min(256, triton.next_power_of_2(max(M, 16)))


def _inverse(s_sorted: Tensor, beta: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """t = Lap⁻¹(w) in u-space for descending ``s_sorted`` (B, n) and targets ``w`` (B, M); also the gaps
    c (B, M) and the knot sums A, B (B, n) that the VJP reuses."""
    R, n = s_sorted.shape
    M = w.shape[-1]
    a, b, knots = _knots(s_sorted, beta)
    t = torch.empty(R, M, dtype=beta.dtype, device=s_sorted.device)
    c = torch.empty(R, M, dtype=torch.int32, device=s_sorted.device)
    tb = _tblock(M)
    _lapsum_inverse[(R, triton.cdiv(M, tb))](s_sorted, beta, a, b, knots, w.to(beta.dtype).contiguous(), t, c, n, M,
                                            int(n).bit_length(), TBLOCK=tb)
    return t, c, a, b


def _inverse_vjp(s_sorted: Tensor, beta: Tensor, t: Tensor, c: Tensor, a: Tensor, b: Tensor, v: Tensor) -> Tensor:
    """Σ_m v_m ∂t_m/∂u_l, ∂t_m/∂u_l = softmax_l(-|t_m - u_l|) (paper App. C.2): (B, n), sorted order."""
    R, n = s_sorted.shape
    M = t.shape[-1]
    gaps = torch.zeros(2, R, n + 1, dtype=beta.dtype, device=t.device)
    tb = _tblock(M)
    _lapsum_inverse_gaps[(R, triton.cdiv(M, tb))](s_sorted, beta, a, b, t, c, v.contiguous(), gaps[0], gaps[1], n, M,
                                                 TBLOCK=tb)
    scratch = torch.empty(2, R, n, dtype=beta.dtype, device=t.device)
    g = torch.empty(R, n, dtype=beta.dtype, device=t.device)
    _lapsum_scan[(R,)](s_sorted, beta, gaps[0], gaps[1], scratch[0], scratch[1], g, n, MODE=_INVERSE_VJP,
                       BLOCK=block_size(n, _MAX_BLOCK))
    return g


def topk_forward(scores: Tensor, k: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """LapSum top-k memberships p[b, m, i] = F(t_bm + β s_bi), t = Lap⁻¹(k_bm) in u-space (Struski et al. 2025,
    Thm 3.3, eq. (3)), forward launch only (the autograd Function is
    :class:`~diffrank.operators.lapsum._LapSumTopK`).

    Args:
        scores: ``(B, n)`` float32 / float64 on CUDA (or the CPU under ``TRITON_INTERPRET=1``), finite.
        k: ``(B, M)`` real targets in (0, n]; k >= n gives ones.
        beta: inverse temperature β > 0.

    Returns:
        ``(p, t)``: p ``(B, M, n)`` of the scores' dtype (row m sums to k_m), t ``(B, M)`` in the compute dtype.

    Raises:
        Nothing of its own: the caller validates the inputs.
    """
    s = scores.contiguous()
    R, n = s.shape
    dt = _dtype(s)
    bt = _beta(beta, dt, s.device)
    kk = k.to(dt).contiguous()
    t = _inverse(s.sort(dim=-1, descending=True).values, bt, torch.where(kk >= n, n / 2, kk))[0]
    M = kk.shape[-1]
    p = torch.empty(R, M, n, dtype=scores.dtype, device=s.device)
    _lapsum_topk_fwd[(R * M,)](s, bt, t, kk, p, n, M, BLOCK=block_size(n, _MAX_BLOCK))
    return p, t


def topk_backward(scores: Tensor, k: Tensor, t: Tensor, beta: float, grad_p: Tensor) -> tuple[Tensor, Tensor]:
    """VJP of :func:`topk_forward` in one kernel (App. C.2): ∂L/∂s = Σ_m ½ β e^{-|x|} (v - ⟨v, π⟩), ∂L/∂k = ⟨v, π⟩.

    Args:
        scores: ``(B, n)``; k: ``(B, M)``; t: ``(B, M)`` the forward's thresholds; beta: β;
        grad_p: ``(B, M, n)`` upstream gradient.

    Returns:
        ``(grad_s (B, n) of the scores' dtype, grad_k (B, M) in the compute dtype)``.

    Raises:
        Nothing of its own.
    """
    s = scores.contiguous()
    R, n = s.shape
    bt = _beta(beta, _dtype(s), s.device)
    kk = k.to(bt.dtype).contiguous()
    M = kk.shape[-1]
    ds = torch.zeros(R, n, dtype=bt.dtype, device=s.device)
    dk = torch.empty(R, M, dtype=bt.dtype, device=s.device)
    _lapsum_topk_bwd[(R,)](s, bt, t, kk, grad_p.contiguous(), ds, dk, n, M, BLOCK=block_size(n, _MAX_BLOCK))
    return ds.to(s.dtype), dk


def rank_forward(scores: Tensor, beta: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """LapSum soft ranks R_i = Lap_s(s_i) + ½ = 1 + Σ_{j≠i} F(β(s_j - s_i)) (Struski et al. 2025, Thm 3.2) from the
    knot scan, forward launch only (the autograd Function is :class:`~diffrank.operators.lapsum._LapSumRank`).

    Args:
        scores: ``(B, n)`` float32 / float64, finite (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        beta: inverse temperature β > 0.

    Returns:
        ``(R, s_sorted, order, A + B - 2)``: R ``(B, n)`` of the scores' dtype; the descending scores, their sort
        permutation and the knot sums, which :func:`rank_backward` reads.

    Raises:
        Nothing of its own: the caller validates the inputs.
    """
    s_sorted, order = scores.sort(dim=-1, descending=True)
    s_sorted = s_sorted.contiguous()
    a, b, knots = _knots(s_sorted, _beta(beta, _dtype(scores), scores.device))
    return unsort((knots + 0.5).to(scores.dtype), order), s_sorted, order, a + b - 2


def rank_backward(s_sorted: Tensor, order: Tensor, ab: Tensor, beta: float, grad_r: Tensor) -> Tensor:
    """VJP of :func:`rank_forward` from the same scans (App. C.2).

    Args:
        s_sorted, order, ab: the auxiliary outputs of :func:`rank_forward`; beta: β; grad_r: ``(B, n)`` upstream.

    Returns:
        ``(B, n)`` gradient with respect to the scores, of the dtype of ``s_sorted``.

    Raises:
        Nothing of its own.
    """
    R, n = s_sorted.shape
    bt = _beta(beta, ab.dtype, s_sorted.device)
    v = grad_r.gather(-1, order).to(bt.dtype).contiguous()
    scratch = torch.empty(2, R, n, dtype=bt.dtype, device=v.device)
    g = torch.empty(R, n, dtype=bt.dtype, device=v.device)
    _lapsum_scan[(R,)](s_sorted, bt, v, ab, scratch[0], scratch[1], g, n, MODE=_RANK_VJP,
                       BLOCK=block_size(n, _MAX_BLOCK))
    return unsort(g, order).to(s_sorted.dtype)


def inverse_forward(scores: Tensor, w: Tensor, beta: float) -> tuple[Tensor, ...]:
    """b = Lap_s⁻¹(w) in score units, α = -1/β (Struski et al. 2025, §4.1 eq. (4)), forward launch only (the
    autograd Function is :class:`~diffrank.operators.lapsum._LapSumInverse`).

    Args:
        scores: ``(B, n)`` float32 / float64, finite (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        w: ``(B, M)`` targets in (0, n) (w >= n gives -inf).
        beta: inverse temperature β > 0.

    Returns:
        ``(b, s_sorted, order, t, c, A, B)``: b ``(B, M)`` of the scores' dtype, then what
        :func:`inverse_backward` reads (sorted scores, permutation, u-space thresholds, gaps, knot sums).

    Raises:
        Nothing of its own: the caller validates the inputs.
    """
    s_sorted, order = scores.sort(dim=-1, descending=True)
    s_sorted = s_sorted.contiguous()
    t, c, a, b = _inverse(s_sorted, _beta(beta, _dtype(scores), scores.device), w)
    return (-t / beta).to(scores.dtype), s_sorted, order, t, c, a, b


def inverse_backward(s_sorted: Tensor, order: Tensor, t: Tensor, c: Tensor, a: Tensor, b: Tensor, beta: float,
                     grad_b: Tensor) -> Tensor:
    """VJP of :func:`inverse_forward`, ∂b_m/∂s_l = softmax_l(-β|b_m - s_l|), by per-gap sums and two scans
    (O(n + M) per row; App. C.2).

    Args:
        s_sorted, order, t, c, a, b: the auxiliary outputs of :func:`inverse_forward`; beta: β;
        grad_b: ``(B, M)`` upstream.

    Returns:
        ``(B, n)`` gradient with respect to the scores, of the dtype of ``s_sorted``.

    Raises:
        Nothing of its own.
    """
    bt = _beta(beta, t.dtype, t.device)
    grad_sorted = _inverse_vjp(s_sorted, bt, t, c, a, b, grad_b.to(t.dtype))  # ∂b/∂s = ∂t/∂u
    return unsort(grad_sorted, order).to(s_sorted.dtype)

