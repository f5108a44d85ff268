"""Fused Triton kernels for the relaxed comparator networks (odd-even, bitonic, splitter selection).

The computation is the one of :mod:`diffrank.operators.sorting_network` (see its docstring): per layer
t, with the layer's wire permutation ``partner`` and direction ``sign`` (Petersen et al. 2021, Eq. 1),

    diff = x[partner] - x,   w = 1 - f(β·sign·(x - x[partner])),   x' = x + w ⊙ diff,

and the m rows W·P are pushed from the output side back to the input with the same gather + lerp on the
columns (Petersen et al. 2022, Eq. 3); full P is the case W = I (m = n). Four kernels:

- ``_values_fwd``: one program per sample runs all L layers on the wire values, which stay in registers;
  writes the output values and, per layer, w and diff (B, L, n) to global memory for the rows and the
  backward pass.
- ``_rows_fwd``: one program per (sample, tile of BLOCK_M rows of W) runs the L layers in reverse on the
  tile; rows are independent, so full P (m = n) spreads over many programs.
- ``_rows_bwd``: per (sample, tile), recomputes the rows chain, keeping each layer's input tile in a
  transient buffer, then walks the gradient back (the layer matrices are symmetric: the same lerp) and
  writes dL/dw per layer, summed over the tile's rows.
- ``_values_bwd``: per sample, walks the layers back with the closed-form sigmoid slopes, adding
  dL/dw from the rows.

Reverse mode through L layers: saved between forward and backward are w and diff of the values,
O(L·B·n) (the values themselves are cheap to store, so nothing of them is recomputed); the rows chain is
NOT saved by the forward (that would hold O(L·B·m·n) until the backward, O(L·B·n²) for full P) but
recomputed once in the backward into a buffer that lives only during the backward call.

The gather x[partner] of a register block is not expressible in Triton, so each layer stores the block to
a per-program scratch row in global memory (L2-resident, two buffers used alternately so that one
barrier per layer suffices) and reloads it at the partner offsets (``.cg``: from L2, bypassing L1).

Limits: n <= :data:`MAX_N` (one program holds a sample's wires); larger n, and float64 scores (the kernels
compute in float32), run the PyTorch path (:func:`supports`). All six sigmoids of
:mod:`diffrank.operators.sigmoids` are implemented with their closed-form slopes; ``cauchy`` uses an
arctangent with range reduction and a polynomial (float32 accuracy, ~1e-7 relative), since
``libdevice.atan`` does not run in the Triton interpreter.

Launch functions only (:func:`network_forward`, :func:`network_backward`): the autograd Function, its recorded
backward, forward mode and vmap rule are the operator's, in :mod:`diffrank.operators.sorting_network`. On the CPU
the kernels run under ``TRITON_INTERPRET=1`` (tests); :class:`ComparatorNetwork` uses them for CUDA inputs with
``backend="auto"``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

#: largest number of wires a kernel program holds; larger n runs the PyTorch path
MAX_N = 4096
#: elements of the rows tile (BLOCK_M × BLOCK_N) one program pushes through the layers
ROWS_TILE = 8192
#: above this many floats (L x B x the rows tiles) the rows backward keeps a snapshot every ⌈√L⌉ layers only
CHECKPOINT_ELEMENTS = 2 ** 25
SIGMOID_CODES = {"logistic": 0, "logistic_phi": 1, "gaussian": 2, "reciprocal": 3, "cauchy": 4, "optimal": 5}


@triton.jit
def _atan(v):
    """Arctangent in float32: reduce |v| to [0, tan(π/8)] (π/2 - atan(1/a), π/4 + atan((a-1)/(a+1))), then an
    odd polynomial (minimax on that interval, ~1e-7 relative)."""
    a = tl.abs(v)
    big = a > 2.414213562373095  # tan(3π/8)
    mid = a > 0.41421356237309503  # tan(π/8)
    safe = tl.where(big, a, 1.0)
    r = tl.where(big, -1.0 / safe, tl.where(mid, (a - 1.0) / (a + 1.0), a))
    base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    z = r * r
    p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * r + r
    out = base + p
    return tl.where(v < 0, -out, out)


@triton.jit
def _alpha(d, beta, lam, SIGMOID: tl.constexpr):
    """α = f(d) of :func:`diffrank.operators.sigmoids.swap_weight` (same β scale), float32."""
    v = beta * d
    if SIGMOID == 0:  # logistic
        out = tl.sigmoid(v)
    elif SIGMOID == 1:  # logistic_phi: ε inside the power, as sigmoids.py
        a = tl.abs(d) + 1e-10
        out = tl.sigmoid(v * tl.exp(-lam * tl.log(a)))
    elif SIGMOID == 2:  # gaussian
        out = 0.5 + 0.5 * tl.erf(v * 0.7071067811865476)
    elif SIGMOID == 3:  # reciprocal
        out = 0.5 * (v / (2.0 + tl.abs(v)) + 1.0)
    elif SIGMOID == 4:  # cauchy
        out = _atan(v) * 0.3183098861837907 + 0.5
    else:  # optimal
        tail = tl.abs(v) > 0.25
        vt = tl.where(tail, v, 1.0)  # 1/(16 v) only where it is taken
        out = tl.where(tail, tl.where(vt > 0, 1.0 - 1.0 / (16.0 * vt), -1.0 / (16.0 * vt)), v + 0.5)
    return out


@triton.jit
def _slope(d, beta, lam, SIGMOID: tl.constexpr):
    """dα/dd of :func:`_alpha`, closed form as :func:`diffrank.operators.sigmoids.swap_slope`."""
    v = beta * d
    if SIGMOID == 0:
        s = tl.sigmoid(v)
        out = beta * s * (1.0 - s)
    elif SIGMOID == 1:
        ad = tl.abs(d)
        a = ad + 1e-10
        la = tl.log(a)
        s = tl.sigmoid(v * tl.exp(-lam * la))
        out = s * (1.0 - s) * beta * tl.exp((-lam - 1.0) * la) * (a - lam * ad)
    elif SIGMOID == 2:
        out = beta * 0.3989422804014327 * tl.exp(-0.5 * v * v)
    elif SIGMOID == 3:
        q = 2.0 + tl.abs(v)
        out = beta / (q * q)
    elif SIGMOID == 4:
        out = beta * 0.3183098861837907 / (1.0 + v * v)
    else:
        tail = tl.abs(v) > 0.25
        vt = tl.where(tail, v, 1.0)
        out = tl.where(tail, beta / (16.0 * vt * vt), beta + 0.0 * v)
    return out


@triton.jit
def _values_fwd(x_ptr, out_ptr, w_ptr, d_ptr, scratch_ptr, partner_ptr, sign_ptr, index_ptr, n, L, beta, lam,
                SIGMOID: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + b * n + offs, mask=mask, other=0.0).to(tl.float32)
    scratch = scratch_ptr + b * 2 * BLOCK
    for t in range(0, L):
        u = tl.load(index_ptr + t)
        partner = tl.load(partner_ptr + u * n + offs, mask=mask, other=0)
        partner = tl.where(mask, partner, offs)
        sign = tl.load(sign_ptr + u * n + offs, mask=mask, other=0).to(tl.float32)
        buf = scratch + (t % 2) * BLOCK
        tl.store(buf + offs, x)
        tl.debug_barrier()
        diff = tl.load(buf + partner, cache_modifier=".cg") - x
        w = 1.0 - _alpha(-sign * diff, beta, lam, SIGMOID)
        x = x + w * diff
        row = (b * L + t) * n
        tl.store(w_ptr + row + offs, w, mask=mask)
        tl.store(d_ptr + row + offs, diff, mask=mask)
    tl.store(out_ptr + b * n + offs, x, mask=mask)


@triton.jit
def _rows_fwd(y0_ptr, y0_bstride, out_ptr, w_ptr, scratch_ptr, partner_ptr, index_ptr, n, m, L,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < n
    mask = (rows < m)[:, None] & cmask[None, :]
    y = tl.load(y0_ptr + b * y0_bstride + rows[:, None] * n + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N
    scratch = scratch_ptr + (b * tl.num_programs(1) + tile) * (2 * BLOCK_M * BLOCK_N)
    for s in range(0, L):
        t = L - 1 - s
        u = tl.load(index_ptr + t)
        partner = tl.load(partner_ptr + u * n + cols, mask=cmask, other=0)
        partner = tl.where(cmask, partner, cols)
        w = tl.load(w_ptr + (b * L + t) * n + cols, mask=cmask, other=0.0)
        buf = scratch + (s % 2) * (BLOCK_M * BLOCK_N)
        tl.store(buf + local + cols[None, :], y)
        tl.debug_barrier()
        yp = tl.load(buf + local + partner[None, :], cache_modifier=".cg")
        y = y + w[None, :] * (yp - y)
    tl.store(out_ptr + (b * m + rows[:, None]) * n + cols[None, :], y, mask=mask)


@triton.jit
def _rows_bwd(y0_ptr, y0_bstride, g_ptr, w_ptr, gw_ptr, ysave_ptr, scratch_ptr, partner_ptr, index_ptr, n, m, L, S,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    ntiles = tl.num_programs(1)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < n
    mask = (rows < m)[:, None] & cmask[None, :]
    rowbase = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N
    local = rowbase + cols[None, :]
    TILE = BLOCK_M * BLOCK_N
    prog = b * ntiles + tile
    scratch = scratch_ptr + prog * (2 * TILE)
    nseg = tl.cdiv(L, S)
    # ysave: nseg snapshots (the tile entering chain steps 0, S, 2S, …), then S - 1 slots for a segment's others
    ysave = ysave_ptr + prog * (nseg + S - 1) * TILE
    # recompute the rows chain (it runs t = L-1 … 0; chain step s is layer t = L-1-s), keeping the snapshots
    y = tl.load(y0_ptr + b * y0_bstride + rows[:, None] * n + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    for s in range(0, L):
        t = L - 1 - s
        u = tl.load(index_ptr + t)
        partner = tl.load(partner_ptr + u * n + cols, mask=cmask, other=0)
        partner = tl.where(cmask, partner, cols)
        w = tl.load(w_ptr + (b * L + t) * n + cols, mask=cmask, other=0.0)
        if s % S == 0:
            tl.store(ysave + (s // S) * TILE + local, y)
        buf = scratch + (s % 2) * TILE
        tl.store(buf + local, y)
        tl.debug_barrier()
        yp = tl.load(buf + rowbase + partner[None, :], cache_modifier=".cg")
        y = y + w[None, :] * (yp - y)
    # walk back t = 0 … L-1 (chain steps s = L-1 … 0), one segment of S steps at a time, last segment first:
    # dL/dw_t = Σ_rows G ⊙ (Y[:, partner] - Y), G ← the same lerp (symmetric layer)
    g = tl.load(g_ptr + (b * m + rows[:, None]) * n + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    for jj in range(0, nseg):
        j = nseg - 1 - jj
        start = j * S
        end = tl.minimum(start + S, L)
        tl.debug_barrier()  # the slots are rewritten: every thread is done reading the previous segment
        y = tl.load(ysave + j * TILE + local, cache_modifier=".cg")
        for s in range(start, end - 1):  # the segment's other inputs, from its snapshot (none when S = 1)
            t = L - 1 - s
            u = tl.load(index_ptr + t)
            partner = tl.load(partner_ptr + u * n + cols, mask=cmask, other=0)
            partner = tl.where(cmask, partner, cols)
            w = tl.load(w_ptr + (b * L + t) * n + cols, mask=cmask, other=0.0)
            buf = scratch + (s % 2) * TILE
            tl.store(buf + local, y)
            tl.debug_barrier()
            yp = tl.load(buf + rowbase + partner[None, :], cache_modifier=".cg")
            y = y + w[None, :] * (yp - y)
            tl.store(ysave + (nseg + s - start) * TILE + local, y)
        tl.debug_barrier()
        for q in range(0, end - start):
            s = end - 1 - q
            t = L - 1 - s
            u = tl.load(index_ptr + t)
            partner = tl.load(partner_ptr + u * n + cols, mask=cmask, other=0)
            partner = tl.where(cmask, partner, cols)
            w = tl.load(w_ptr + (b * L + t) * n + cols, mask=cmask, other=0.0)
            slot = tl.where(s == start, j, nseg + s - start - 1)
            yin = tl.load(ysave + slot * TILE + local, cache_modifier=".cg")
            yp = tl.load(ysave + slot * TILE + rowbase + partner[None, :], cache_modifier=".cg")
            gw = tl.sum(g * (yp - yin), axis=0)
            tl.store(gw_ptr + (prog * L + t) * n + cols, gw, mask=cmask)
            buf = scratch + (t % 2) * TILE
            tl.store(buf + local, g)
            tl.debug_barrier()
            gp = tl.load(buf + rowbase + partner[None, :], cache_modifier=".cg")
            g = g + w[None, :] * (gp - g)


@triton.jit
def _values_bwd(gout_ptr, gw_ptr, w_ptr, d_ptr, gx_ptr, scratch_ptr, partner_ptr, sign_ptr, index_ptr, n, L,
                beta, lam, SIGMOID: tl.constexpr, HAS_GOUT: tl.constexpr, HAS_GW: tl.constexpr,
                BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    if HAS_GOUT:
        gx = tl.load(gout_ptr + b * n + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        gx = tl.zeros((BLOCK,), dtype=tl.float32)
    scratch = scratch_ptr + b * 2 * BLOCK
    for s in range(0, L):
        t = L - 1 - s
        u = tl.load(index_ptr + t)
        partner = tl.load(partner_ptr + u * n + offs, mask=mask, other=0)
        partner = tl.where(mask, partner, offs)
        sign = tl.load(sign_ptr + u * n + offs, mask=mask, other=0).to(tl.float32)
        row = (b * L + t) * n
        w = tl.load(w_ptr + row + offs, mask=mask, other=0.0)
        diff = tl.load(d_ptr + row + offs, mask=mask, other=0.0)
        # per wire: x' = x + w·diff, diff = x[partner] - x, w = 1 - f(-sign·diff) so dw/ddiff = sign·f'.
        # diff·f' is bounded where (gx·diff)·f' overflows float32 (diff ~ 1e26, f' = 0: inf · 0 = NaN)
        slope = _slope(-sign * diff, beta, lam, SIGMOID)
        g_slope = gx * (diff * slope)
        if HAS_GW:
            g_slope += tl.load(gw_ptr + row + offs, mask=mask, other=0.0) * slope
        gdiff = g_slope * sign + gx * w
        buf = scratch + (s % 2) * BLOCK
        tl.store(buf + offs, gdiff)
        tl.debug_barrier()
        gx = gx - gdiff + tl.load(buf + partner, cache_modifier=".cg")
    tl.store(gx_ptr + b * n + offs, gx, mask=mask)


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(int(n)))


def _warps(elements: int) -> int:
    # 4 096 or more elements over 8 warps spill on sm_90, and the rows backward's 2 048 over 4 warps on sm_80
    # (docs/gpu.md, budgets): 8 and 16 warps hold them in registers
    return 4 if elements <= 1024 else 8 if elements < 4096 else 16


def _rows_tiling(m: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, number of row tiles) for m rows of n columns."""
    bn = _block(n)
    bm = max(1, min(triton.next_power_of_2(int(m)), ROWS_TILE // bn))
    return bm, bn, triton.cdiv(m, bm)


def _segment(L: int, elements: int) -> int:
    """Chain steps per snapshot in the rows backward for ``elements`` per step (all programs' tiles): 1 (every
    step's input kept, L tiles per program) while L x elements <= :data:`CHECKPOINT_ELEMENTS`, else ⌈√L⌉
    (⌈L/S⌉ + S - 1 tiles, one more pass of the chain)."""
    return 1 if L * elements <= CHECKPOINT_ELEMENTS else math.isqrt(L - 1) + 1


def supports(n: int, dtype: torch.dtype) -> bool:
    """Whether the kernels handle a call: n <= :data:`MAX_N` and ``dtype`` float32 (the operator computes float16 /
    bfloat16 in float32; float64 asks for more precision than the float32 kernels give)."""
    return n <= MAX_N and dtype == torch.float32


def network_forward(x: Tensor, net, beta: float, sigmoid: str, art_lambda: float, mode: str,
                    y0: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The relaxed network's forward launch (Petersen et al. 2021, Eq. 1; rows by the bidirectional evaluation of
    Petersen et al. 2022, Eq. 3); the autograd Function around it is
    :class:`~diffrank.operators.sorting_network._Net` (with ``kernel=True``).

    Args:
        x: ``(B, n)`` scores on CUDA (or the CPU under ``TRITON_INTERPRET=1``), computed in float32.
        net: a :class:`diffrank.operators.networks.Network` on n wires with at least one layer.
        beta, sigmoid, art_lambda: the relaxed swap, validated by the caller.
        mode: ``"values"`` or ``"rows"`` (with ``y0`` ``(1 or B, m, n)``).

    Returns:
        ``(out, w, d)``: out ``(B, n)`` values or ``(B, m, n)`` rows, and the layer weights and differences
        ``(B, L, n)`` that :func:`network_backward` reads; float32.

    Raises:
        Nothing of its own: the caller checks the inputs (:func:`supports`).
    """
    partner, sign, index = net.layer_tables(x.device)
    x = x.detach().to(torch.float32).contiguous()
    B, n = x.shape
    L = int(index.shape[0])
    block = _block(n)
    code = SIGMOID_CODES[sigmoid]
    out = torch.empty_like(x)
    w = torch.empty(B, L, n, dtype=torch.float32, device=x.device)
    d = torch.empty_like(w)
    scratch = torch.empty(B, 2, block, dtype=torch.float32, device=x.device)
    _values_fwd[(B,)](x, out, w, d, scratch, partner, sign, index, n, L, float(beta), float(art_lambda),
                      SIGMOID=code, BLOCK=block, num_warps=_warps(block))
    if mode == "values":
        return out, w, d
    y0 = y0.to(device=x.device, dtype=torch.float32).contiguous()
    m = y0.shape[1]
    bm, bn, tiles = _rows_tiling(m, n)
    rows = torch.empty(B, m, n, dtype=torch.float32, device=x.device)
    scratch = torch.empty(B * tiles * 2 * bm * bn, dtype=torch.float32, device=x.device)
    bstride = 0 if y0.shape[0] == 1 else m * n
    _rows_fwd[(B, tiles)](y0, bstride, rows, w, scratch, partner, index, n, m, L, BLOCK_M=bm, BLOCK_N=bn,
                          num_warps=_warps(bm * bn))
    return rows, w, d


def network_backward(g: Tensor, w: Tensor, d: Tensor, y0: Tensor | None, net, beta: float, sigmoid: str,
                     art_lambda: float, mode: str) -> Tensor:
    """The VJP launch of :func:`network_forward`: the rows chain recomputed and walked back, then the values.

    Args:
        g: upstream gradient of the forward's ``out``; w, d: its ``(B, L, n)`` layer weights and differences;
        y0: the rows' ``(1 or B, m, n)`` (``"rows"``) or None; net, beta, sigmoid, art_lambda, mode: as the forward.

    Returns:
        ``(B, n)`` float32 gradient with respect to the scores.

    Raises:
        Nothing of its own.
    """
    partner, sign, index = net.layer_tables(g.device)
    code = SIGMOID_CODES[sigmoid]
    B, L, n = w.shape
    g = g.to(torch.float32).contiguous()
    gw = None
    if mode == "rows":
        y0 = y0.to(device=g.device, dtype=torch.float32).contiguous()
        m = y0.shape[1]
        bm, bn, tiles = _rows_tiling(m, n)
        gw_part = torch.empty(B, tiles, L, n, dtype=torch.float32, device=g.device)
        S = _segment(L, B * tiles * bm * bn)
        ysave = torch.empty(B * tiles * (triton.cdiv(L, S) + S - 1) * bm * bn, dtype=torch.float32,
                            device=g.device)
        scratch = torch.empty(B * tiles * 2 * bm * bn, dtype=torch.float32, device=g.device)
        bstride = 0 if y0.shape[0] == 1 else m * n
        _rows_bwd[(B, tiles)](y0, bstride, g, w, gw_part, ysave, scratch, partner, index, n, m, L, S,
                              BLOCK_M=bm, BLOCK_N=bn, num_warps=_warps(bm * bn))
        del ysave
        gw = gw_part[:, 0] if tiles == 1 else gw_part.sum(1)
        gw = gw.contiguous()
    block = _block(n)
    gx = torch.empty(B, n, dtype=torch.float32, device=g.device)
    scratch = torch.empty(B, 2, block, dtype=torch.float32, device=g.device)
    has_gout = mode == "values"
    _values_bwd[(B,)](g if has_gout else gx, gw if gw is not None else w, w, d, gx, scratch, partner, sign,
                      index, n, L, beta, art_lambda, SIGMOID=code, HAS_GOUT=has_gout,
                      HAS_GW=gw is not None, BLOCK=block, num_warps=_warps(block))
    return gx
