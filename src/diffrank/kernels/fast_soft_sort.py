"""Triton kernels for fast soft sort / rank (Blondel, Teboul, Berthet, Djolonga, ICML 2020, §3-§5, Prop. 3):
the projection onto the permutahedron by pool adjacent violators (PAV) and its vector-Jacobian product, on the
device, one program per row.

The same computation as the CPU kernels (:mod:`diffrank.operators.fast_soft_sort_cpu`, whose docstring states the
maths and the conventions at kinks and ties): with σ sorting scale·z descending, s = scale·z_σ and w sorted
descending, v = argmin_{v_1 >= ... >= v_n} ½‖v - (s - w)‖² (l2, block value mean(s_B) - mean(w_B)) or
⟨e^{s - v}, 1⟩ + ⟨e^w, v⟩ (kl, block value LSE(s_B) - LSE(w_B)), μ = s - v written back in z's order; adjacent
blocks with equal values pool, and the Jacobian's blocks are the runs of PAV blocks whose values differ by at most
:data:`~diffrank._shared.PAV_TOL`. Both kernels accumulate in float64 whatever the input dtype, as
the CPU kernels do: the pooling decisions and the 1e-9 partition tolerance are then the CPU path's (a float32
accumulator would pool differently near kinks, and 1e-9 is below its resolution).

Forward (:func:`project_fwd`), per row: one vectorised pass gathers s and the sorted w into a float64 scratch row;
then the sequential PAV keeps its block stack (start, two accumulators) in a global scratch buffer, since Triton
has no indexable per-program memory. The scalar code runs in every thread of the program, and a scalar store is
made by one thread: a barrier after each push makes the stack the same for all threads before they read it again
(without it, another warp could read a stale entry and follow other branches). The kernels are latency bound (one
dependent chain per row), so the program is one warp. Backward (:func:`project_bwd`): per Jacobian block, with
T = Σ g over the block, gz_i = scale·(g_i - p_i T), gw_i = q_i T (p = q = 1/|B| for l2, softmax(s_B) and softmax(w_B)
for kl); it reads only its inputs, so it needs no scratch.

Memory: the forward's scratch is 4 float64 and one int32 (B, n) buffers. On the CPU the kernels run under
``TRITON_INTERPRET=1`` (tests); :class:`~diffrank.operators.fast_soft_sort.FastSoftSort` runs them for CUDA inputs
with ``backend="auto"`` and always with ``backend="triton"``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from diffrank._shared import PAV_TOL
from diffrank.kernels._common import block_size

#: the partition tolerance of the Jacobian's blocks (the CPU kernels' TOL, the authors' ``_partition``)
_TOL: tl.constexpr = tl.constexpr(PAV_TOL)
#: one warp per row: the PAV is one sequential chain; wider programs would only wait on it
NUM_WARPS = 1


def gather_block(n: int) -> int:
    """The BLOCK of the forward's vectorised gather pass for rows of ``n`` items (one warp: at most 256)."""
    return block_size(n, 256)


@triton.jit
def _logaddexp(a, b):
    hi = tl.maximum(a, b)
    return hi + tl.log(tl.exp(a - hi) + tl.exp(b - hi))


@triton.jit
def _fss_fwd(z_ptr, order_ptr, w_ptr, worder_ptr, scale_ptr, mu_ptr, bid_ptr, s_ptr, ws_ptr, acc1_ptr, acc2_ptr,
             start_ptr, n, z_stride, w_stride, KL: tl.constexpr, WREV: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    zoff = row * z_stride  # 0 for a row shared by the batch
    woff = row * w_stride
    roff = row * n
    scale = tl.load(scale_ptr)
    # s = scale·z[order] and the sorted w, in float64 (worder read from the end for an ascending order: WREV)
    for first in range(0, n, BLOCK):
        offs = first + tl.arange(0, BLOCK)
        mask = offs < n
        o = tl.load(order_ptr + zoff + offs, mask=mask, other=0)
        s = tl.load(z_ptr + zoff + o, mask=mask, other=0.0).to(tl.float64) * scale
        if WREV:
            wo = tl.load(worder_ptr + woff + (n - 1 - offs), mask=mask, other=0)
        else:
            wo = tl.load(worder_ptr + woff + offs, mask=mask, other=0)
        tl.store(s_ptr + roff + offs, s, mask=mask)
        tl.store(ws_ptr + roff + offs, tl.load(w_ptr + woff + wo, mask=mask, other=0.0).to(tl.float64), mask=mask)
    tl.debug_barrier()  # the gathered rows, written by every thread, are read by all below
    s_row = s_ptr + roff
    ws_row = ws_ptr + roff
    acc1 = acc1_ptr + roff  # l2: Σ (s - w) of the block; kl: LSE(s_B)
    acc2 = acc2_ptr + roff  # l2: |B|; kl: LSE(w_B)
    start = start_ptr + row * (n + 1)
    nb = tl.full((), 0, tl.int32)  # the stack's height (n may be the constant 1: no n * 0)
    for i in range(0, n):
        si = tl.load(s_row + i)
        wi = tl.load(ws_row + i)
        if KL:
            a1 = si
            a2 = wi
        else:
            a1 = si - wi
            a2 = si * 0 + 1.0
        st = i
        go = nb > 0
        while go:
            p = nb - 1
            c1 = tl.load(acc1 + p)
            c2 = tl.load(acc2 + p)
            # pool while the previous block's value is <= this one's: equal values pool too (the convention)
            if KL:
                viol = c1 - c2 <= a1 - a2
                m1 = _logaddexp(c1, a1)
                m2 = _logaddexp(c2, a2)
            else:
                viol = c1 * a2 <= a1 * c2
                m1 = c1 + a1
                m2 = c2 + a2
            a1 = tl.where(viol, m1, a1)
            a2 = tl.where(viol, m2, a2)
            st = tl.where(viol, tl.load(start + p), st)
            nb = tl.where(viol, p, nb)
            go = viol & (nb > 0)
        tl.store(start + nb, st)
        tl.store(acc1 + nb, a1)
        tl.store(acc2 + nb, a2)
        nb += 1
        tl.debug_barrier()  # the new top is read by every thread in the next step
    tl.store(start + nb, n)
    tl.debug_barrier()
    # the Jacobian's blocks: runs of PAV blocks whose adjacent values differ by <= TOL (the authors' partition)
    nf = tl.full((), 0, tl.int32)
    j = tl.full((), 0, tl.int32)
    while j < nb:
        if KL:
            prev = tl.load(acc1 + j) - tl.load(acc2 + j)
        else:
            prev = tl.load(acc1 + j) / tl.load(acc2 + j)
        k = j + 1
        go = k < nb
        while go:
            if KL:
                val = tl.load(acc1 + k) - tl.load(acc2 + k)
            else:
                val = tl.load(acc1 + k) / tl.load(acc2 + k)
            close = tl.abs(val - prev) <= _TOL
            prev = tl.where(close, val, prev)
            k = tl.where(close, k + 1, k)
            go = close & (k < nb)
        a = tl.load(start + j)
        e = tl.load(start + k)
        # μ = s - mean / LSE(s_B) + mean / LSE(w_B), each relative to the block's first entry (the CPU kernel's
        # form: s - v cancels catastrophically once |s| is large next to w); a singleton gives w exactly
        s0 = tl.load(s_row + a)
        w0 = tl.load(ws_row + a)
        if KL:
            ms = s0 * 0
            mw = s0 * 0
            for m in range(a, e):
                ms = tl.maximum(ms, tl.load(s_row + m) - s0)
                mw = tl.maximum(mw, tl.load(ws_row + m) - w0)
            ts = s0 * 0
            tw = s0 * 0
            for m in range(a, e):
                ts += tl.exp(tl.load(s_row + m) - s0 - ms)
                tw += tl.exp(tl.load(ws_row + m) - w0 - mw)
            cs = ms + tl.log(ts)
            cw = mw + tl.log(tw)
        else:
            cs = s0 * 0
            cw = s0 * 0
            for m in range(a, e):
                cs += tl.load(s_row + m) - s0
                cw += tl.load(ws_row + m) - w0
            cs = cs / (e - a)
            cw = cw / (e - a)
        for m in range(a, e):
            wm = tl.load(ws_row + m)
            val = ((tl.load(s_row + m) - s0) - cs) - ((wm - w0) - cw) + wm
            tl.store(mu_ptr + roff + tl.load(order_ptr + zoff + m), val.to(mu_ptr.dtype.element_ty))
            tl.store(bid_ptr + roff + m, nf.to(tl.int64))
        nf += 1
        j = k


@triton.jit
def _fss_bwd(g_ptr, z_ptr, order_ptr, w_ptr, worder_ptr, scale_ptr, bid_ptr, gz_ptr, gw_ptr, n, z_stride, w_stride,
             KL: tl.constexpr, WREV: tl.constexpr, NEED_Z: tl.constexpr, NEED_W: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    zoff = row * z_stride
    woff = row * w_stride
    roff = row * n
    scale = tl.load(scale_ptr)
    a = tl.full((), 0, tl.int32)
    while a < n:
        b0 = tl.load(bid_ptr + roff + a)
        e = a + 1
        go = e < n
        while go:
            same = tl.load(bid_ptr + roff + e) == b0
            e = tl.where(same, e + 1, e)
            go = same & (e < n)
        tot = scale * 0
        for m in range(a, e):
            tot += tl.load(g_ptr + roff + tl.load(order_ptr + zoff + m)).to(tl.float64)
        if KL:
            hs = scale * 0 - float("inf")
            hw = scale * 0 - float("inf")
            for m in range(a, e):
                hs = tl.maximum(hs, scale * tl.load(z_ptr + zoff + tl.load(order_ptr + zoff + m)).to(tl.float64))
                if WREV:
                    wj = tl.load(worder_ptr + woff + (n - 1 - m))
                else:
                    wj = tl.load(worder_ptr + woff + m)
                hw = tl.maximum(hw, tl.load(w_ptr + woff + wj).to(tl.float64))
            ts = scale * 0
            tw = scale * 0
            for m in range(a, e):
                ts += tl.exp(scale * tl.load(z_ptr + zoff + tl.load(order_ptr + zoff + m)).to(tl.float64) - hs)
                if WREV:
                    wj = tl.load(worder_ptr + woff + (n - 1 - m))
                else:
                    wj = tl.load(worder_ptr + woff + m)
                tw += tl.exp(tl.load(w_ptr + woff + wj).to(tl.float64) - hw)
        else:
            c = tot / (e - a)
        for m in range(a, e):
            zi = tl.load(order_ptr + zoff + m)
            if WREV:
                wj = tl.load(worder_ptr + woff + (n - 1 - m))
            else:
                wj = tl.load(worder_ptr + woff + m)
            if NEED_Z:
                gi = tl.load(g_ptr + roff + zi).to(tl.float64)
                if KL:
                    gzi = scale * (gi - tl.exp(scale * tl.load(z_ptr + zoff + zi).to(tl.float64) - hs) / ts * tot)
                else:
                    gzi = scale * (gi - c)
                tl.store(gz_ptr + roff + zi, gzi.to(gz_ptr.dtype.element_ty))
            if NEED_W:
                if KL:
                    gwi = tl.exp(tl.load(w_ptr + woff + wj).to(tl.float64) - hw) / tw * tot
                else:
                    gwi = c
                tl.store(gw_ptr + roff + wj, gwi.to(gw_ptr.dtype.element_ty))
        a = e


def _checked(name: str, z: Tensor, order: Tensor, w: Tensor, worder: Tensor) -> tuple[int, int]:
    """(B, n) of a call; raises ``ValueError`` for shapes the kernels do not take."""
    if z.dim() != 2 or w.dim() != 2 or z.shape[1] != w.shape[1]:
        raise ValueError(f"{name}: z and w must be (1 or B, n) with the same n, got {tuple(z.shape)}, "
                         f"{tuple(w.shape)}")
    if order.shape != z.shape or worder.shape != w.shape or order.dtype != torch.int64 or worder.dtype != torch.int64:
        raise ValueError(f"{name}: order / worder must be int64 of z's / w's shape")
    if z.shape[0] not in (1, w.shape[0]) and w.shape[0] != 1:
        raise ValueError(f"{name}: the rows of z ({z.shape[0]}) and w ({w.shape[0]}) must be equal or 1")
    return max(z.shape[0], w.shape[0]), z.shape[1]


def _scale(scale: float, device: torch.device) -> Tensor:
    """``scale`` as a one-element float64 tensor (a Python float argument would reach the kernel in float32)."""
    return torch.full((1,), scale, dtype=torch.float64, device=device)


def project_fwd(z: Tensor, scale: float, order: Tensor, w: Tensor, worder: Tensor, wrev: bool,
                kl: bool) -> tuple[Tensor, Tensor]:
    """The projection μ = P(scale·z, w) of every row, and the Jacobian block of each sorted position (Blondel et
    al. 2020, Prop. 3 and §5; the CPU kernel :func:`diffrank.operators.fast_soft_sort_cpu.project_fwd`, same
    arguments and conventions).

    Args:
        z: ``(1 or B, n)`` float32 / float64 on a CUDA device (or the CPU under ``TRITON_INTERPRET=1``); a single
            row is shared by the batch.
        scale: the factor of z (the caller's ±1/ε), a Python float.
        order: ``int64`` of z's shape, sorting each row of scale·z descending.
        w: ``(1 or B, n)`` of z's dtype and device.
        worder: ``int64`` of w's shape, sorting each row of w descending (ascending with ``wrev``: read from the end).
        wrev: whether ``worder`` is ascending.
        kl: the regularization (``False``: l2, P_Q; ``True``: kl, P_E in log space).

    Returns:
        ``(μ (B, n) of z's dtype in z's order, bid (B, n) int64)``: ``bid[b, i]`` numbers the Jacobian blocks
        0, 1, ... along the sorted positions i.

    Raises:
        ValueError: shapes or index dtypes the kernel does not take.
    """
    B, n = _checked("project_fwd", z, order, w, worder)
    mu = z.new_empty(B, n)
    bid = order.new_empty(B, n)
    if B == 0 or n == 0:
        return mu, bid
    z, order, w, worder = (t.contiguous() for t in (z, order, w, worder))
    scratch = torch.empty(4, B, n, dtype=torch.float64, device=z.device)  # s, sorted w, the stack's two sums
    start = torch.empty(B, n + 1, dtype=torch.int32, device=z.device)  # the stack's block starts
    _fss_fwd[(B,)](z, order, w, worder, _scale(scale, z.device), mu, bid, scratch[0], scratch[1], scratch[2],
                   scratch[3], start, n, 0 if z.shape[0] == 1 else n, 0 if w.shape[0] == 1 else n, KL=bool(kl),
                   WREV=bool(wrev), BLOCK=gather_block(n), num_warps=NUM_WARPS)
    return mu, bid


def project_bwd(g: Tensor, z: Tensor | None, scale: float, order: Tensor, w: Tensor, worder: Tensor, wrev: bool,
                bid: Tensor, kl: bool, need_z: bool, need_w: bool) -> tuple[Tensor | None, Tensor | None]:
    """The VJP of :func:`project_fwd` for a cotangent ``g`` (B, n) in z's order (Blondel et al. 2020, Lemma 2 and
    §5; the CPU kernel :func:`diffrank.operators.fast_soft_sort_cpu.project_bwd`).

    Per Jacobian block B with T = Σ_{i ∈ B} g_i: gz_i = scale·(g_i - p_i T) and gw_i = q_i T, p = q = 1/|B| (l2) or
    p = softmax(s_B), q = softmax(w_B) (kl).

    Args:
        g: ``(B, n)`` float32 / float64, the device and dtype of the forward's output.
        z: the forward's z, ``(1 or B, n)``; read only for kl (``None`` for l2).
        scale, order, w, worder, wrev, kl: the forward's arguments.
        bid: ``(B, n)`` int64, the forward's blocks.
        need_z, need_w: which gradients to compute.

    Returns:
        ``(gz, gw)``, each ``(B, n)`` of g's dtype (z's and w's order) or ``None`` when not needed; the caller sums
        the rows of a shared input.

    Raises:
        ValueError: shapes the kernel does not take, or kl without z.
    """
    if kl and z is None:
        raise ValueError("project_bwd: kl reads z")
    B, n = _checked("project_bwd", order, order, w, worder)  # order has z's shape
    z = g if z is None else z  # stands in for what l2 does not read
    if tuple(g.shape) != (B, n) or tuple(bid.shape) != (B, n):
        raise ValueError(f"project_bwd: g and bid must be ({B}, {n}), got {tuple(g.shape)}, {tuple(bid.shape)}")
    gz = torch.empty(B, n, dtype=g.dtype, device=g.device) if need_z else None
    gw = torch.empty(B, n, dtype=g.dtype, device=g.device) if need_w else None
    if B == 0 or n == 0 or not (need_z or need_w):
        return gz, gw
    g, z, order, w, worder, bid = (t.contiguous() for t in (g, z, order, w, worder, bid))
    _fss_bwd[(B,)](g, z, order, w, worder, _scale(scale, g.device), bid, g if gz is None else gz,
                   g if gw is None else gw, n, 0 if order.shape[0] == 1 else n, 0 if w.shape[0] == 1 else n,
                   KL=bool(kl), WREV=bool(wrev), NEED_Z=bool(need_z), NEED_W=bool(need_w), num_warps=NUM_WARPS)
    return gz, gw
