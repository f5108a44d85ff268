"""Fused Triton kernels for the top rows of SoftSort (Prillo & Eisenschlos 2020, Eq. 3).

P[b, r, j] = softmax_j(-β |t_{b,r} - s_{b,j}|), t = the r-th largest score. One program per row (forward)
reads the scores once for the normaliser and once to write the row; the logits never reach memory.
Because t_r is itself one of the scores, the largest logit is exactly 0, so no max pass is needed.

Backward (dlogit = P ⊙ (G - Σ_j P G), the softmax Jacobian), in two launches without atomics:

- one program per row: the dot Σ_j P_rj G_rj, then ∂/∂t_r = β Σ_j sign(s_j - t_r) dlogit_rj, which
  autograd routes through ``topk`` to the item holding t_r;
- one program per (sample, item block): ∂/∂s_j = -β Σ_r sign(s_j - t_r) dlogit_rj over the k rows.

sign(0) = 0, as PyTorch's ``abs`` backward. A backward that is itself recorded (``create_graph=True``,
``torch.func`` transforms) computes the same formulas with PyTorch operations on the saved P, which autograd
differentiates again (exact second derivatives); ``torch.func.vmap`` folds the vmapped dimension into the batch.
Accumulation is in float32 (float64 for float64 inputs).
On the CPU the kernels run under ``TRITON_INTERPRET=1`` (tests); :class:`~diffrank.operators.softsort.SoftSort`
picks them with ``backend`` (see :mod:`diffrank.operators.backend`).

Launch functions only (:func:`rows_forward`, :func:`rows_backward`): the autograd Function, its recorded backward
and vmap rule are the operator's, in :mod:`diffrank.operators.softsort`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from diffrank.kernels._common import acc, acc_torch, beta_tensor, row_item_blocks


@triton.jit
def _softsort_fwd(s_ptr, t_ptr, p_ptr, beta_ptr, n, k, BLOCK: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    s_row = s_ptr + (row // k) * n
    t = tl.load(t_ptr + row).to(ACC)
    beta = tl.load(beta_ptr)
    denom = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        s = tl.load(s_row + offs, mask=mask, other=0.0).to(ACC)
        denom += tl.where(mask, tl.exp(-beta * tl.abs(t - s)), 0.0)
    total = tl.sum(denom, axis=0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        s = tl.load(s_row + offs, mask=mask, other=0.0).to(ACC)
        p = tl.exp(-beta * tl.abs(t - s)) / total
        tl.store(p_ptr + row * n + offs, p.to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sign(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _softsort_bwd_rows(s_ptr, t_ptr, p_ptr, g_ptr, beta_ptr, dot_ptr, dt_ptr, n, k, BLOCK: tl.constexpr,
                       ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    s_row = s_ptr + (row // k) * n
    t = tl.load(t_ptr + row).to(ACC)
    beta = tl.load(beta_ptr)
    acc = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        p = tl.load(p_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(g_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        acc += p * g
    dot = tl.sum(acc, axis=0)
    dt = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        s = tl.load(s_row + offs, mask=mask, other=0.0).to(ACC)
        p = tl.load(p_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(g_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        dt += _sign(s - t) * (p * (g - dot))  # p = 0 past the end
    tl.store(dot_ptr + row, dot)
    tl.store(dt_ptr + row, tl.sum(dt, axis=0) * beta)


@triton.jit
def _softsort_bwd_items(s_ptr, t_ptr, p_ptr, g_ptr, beta_ptr, dot_ptr, ds_ptr, n, k, BLOCK: tl.constexpr,
                        ACC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(s_ptr + b * n + offs, mask=mask, other=0.0).to(ACC)
    ds = tl.zeros((BLOCK,), dtype=ACC)
    for r in range(0, k):
        row = b * k + r
        t = tl.load(t_ptr + row).to(ACC)
        dot = tl.load(dot_ptr + row)
        p = tl.load(p_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(g_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        ds += _sign(s - t) * (p * (g - dot))
    beta = tl.load(beta_ptr)
    tl.store(ds_ptr + b * n + offs, -beta * ds, mask=mask)


def rows_forward(scores: Tensor, top: Tensor, beta: float) -> Tensor:
    """Top rows of the SoftSort matrix P[b, r, j] = softmax_j(-β |t_{b,r} - s_{b,j}|) (Prillo & Eisenschlos 2020,
    Eq. 3), forward launch only (the autograd Function is :class:`~diffrank.operators.softsort._SoftSortRows`).

    Args:
        scores: ``(B, n)`` float16 / bfloat16 / float32 / float64 on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``); top: ``(B, k)`` the k largest scores, descending; beta: β > 0.

    Returns:
        ``(B, k, n)`` of the scores' dtype; rows sum to 1.

    Raises:
        Nothing of its own: :func:`diffrank.operators.softsort.softsort_topk_rows` checks the shape and k and
        finds the top scores.
    """
    s, t = scores.contiguous(), top.contiguous()
    B, n = s.shape
    k = t.shape[1]
    p = torch.empty(B, k, n, dtype=scores.dtype, device=scores.device)
    _softsort_fwd[(B * k,)](s, t, p, beta_tensor(beta, s.dtype, s.device), n, k, BLOCK=row_item_blocks(n)[0],
                            ACC=acc(s.dtype))
    return p


def rows_backward(s: Tensor, t: Tensor, p: Tensor, grad: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """VJP of :func:`rows_forward` in two launches without atomics (one per row, one per item block).

    Args:
        s: ``(B, n)`` scores; t: ``(B, k)`` the top scores; p: ``(B, k, n)`` the forward's output;
        grad: ``(B, k, n)`` upstream; beta: β.

    Returns:
        ``(∂L/∂s (B, n), ∂L/∂t (B, k))`` in the accumulation dtype (float32, float64 for float64).

    Raises:
        Nothing of its own.
    """
    beta_t = beta_tensor(beta, s.dtype, s.device)
    B, n = s.shape
    k = t.shape[1]
    g = grad.contiguous()
    acc_dtype = acc_torch(s.dtype)
    dot = torch.empty(B * k, dtype=acc_dtype, device=s.device)
    dt = torch.empty(B, k, dtype=acc_dtype, device=s.device)
    ds = torch.empty(B, n, dtype=acc_dtype, device=s.device)
    block, item_block = row_item_blocks(n)
    _softsort_bwd_rows[(B * k,)](s, t, p, g, beta_t, dot, dt, n, k, BLOCK=block, ACC=acc(s.dtype))
    _softsort_bwd_items[(B, triton.cdiv(n, item_block))](s, t, p, g, beta_t, dot, ds, n, k, BLOCK=item_block,
                                                         ACC=acc(s.dtype))
    return ds, dt
