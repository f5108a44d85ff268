"""Fused log-domain Sinkhorn iterations in Triton (Cuturi, Teboul, Vert 2019, §2; the updates of
:mod:`diffrank.operators.log_sinkhorn`).

One program per batch row holds its whole cost tile C (items × targets, at most ``MAX_SIZE`` each) and both
dual potentials on chip and runs a run of iterations

    f_i ← ε_t log μ_i - ε_t LSE_j((g_j - C_ij) / ε_t),    g_j ← ε_t log ν_j - ε_t LSE_i((f_i - C_ij) / ε_t)

without touching global memory between them (the PyTorch path launches several kernels and writes an
n x m tensor per half-iteration). The ε of every iteration comes from a table the caller fills from its
schedule, so the kernel runs exactly the iterations of the PyTorch path; the caller launches one run per
convergence check and reads the item-marginal error max_i |Σ_j Γ_ij / μ_i - 1| that the kernel writes at
the end of a run (Γ = exp((f + g - C) / ε)).

Backward (reverse mode through the same iterations, as autograd through the PyTorch loop; Cuturi et al.
2019, §3): the forward optionally records the potentials each iteration read (f_t and g_{t-1}: n + m numbers
per iteration, instead of the several n x m tensors per iteration autograd keeps), and one program per row
walks the iterations backwards with the cost tile, its gradient and the potentials' gradients on chip. With
A = softmax_i((f_t - C) / ε_t) (columns) and B = softmax_j((g_{t-1} - C) / ε_t) (rows):

    ∂f_t += -A ∂g_t,   ∂C += A ⊙ ∂g_t,   ∂log ν += ε_t ∂g_t      (the target-side update)
    ∂g_{t-1} = -Bᵀ ∂f_t,   ∂C += B ⊙ ∂f_t,   ∂log μ += ε_t ∂f_t    (the item-side update)

Accumulation is in float32 (float64 for a float64 cost). The caller
(:func:`diffrank.operators.log_sinkhorn.log_sinkhorn`) runs the schedule and the autograd bookkeeping. On
the CPU the kernels run under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from diffrank.kernels._common import acc, acc_torch

#: the largest number of items or targets :func:`sinkhorn_updates` accepts (one program holds the whole tile)
MAX_SIZE = 128


def fused_size(dtype: torch.dtype) -> int:
    """The largest n (items and targets) that :func:`diffrank.operators.log_sinkhorn.log_sinkhorn` sends to the
    kernels; larger problems run the PyTorch path.

    The compiled budgets (``python -m devtools.kernels.aot``, docs/gpu.md) set it: the tiles that stay in
    registers without spilling on sm_80 and sm_90 are 64 x 64 in float32 (8 warps; 128 x 128 spills 0.1-1.7 KB
    per thread at 8, 16 or 32 warps) and 32 x 32 in float64 (64 x 64 spills 0.5-3 KB in the backward).

    Args:
        dtype: the cost's dtype, float32 or float64.

    Returns:
        64 for float32, 32 for float64.
    """
    return 32 if dtype == torch.float64 else 64


@triton.jit
def _lse_rows(x):
    """log Σ_j exp(x_ij) along axis 1 with the maximum shifted out (rows of -inf give 0)."""
    mx = tl.max(x, axis=1)
    shift = tl.where(mx == float("-inf"), 0.0, mx)
    # a row with an entry holds exp(0) = 1 at its maximum, so the clamp changes only the all -inf (padding)
    # rows, which it keeps finite (0) instead of log(0)
    return tl.log(tl.maximum(tl.sum(tl.exp(x - shift[:, None]), axis=1), 1.0)) + shift


@triton.jit
def _lse_cols(x):
    """log Σ_i exp(x_ij) along axis 0 with the maximum shifted out (columns of -inf give 0)."""
    mx = tl.max(x, axis=0)
    shift = tl.where(mx == float("-inf"), 0.0, mx)
    return tl.log(tl.maximum(tl.sum(tl.exp(x - shift[None, :]), axis=0), 1.0)) + shift  # as in _lse_rows


@triton.jit
def _sinkhorn_run(c_ptr, lmu_ptr, lnu_ptr, eps_ptr, f_ptr, g_ptr, err_ptr, fh_ptr, gh_ptr, n, m, steps, mu_stride,
                  nu_stride, eps_stride, CHECK: tl.constexpr, HISTORY: tl.constexpr, BN: tl.constexpr,
                  BM: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    i = tl.arange(0, BN)
    j = tl.arange(0, BM)
    mi, mj = i < n, j < m
    mask = mi[:, None] & mj[None, :]
    c = tl.load(c_ptr + row * n * m + i[:, None] * m + j[None, :], mask=mask, other=0.0).to(ACC)
    lmu = tl.load(lmu_ptr + row * mu_stride + i, mask=mi, other=0.0).to(ACC)
    lnu = tl.load(lnu_ptr + row * nu_stride + j, mask=mj, other=0.0).to(ACC)
    f = tl.load(f_ptr + row * n + i, mask=mi, other=0.0).to(ACC)
    g = tl.load(g_ptr + row * m + j, mask=mj, other=0.0).to(ACC)
    eps = tl.load(eps_ptr + row * eps_stride).to(ACC)
    for t in range(0, steps):
        eps = tl.load(eps_ptr + row * eps_stride + t).to(ACC)
        if HISTORY:
            tl.store(gh_ptr + (row * steps + t) * m + j, g, mask=mj)
        f = eps * lmu - eps * _lse_rows(tl.where(mask, (g[None, :] - c) / eps, float("-inf")))
        f = tl.where(mi, f, 0.0)  # padding rows are all -inf: keep them finite
        if HISTORY:
            tl.store(fh_ptr + (row * steps + t) * n + i, f, mask=mi)
        g = eps * lnu - eps * _lse_cols(tl.where(mask, (f[:, None] - c) / eps, float("-inf")))
        g = tl.where(mj, g, 0.0)
    tl.store(f_ptr + row * n + i, f, mask=mi)
    tl.store(g_ptr + row * m + j, g, mask=mj)
    if CHECK:
        mass = _lse_rows(tl.where(mask, (f[:, None] + g[None, :] - c) / eps, float("-inf")))
        err = tl.where(mi, tl.abs(tl.exp(mass - lmu) - 1.0), 0.0)
        tl.store(err_ptr + row, tl.max(err, axis=0))


@triton.jit
def _sinkhorn_bwd_run(c_ptr, eps_ptr, fh_ptr, gh_ptr, dc_ptr, df_ptr, dg_ptr, dmu_ptr, dnu_ptr, n, m, steps,
                      eps_stride, BN: tl.constexpr, BM: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    i = tl.arange(0, BN)
    j = tl.arange(0, BM)
    mi, mj = i < n, j < m
    mask = mi[:, None] & mj[None, :]
    tile = row * n * m + i[:, None] * m + j[None, :]
    c = tl.load(c_ptr + tile, mask=mask, other=0.0).to(ACC)
    dc = tl.load(dc_ptr + tile, mask=mask, other=0.0)
    df = tl.load(df_ptr + row * n + i, mask=mi, other=0.0)
    dg = tl.load(dg_ptr + row * m + j, mask=mj, other=0.0)
    dmu = tl.load(dmu_ptr + row * n + i, mask=mi, other=0.0)
    dnu = tl.load(dnu_ptr + row * m + j, mask=mj, other=0.0)
    for back in range(0, steps):
        t = steps - 1 - back
        eps = tl.load(eps_ptr + row * eps_stride + t).to(ACC)
        f = tl.load(fh_ptr + (row * steps + t) * n + i, mask=mi, other=0.0).to(ACC)
        g = tl.load(gh_ptr + (row * steps + t) * m + j, mask=mj, other=0.0).to(ACC)
        # the target-side update g_t = ε log ν - ε LSE_i((f_t - C) / ε)
        x = tl.where(mask, (f[:, None] - c) / eps, float("-inf"))
        a = tl.exp(x - _lse_cols(x)[None, :])  # 0 on the padding
        wa = a * dg[None, :]
        df = df - tl.sum(wa, axis=1)
        dc += wa
        dnu += eps * dg
        # the item-side update f_t = ε log μ - ε LSE_j((g_{t-1} - C) / ε)
        y = tl.where(mask, (g[None, :] - c) / eps, float("-inf"))
        b = tl.exp(y - _lse_rows(y)[:, None])
        wb = b * df[:, None]
        dg = -tl.sum(wb, axis=0)
        dc += wb
        dmu += eps * df
        df = tl.zeros((BN,), dtype=ACC)  # f_{t-1} feeds nothing but the output, counted once at the top
    tl.store(dc_ptr + tile, dc, mask=mask)
    tl.store(df_ptr + row * n + i, df, mask=mi)
    tl.store(dg_ptr + row * m + j, dg, mask=mj)
    tl.store(dmu_ptr + row * n + i, dmu, mask=mi)
    tl.store(dnu_ptr + row * m + j, dnu, mask=mj)


def _blocks(n: int, m: int) -> tuple[int, int]:
    return triton.next_power_of_2(max(n, 16)), triton.next_power_of_2(max(m, 16))


def _fwd_warps(bn: int, bm: int) -> int:
    return 8 if bn * bm >= 64 * 64 else 4


def _bwd_warps(bn: int, bm: int) -> int:
    # the backward holds C, ∂C and two softmax tiles: more warps keep the 128 x 128 tile in registers
    return 16 if bn * bm >= 128 * 128 else 8 if bn * bm >= 64 * 64 else 4


def sinkhorn_updates(cost: Tensor, log_mu: Tensor, log_nu: Tensor, f: Tensor, g: Tensor, eps: Tensor,
                     check: bool, history: bool = False) -> tuple[Tensor | None, tuple[Tensor, Tensor] | None]:
    """Run ``eps.shape[-1]`` log-domain Sinkhorn iterations in place on the potentials, one program per row.

    Args:
        cost: ``(R, n, m)`` cost C, float32 or float64, ``n, m <= MAX_SIZE``; on CUDA (or the CPU under
            ``TRITON_INTERPRET=1``).
        log_mu: ``(R or 1, n)`` log item masses; log_nu: ``(R or 1, m)`` log target masses.
        f: ``(R, n)`` item potentials, contiguous, dtype of ``cost``; updated in place.
        g: ``(R, m)`` target potentials, likewise.
        eps: ``(R or 1, T)`` the ε of each of the T >= 1 iterations (same units as the cost).
        check: also return each row's item-marginal error after the last iteration.
        history: also return the potentials each iteration read, for :func:`sinkhorn_backward`.

    Returns:
        ``(err, history)``: ``err`` ``(R,)`` = max_i |Σ_j Γ_ij / μ_i - 1| with Γ = exp((f + g - C) / ε_last)
        when ``check``, else ``None``; ``history`` = ``(f_t (R, T, n), g_{t-1} (R, T, m))`` when asked, else
        ``None``.

    Raises:
        ValueError: for a cost that is not float32 / float64, shapes that disagree, ``n`` or ``m`` above
            ``MAX_SIZE``, no iterations, or potentials that are not contiguous tensors of the cost's dtype.
    """
    R, n, m = cost.shape
    if cost.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"the fused Sinkhorn kernel takes a float32 or float64 cost, got {cost.dtype}")
    if max(n, m) > MAX_SIZE:
        raise ValueError(f"the fused Sinkhorn kernel holds at most {MAX_SIZE} items and targets, got {n} x {m}")
    if f.shape != (R, n) or g.shape != (R, m) or not (f.is_contiguous() and g.is_contiguous()) \
            or f.dtype != cost.dtype or g.dtype != cost.dtype:
        raise ValueError(f"f and g must be contiguous ({R}, {n}) and ({R}, {m}) tensors of dtype {cost.dtype}")
    if eps.dim() != 2 or eps.shape[0] not in (1, R) or eps.shape[1] < 1:
        raise ValueError(f"eps must be (1 or {R}, T >= 1), got {tuple(eps.shape)}")
    c = cost.contiguous()
    lmu = log_mu.to(cost.dtype).contiguous()
    lnu = log_nu.to(cost.dtype).contiguous()
    eps = eps.to(cost.dtype).contiguous()
    steps = eps.shape[1]
    err = torch.empty(R, dtype=cost.dtype, device=cost.device)
    fh = torch.empty(R, steps, n, dtype=cost.dtype, device=cost.device) if history else f
    gh = torch.empty(R, steps, m, dtype=cost.dtype, device=cost.device) if history else g
    bn, bm = _blocks(n, m)
    _sinkhorn_run[(R,)](c, lmu, lnu, eps, f, g, err, fh, gh, n, m, steps, 0 if lmu.shape[0] == 1 else n,
                        0 if lnu.shape[0] == 1 else m, 0 if eps.shape[0] == 1 else steps, CHECK=check,
                        HISTORY=history, BN=bn, BM=bm, ACC=acc(cost.dtype),
                        num_warps=_fwd_warps(bn, bm))
    return (err if check else None), ((fh, gh) if history else None)


def sinkhorn_backward(cost: Tensor, runs: list[tuple[Tensor, Tensor, Tensor]], d_cost: Tensor, d_f: Tensor,
                      d_g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Reverse-mode gradient through the iterations of :func:`sinkhorn_updates` runs (see the module docstring).

    Args:
        cost: ``(R, n, m)`` the cost of the forward.
        runs: the forward's runs in order, each ``(eps (R or 1, T), f_t (R, T, n), g_{t-1} (R, T, m))`` (the ε
            table and the history :func:`sinkhorn_updates` returned).
        d_cost: ``(R, n, m)`` the gradient of C from the output's direct use of C; d_f ``(R, n)``, d_g
            ``(R, m)``: those of the last potentials. All three contiguous, float32 (float64 for a float64
            cost), updated in place.

    Returns:
        ``(∂C (R, n, m), ∂log μ (R, n), ∂log ν (R, m))`` per row, in the accumulation dtype.

    Raises:
        ValueError: if a gradient buffer has the wrong shape, dtype or layout.
    """
    R, n, m = cost.shape
    acc_dtype = acc_torch(cost.dtype)
    for x, shape in ((d_cost, (R, n, m)), (d_f, (R, n)), (d_g, (R, m))):
        if x.shape != shape or x.dtype != acc_dtype or not x.is_contiguous():
            raise ValueError(f"gradient buffers must be contiguous {acc_dtype} tensors of shapes (R, n, m), (R, n), "
                             f"(R, m); got {tuple(x.shape)} {x.dtype}")
    c = cost.contiguous()
    d_mu = torch.zeros(R, n, dtype=acc_dtype, device=cost.device)
    d_nu = torch.zeros(R, m, dtype=acc_dtype, device=cost.device)
    bn, bm = _blocks(n, m)
    for eps, fh, gh in reversed(runs):
        eps = eps.to(cost.dtype).contiguous()
        steps = eps.shape[1]
        _sinkhorn_bwd_run[(R,)](c, eps, fh, gh, d_cost, d_f, d_g, d_mu, d_nu, n, m, steps,
                                0 if eps.shape[0] == 1 else steps, BN=bn, BM=bm, ACC=acc(cost.dtype),
                                num_warps=_bwd_warps(bn, bm))
    return d_cost, d_mu, d_nu
