"""Fused Triton kernels for the top rows of SoftSort (Prillo & Eisenschlos 2020, Eq. 3).

P[b, r, j] = softmax_j(-β |t_{b,r} - s_{b,j}|), t = the r-th largest score. One program per row (forward)
reads the scores once for the normaliser and once to write the row; the logits never reach memory.
Because t_r is itself one of the scores, the largest logit is exactly 0, so no max pass is needed.
Backward: one program per sample walks its k rows, dlogit = P ⊙ (G - Σ_j P G), and accumulates
∂/∂s_j = -β sign(s_j - t_r) dlogit_j (no atomics: the program owns the sample) and
∂/∂t_r = β Σ_j sign(s_j - t_r) dlogit_j, which autograd then routes through ``topk``.

On the CPU the kernels run under ``TRITON_INTERPRET=1`` (tests); ``SoftSort`` uses them for CUDA inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _load(ptr, start, n, BLOCK: tl.constexpr):
    """One block of a length-n row from ``start``: (values in float32, 0 past the end; offsets; mask)."""
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32), offs, mask


@triton.jit
def _softsort_fwd(s_ptr, t_ptr, p_ptr, n, k, beta, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    s_row = s_ptr + (row // k) * n
    t = tl.load(t_ptr + row).to(tl.float32)
    denom = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        s, offs, mask = _load(s_row, start, n, BLOCK)
        denom += tl.where(mask, tl.exp(-beta * tl.abs(t - s)), 0.0)
    total = tl.sum(denom, axis=0)
    for start in range(0, n, BLOCK):
        s, offs, mask = _load(s_row, start, n, BLOCK)
        p = tl.exp(-beta * tl.abs(t - s)) / total
        tl.store(p_ptr + row * n + offs, p.to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softsort_bwd(s_ptr, t_ptr, p_ptr, g_ptr, ds_ptr, dt_ptr, n, k, beta, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    for r in range(0, k):
        row = b * k + r
        t = tl.load(t_ptr + row).to(tl.float32)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n, BLOCK):
            p, offs, mask = _load(p_ptr + row * n, start, n, BLOCK)
            g, offs, mask = _load(g_ptr + row * n, start, n, BLOCK)
            acc += p * g
        dot = tl.sum(acc, axis=0)
        dt = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n, BLOCK):
            s, offs, mask = _load(s_ptr + b * n, start, n, BLOCK)
            p, offs, mask = _load(p_ptr + row * n, start, n, BLOCK)
            g, offs, mask = _load(g_ptr + row * n, start, n, BLOCK)
            dlogit = p * (g - dot)
            diff = s - t
            sgn = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
            ds = tl.load(ds_ptr + b * n + offs, mask=mask, other=0.0)
            tl.store(ds_ptr + b * n + offs, ds - beta * sgn * dlogit, mask=mask)
            dt += tl.where(mask, beta * sgn * dlogit, 0.0)
        tl.store(dt_ptr + row, tl.sum(dt, axis=0))


def _block(n: int) -> int:
    return min(4096, triton.next_power_of_2(max(int(n), 16)))


class _SoftSortRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: Tensor, top: Tensor, beta: float) -> Tensor:
        s, t = scores.contiguous(), top.contiguous()
        B, n = s.shape
        k = t.shape[1]
        p = torch.empty(B, k, n, dtype=scores.dtype, device=scores.device)
        _softsort_fwd[(B * k,)](s, t, p, n, k, float(beta), BLOCK=_block(n))
        ctx.save_for_backward(s, t, p)
        ctx.beta = float(beta)
        return p

    @staticmethod
    def backward(ctx, grad: Tensor):
        s, t, p = ctx.saved_tensors
        B, n = s.shape
        k = t.shape[1]
        ds = torch.zeros(B, n, dtype=torch.float32, device=s.device)
        dt = torch.empty(B, k, dtype=torch.float32, device=s.device)
        _softsort_bwd[(B,)](s, t, p, grad.contiguous(), ds, dt, n, k, ctx.beta, BLOCK=_block(n))
        return ds.to(s.dtype), dt.to(t.dtype), None


def softsort_topk_rows(scores: Tensor, k: int, beta: float) -> Tensor:
    """Top ``k`` rows of the SoftSort matrix with fused Triton kernels (forward and backward).

    Args:
        scores: ``(B, n)`` float16 / bfloat16 / float32 / float64 on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``); validated by the caller.
        k: number of rows, ``1 <= k <= n``.
        beta: inverse temperature β > 0.

    Returns:
        ``(B, k, n)`` of the scores' dtype (accumulation in float32); rows sum to 1.
    """
    top = scores.topk(k, dim=-1, sorted=True).values
    return _SoftSortRows.apply(scores, top, beta)
