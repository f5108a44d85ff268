"""Triton kernels for the exact PAV of sparse soft top-k (Sander, Puigcerver, Djolonga, Peyré, Blondel; ICML 2023,
§3-4): the top-k mask (§4.2, Prop. 4 and 5) and the top-k in magnitude (§3.3), p = 2 and p = 4/3, one program per
row, on the device.

The same computation, in the same float64 operations, as the CPU kernels
(:func:`diffrank.operators.sparse_soft_topk._pav_topk`, :func:`~diffrank.operators.sparse_soft_topk._pav_topk_mag`,
whose docstrings state the maths): a decreasing PAV over the sorted row with w = (1_k, 0), each block kept as its
count, mean and (p = 4/3) centred second and third moments, merged by Chan et al.'s pairwise update; a block's
value is the block mean of s - w (p = 2, mask), the real root of a depressed cubic by Cardano's cancellation-free
form polished by two Newton steps (p = 4/3), or the magnitude problem's counterparts. Adjacent blocks pool while
the earlier value is strictly below the later one (the CPU kernels' convention). The cube root is
exp(log(x) / 3) (Triton has no ``pow``), a few ulp from the CPU's; the Newton steps polish the root to its rounding.

The block stack lives in global scratch buffers (Triton has no indexable per-program memory): a scalar store is
made by one thread, and a barrier after each push makes the stack the same for every thread before it is read
again (as in :mod:`diffrank.kernels.fast_soft_sort`). The kernels are one sequential chain per row: one warp.
The VJPs stay the PyTorch block operations of :mod:`diffrank.operators.sparse_soft_topk` (already on the device).

Memory: scratch of 6 float64 (4 for p = 2) and one int32 (B, n) buffers. On the CPU the kernels run under
``TRITON_INTERPRET=1`` (tests); :class:`~diffrank.operators.sparse_soft_topk.SparseSoftTopK` runs them for CUDA
inputs with ``backend="auto"`` and always with ``backend="triton"``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: one warp per row: the PAV is one sequential chain
NUM_WARPS = 1


@triton.jit
def _cbrt(x):
    """x^(1/3) for x >= 0."""
    return tl.where(x > 0, tl.exp(tl.log(tl.where(x > 0, x, 1.0)) / 3.0), 0.0)


@triton.jit
def _depressed_root(P, Q):
    """The real root of t³ + P t + Q = 0 for P >= 0 (the CPU kernels' ``_depressed_root``, same operations)."""
    r = tl.maximum(tl.sqrt(P), _cbrt(tl.abs(Q)))
    zero = r == 0.0
    rs = tl.where(zero, 1.0, r)
    Pn = P / (rs * rs)  # |Pn|, |Qn| <= 1: nothing below overflows
    Qn = Q / (rs * rs * rs)
    D = tl.sqrt(Qn * Qn / 4.0 + Pn * Pn * Pn / 27.0)
    A = _cbrt(tl.abs(Qn) / 2.0 + D)
    A = tl.where(zero, 1.0, A)  # A > 0 whenever r > 0 (|Pn| = 1 or |Qn| = 1)
    Bc = Pn / (3.0 * A)
    # A - Bc = |Q| / (A² + A Bc + Bc²): Cardano's root without subtracting nearly equal numbers
    t = -Qn / (A * A + Pn / 3.0 + Bc * Bc)
    for _ in tl.static_range(2):
        f = t * t * t + Pn * t + Qn
        fp = 3.0 * t * t + Pn
        t = tl.where(fp > 0.0, t - f / tl.where(fp > 0.0, fp, 1.0), t)
    return tl.where(zero, 0.0, t * r)


@triton.jit
def _block_value(mean, cnt, m2, m3, wsum, lam, CUBIC: tl.constexpr, MAG: tl.constexpr):
    """The value of a pooled block from its moments (the CPU kernels' formulas)."""
    if MAG:
        lw = lam * wsum
        if CUBIC:
            val = mean + _depressed_root((3.0 * m2 + lw) / cnt, (lw * mean - m3) / cnt)
        else:
            val = mean * cnt / (cnt + lw)
    else:
        if CUBIC:
            val = mean + _depressed_root(3.0 * m2 / cnt, (wsum - m3) / cnt)
        else:
            val = mean - wsum / cnt
    return val


@triton.jit
def _sparse_pav(s_ptr, y_ptr, a_ptr, c_ptr, den_ptr, start_ptr, bst_ptr, cnt_ptr, mean_ptr, m2_ptr, m3_ptr, wsum_ptr,
                val_ptr, lam_ptr, n, k, CUBIC: tl.constexpr, MAG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    roff = row * n
    s_row = s_ptr + roff
    bst = bst_ptr + row * (n + 1)
    cnt = cnt_ptr + roff
    mean = mean_ptr + roff
    m2 = m2_ptr + roff
    m3 = m3_ptr + roff
    wsum = wsum_ptr + roff
    val = val_ptr + roff
    lam = tl.load(lam_ptr)
    nb = tl.full((), 0, tl.int32)  # the stack's height
    for i in range(0, n):
        # the new singleton block [i]
        si = tl.load(s_row + i)
        c_w = tl.where(i < k, 1.0, 0.0).to(tl.float64)
        c_cnt = c_w * 0.0 + 1.0
        c_mean = si
        c_m2 = si * 0.0
        c_m3 = si * 0.0
        if MAG:
            if CUBIC:
                c_val = si + _depressed_root(lam * c_w, lam * c_w * si)
            else:
                c_val = si / (1.0 + lam * c_w)
        else:
            c_val = si - c_w
        st = i
        go = nb > 0
        while go:
            # pool the previous block (p, the earlier one) into this one while its value is below this one's
            p = nb - 1
            viol = tl.load(val + p) < c_val
            na = tl.load(cnt + p)
            nt = na + c_cnt
            pm = tl.load(mean + p)
            d = c_mean - pm
            if CUBIC:
                # Chan et al.'s pairwise update of the centred moments (no Σ s³ - … cancellation)
                pm2 = tl.load(m2 + p)
                nm3 = (tl.load(m3 + p) + c_m3 + d * d * d * na * c_cnt * (na - c_cnt) / (nt * nt)
                       + 3.0 * d * (na * c_m2 - c_cnt * pm2) / nt)
                nm2 = pm2 + c_m2 + d * d * na * c_cnt / nt
            else:
                nm3 = c_m3
                nm2 = c_m2
            nmean = pm + d * c_cnt / nt
            nw = tl.load(wsum + p) + c_w
            nval = _block_value(nmean, nt, nm2, nm3, nw, lam, CUBIC, MAG)
            c_m3 = tl.where(viol, nm3, c_m3)
            c_m2 = tl.where(viol, nm2, c_m2)
            c_mean = tl.where(viol, nmean, c_mean)
            c_cnt = tl.where(viol, nt, c_cnt)
            c_w = tl.where(viol, nw, c_w)
            c_val = tl.where(viol, nval, c_val)
            st = tl.where(viol, tl.load(bst + p), st)
            nb = tl.where(viol, p, nb)
            go = viol & (nb > 0)
        tl.store(bst + nb, st)
        tl.store(cnt + nb, c_cnt)
        tl.store(mean + nb, c_mean)
        if CUBIC:
            tl.store(m2 + nb, c_m2)
            tl.store(m3 + nb, c_m3)
        tl.store(wsum + nb, c_w)
        tl.store(val + nb, c_val)
        nb += 1
        tl.debug_barrier()  # the new top is read by every thread in the next step
    tl.store(bst + nb, n)
    tl.debug_barrier()
    for j in range(0, nb):
        lo = tl.load(bst + j)
        hi = tl.load(bst + j + 1)
        v = tl.load(val + j)
        wj = tl.load(wsum + j)
        if MAG:
            tot = v * 0.0
            for i in range(lo, hi):
                r = tl.maximum(tl.load(s_row + i) - v, 0.0)
                if CUBIC:
                    yi = r * r * r + lam * r
                    ai = 3.0 * r * r
                else:
                    yi = (1.0 + lam) * r
                    ai = r * 0.0 + 1.0
                tl.store(y_ptr + roff + i, yi)
                tl.store(a_ptr + roff + i, ai)
                tl.store(c_ptr + roff + i, ai + lam)
                tl.store(start_ptr + roff + i, lo.to(tl.int64))
                tot += ai
            for i in range(lo, hi):
                tl.store(den_ptr + roff + i, tot + lam * wj)
        else:
            single = hi - lo == 1  # a singleton returns its w (0 or 1) exactly and passes no gradient
            for i in range(lo, hi):
                r = tl.maximum(tl.load(s_row + i) - v, 0.0)
                if CUBIC:
                    yi = r * r * r
                    ai = 3.0 * r * r
                else:
                    yi = r
                    ai = r * 0.0 + 1.0
                tl.store(y_ptr + roff + i, tl.where(single, wj, tl.minimum(yi, 1.0)))
                tl.store(a_ptr + roff + i, tl.where(single, 0.0, ai))
                tl.store(start_ptr + roff + i, lo.to(tl.int64))


def _run(s: Tensor, k: int, cubic: bool, lam: float | None) -> tuple[Tensor, ...]:
    """Launch :func:`_sparse_pav` on float64 ``s`` (B, n); the magnitude problem when ``lam`` is given."""
    if s.dim() != 2 or s.dtype != torch.float64:
        raise ValueError(f"s must be (B, n) float64, got {tuple(s.shape)} {s.dtype}")
    B, n = s.shape
    if not 1 <= int(k) <= max(n, 1):
        raise ValueError(f"k must satisfy 1 <= k <= n = {n}, got {k}")
    mag = lam is not None
    outs = [torch.empty_like(s) for _ in range(4 if mag else 2)] + [torch.empty_like(s, dtype=torch.int64)]
    if B == 0 or n == 0:
        return tuple(outs)
    s = s.contiguous()
    scratch = torch.empty(6 if cubic else 4, B, n, dtype=torch.float64, device=s.device)
    stats = (scratch[0], scratch[1], scratch[4] if cubic else s, scratch[5] if cubic else s, scratch[2], scratch[3])
    bst = torch.empty(B, n + 1, dtype=torch.int32, device=s.device)
    lam_t = torch.full((1,), 0.0 if lam is None else float(lam), dtype=torch.float64, device=s.device)
    y, a = outs[0], outs[1]
    c, den = (outs[2], outs[3]) if mag else (y, y)  # the mask writes neither
    _sparse_pav[(B,)](s, y, a, c, den, outs[-1], bst, *stats, lam_t, n, int(k), CUBIC=bool(cubic), MAG=mag,
                      num_warps=NUM_WARPS)
    return tuple(outs)


def pav_topk(s: Tensor, k: int, cubic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The capped-simplex top-k mask of every row by PAV (Sander et al. 2023, §4.2, Prop. 4 and 5; the CPU kernel
    :func:`diffrank.operators.sparse_soft_topk._pav_topk`).

    Args:
        s: ``(B, n)`` float64, z = βx sorted descending along each row, on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``); finite (the caller checks the range).
        k: the number of ones of w = (1_k, 0), in [1, n].
        cubic: p = 4/3 (the depressed cubic's blocks) instead of p = 2.

    Returns:
        ``(y, a, start)``: the mask in sorted order (float64, in [0, 1], summing to k), the VJP weights a_i
        (float64; 0 on singleton blocks) and each position's block start (int64), all ``(B, n)``.

    Raises:
        ValueError: ``s`` not (B, n) float64, or k outside [1, n].
    """
    return _run(s, k, cubic, None)


def pav_topk_magnitude(zs: Tensor, k: int, cubic: bool, lam: float) -> tuple[Tensor, ...]:
    """The top-k in magnitude by PAV on z = |x|/λ sorted descending (Sander et al. 2023, §3.3; the CPU kernel
    :func:`diffrank.operators.sparse_soft_topk._pav_topk_mag`, same outputs).

    Args:
        zs: ``(B, n)`` float64 sorted descending, >= 0, on a CUDA device (or the CPU under ``TRITON_INTERPRET=1``).
        k: the number of ones of w, in [1, n].
        cubic: p = 4/3 instead of p = 2.
        lam: λ = 1/β > 0.

    Returns:
        ``(y, a, c, den, start)``, each ``(B, n)``: the magnitude y = r^{q-1} + λ r, a_i = (q-1) r^{q-2},
        c_i = a_i + λ, the block's Σ a + λ W (float64) and each position's block start (int64).

    Raises:
        ValueError: ``zs`` not (B, n) float64, or k outside [1, n].
    """
    return _run(zs, k, cubic, float(lam))
