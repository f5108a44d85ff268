"""Triton kernels for the top rows of NeuralSort without the n x n matrix (Grover et al. 2019, Eq. 5).

Row r (rank r + 1, 0-based r) of P̂ is softmax_j(β ((n - 1 - 2r) s_j - (A_s 1)_j)), with (A_s 1)_j =
Σ_l |s_j - s_l| (Grover et al. 2019, Eq. 5; Petersen et al. 2022, §2.2). The row sums are a length-n vector
per sample: the caller computes them in O(n log n) with a sort and prefix sums
(:func:`diffrank.operators.neuralsort.abs_diff_row_sums`) and autograd differentiates that part, so no
n x n tensor is formed anywhere, forward or backward.

Forward: one program per (sample, rank row); an online softmax over item blocks keeps a running maximum
and a normaliser per lane (one pass over the items), then a second pass writes the row. The logits never
reach memory.

Backward (dlogit = P ⊙ (G - Σ_j P G) per row, the softmax Jacobian): one program per row computes the dot
Σ_j P_rj G_rj; then one program per (sample, item block) walks the k rows and accumulates
∂/∂s_j = β Σ_r (n - 1 - 2r) dlogit_rj and ∂/∂(A_s 1)_j = -β Σ_r dlogit_rj (each program owns its
items: no atomics).

A backward that is itself recorded (``create_graph=True``, ``torch.func`` transforms) computes the same
formulas with PyTorch operations on the saved P, which autograd differentiates again: second derivatives are
exact (P's own dependence on the scores runs back through this Function). ``torch.func.vmap`` folds the
vmapped dimension into the batch (one kernel launch).

Accumulation is in float32 (float64 for float64 inputs). On the CPU the kernels run under
``TRITON_INTERPRET=1`` (tests); :class:`~diffrank.operators.neuralsort.NeuralSort` picks them with
``backend`` (see :mod:`diffrank.operators.backend`).

Launch functions only (:func:`rows_forward`, :func:`rows_backward`): the autograd Function, its recorded backward
and vmap rule are the operator's, in :mod:`diffrank.operators.neuralsort`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from diffrank.kernels._common import acc, acc_torch, beta_tensor, row_item_blocks


@triton.jit
def _neuralsort_fwd(s_ptr, a_ptr, p_ptr, beta_ptr, n, k, BLOCK: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    b = row // k
    r = row % k
    beta = tl.load(beta_ptr)
    scale = (n - 1 - 2 * r).to(ACC)  # exact in float32 for n < 2^24, as in the PyTorch path
    m = tl.full((BLOCK,), float("-inf"), ACC)  # running maximum per lane
    d = tl.zeros((BLOCK,), dtype=ACC)  # running normaliser per lane, relative to m
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        s = tl.load(s_ptr + b * n + offs, mask=mask, other=0.0).to(ACC)
        a = tl.load(a_ptr + b * n + offs, mask=mask, other=0.0).to(ACC)
        z = tl.where(mask, (scale * s - a) * beta, float("-inf"))
        m_new = tl.maximum(m, z)
        # a lane that has seen no item yet keeps -inf: shift by 0 there so that exp(-inf - -inf) is not NaN
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        d = d * tl.exp(m - shift) + tl.exp(z - shift)
        m = m_new
    top = tl.max(m, axis=0)  # finite: lane 0 of the first block is an item (n >= 1)
    total = tl.sum(d * tl.exp(m - top), axis=0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        s = tl.load(s_ptr + b * n + offs, mask=mask, other=0.0).to(ACC)
        a = tl.load(a_ptr + b * n + offs, mask=mask, other=0.0).to(ACC)
        z = tl.where(mask, (scale * s - a) * beta, float("-inf"))  # past the end: exp(-inf) = 0, no overflow
        p = tl.exp(z - top) / total
        tl.store(p_ptr + row * n + offs, p.to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_dot(p_ptr, g_ptr, dot_ptr, n, BLOCK: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    acc = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        p = tl.load(p_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(g_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        acc += p * g
    tl.store(dot_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def _neuralsort_bwd(p_ptr, g_ptr, dot_ptr, ds_ptr, da_ptr, beta_ptr, n, k, BLOCK: tl.constexpr,
                    ACC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements for large batches
    beta = tl.load(beta_ptr)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ds = tl.zeros((BLOCK,), dtype=ACC)
    dsum = tl.zeros((BLOCK,), dtype=ACC)
    for r in range(0, k):
        row = b * k + r
        dot = tl.load(dot_ptr + row)
        p = tl.load(p_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(g_ptr + row * n + offs, mask=mask, other=0.0).to(ACC)
        dlogit = p * (g - dot)
        ds += dlogit * (n - 1 - 2 * r)
        dsum += dlogit
    tl.store(ds_ptr + b * n + offs, ds * beta, mask=mask)
    tl.store(da_ptr + b * n + offs, -dsum * beta, mask=mask)


def rows_forward(scores: Tensor, row_sums: Tensor, k: int, beta: float) -> Tensor:
    """Top ``k`` rows of the NeuralSort matrix P̂ (Grover et al. 2019, Eq. 5), forward launch only (the autograd
    Function is :class:`~diffrank.operators.neuralsort._NeuralSortRows`).

    Args:
        scores: ``(B, n)`` float16 / bfloat16 / float32 / float64 on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``); row_sums: ``(B, n)`` (A_s 1)_j of the same dtype and device;
        k: ``1 <= k <= n``; beta: β > 0.

    Returns:
        ``(B, k, n)`` of the scores' dtype; rows sum to 1.

    Raises:
        Nothing of its own: :func:`diffrank.operators.neuralsort.neuralsort_topk_rows` checks the shapes and k.
    """
    s, a = scores.contiguous(), row_sums.contiguous()
    B, n = s.shape
    p = torch.empty(B, k, n, dtype=s.dtype, device=s.device)
    _neuralsort_fwd[(B * k,)](s, a, p, beta_tensor(beta, s.dtype, s.device), n, k, BLOCK=row_item_blocks(n)[0],
                              ACC=acc(s.dtype))
    return p


def rows_backward(p: Tensor, grad: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """VJP of :func:`rows_forward` (dlogit = P ⊙ (G - Σ_j P G)) in two launches without atomics.

    Args:
        p: ``(B, k, n)`` the forward's output; grad: ``(B, k, n)`` upstream; beta: β.

    Returns:
        ``(∂L/∂s, ∂L/∂(A_s 1))``, each ``(B, n)`` in the accumulation dtype (float32, float64 for float64).

    Raises:
        Nothing of its own.
    """
    B, k, n = p.shape
    beta_t = beta_tensor(beta, p.dtype, p.device)
    acc_dtype = acc_torch(p.dtype)
    g = grad.contiguous()
    dot = torch.empty(B * k, dtype=acc_dtype, device=p.device)
    ds = torch.empty(B, n, dtype=acc_dtype, device=p.device)
    da = torch.empty(B, n, dtype=acc_dtype, device=p.device)
    block, item_block = row_item_blocks(n)
    _row_dot[(B * k,)](p, g, dot, n, BLOCK=block, ACC=acc(p.dtype))
    _neuralsort_bwd[(B, triton.cdiv(n, item_block))](p, g, dot, ds, da, beta_t, n, k, BLOCK=item_block,
                                                     ACC=acc(p.dtype))
    return ds, da
