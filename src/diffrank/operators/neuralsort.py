"""NeuralSort (Grover, Wang, Zweig, Ermon, ICLR 2019), top rows only.

P̂[r, :] = softmax(((n + 1 - 2r) · s - A_s 1) / τ) for ranks r = 1..n (rank 1 = largest), with
A_s 1 the row sums Σ_l |s_j - s_l| (Grover et al. 2019, Eq. 5; Petersen et al. 2022 §2.2).
τ = 1/β.

Why it is fast: the row sums come from one sort and prefix sums (O(n log n)) instead of the n x n
matrix A_s (difftopk forms A_s and multiplies it by a ones matrix, O(n³)); only the requested r rows
are ever formed, so time and memory are O(B · r · n). ``soft_rank`` and ``soft_sort`` form no P at all on the
PyTorch path: they accumulate its rows in chunks and recompute them in the backward pass
(:mod:`diffrank.operators.streaming`; O(B · n) saved, a peak of a few chunks of ~64 MiB). With ``backend``
``"triton"`` (or ``"auto"`` on CUDA) the rows of ``forward`` / ``topk_membership`` (and of ``soft_rank`` /
``soft_sort`` while P fits in memory, always with ``"triton"``) come from fused kernels
(``src/diffrank/kernels/neuralsort.py``: a streaming softmax per rank row, the logits never stored) and the row sums
still from the sort here, so no n x n logits tensor exists forward or backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import SOFT_RANK, SOFT_SORT, RankingOperator, beta_repr, fold_vmapped
from diffrank.operators.streaming import dense_fits, streamed_rows


def abs_diff_row_sums(scores: Tensor) -> Tensor:
    """Σ_l |s_j - s_l| for every item j, in O(n log n) via a sort and prefix sums.

    Args:
        scores: ``(B, n)`` floating tensor.

    Returns:
        ``(B, n)`` tensor of row sums of ``|s_j - s_l|``, same dtype; differentiable (the gradient is
        that of the exact sum: sign(s_j - s_l) summed, 0 at ties).
    """
    n = scores.shape[-1]
    v, order = scores.sort(dim=-1)
    prefix = v.cumsum(dim=-1)  # prefix[i] = v_0 + ... + v_i
    total = prefix[..., -1:]
    i = torch.arange(n, device=scores.device, dtype=scores.dtype)
    below = v * i - (prefix - v)  # Σ_{l<i} (v_i - v_l)
    above = (total - prefix) - v * (n - 1 - i)  # Σ_{l>i} (v_l - v_i)
    sums_sorted = below + above
    return sums_sorted.scatter(-1, order, sums_sorted)  # out of place: vmap has a batching rule for it


class _NeuralSortRows(torch.autograd.Function):
    """The top k rows of P̂ through the Triton launches :func:`diffrank.kernels.neuralsort.rows_forward` and
    :func:`~diffrank.kernels.neuralsort.rows_backward`; a recorded backward computes the same formulas in PyTorch
    operations on the saved P (exact second derivatives); vmap folds into the batch."""

    twice_differentiable = True  # the recorded backward is PyTorch operations (read by diffrank.losses.newton)

    @staticmethod
    def forward(scores: Tensor, row_sums: Tensor, k: int, beta: float) -> Tensor:
        from diffrank.kernels.neuralsort import rows_forward

        return rows_forward(scores, row_sums, k, beta)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        scores, row_sums, _, ctx.beta = inputs
        ctx.dtypes = (scores.dtype, row_sums.dtype)
        ctx.save_for_backward(output)

    @staticmethod
    def vmap(info, in_dims, scores, row_sums, k, beta):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        size = info.batch_size
        p = _NeuralSortRows.apply(fold_vmapped(scores, in_dims[0], size), fold_vmapped(row_sums, in_dims[1], size),
                                  k, beta)
        return p.unflatten(0, (size, -1)), 0

    @staticmethod
    def backward(ctx, grad: Tensor):
        (p,) = ctx.saved_tensors
        B, k, n = p.shape
        if torch.is_grad_enabled():  # a recorded backward: the same formulas in differentiable operations
            dlogit = p * (grad - (p * grad).sum(-1, keepdim=True))
            scale = (n - 1 - 2 * torch.arange(k, device=p.device, dtype=p.dtype)).view(1, k, 1)
            return ((scale * dlogit).sum(1) * ctx.beta).to(ctx.dtypes[0]), \
                (dlogit.sum(1) * -ctx.beta).to(ctx.dtypes[1]), None, None
        from diffrank.kernels.neuralsort import rows_backward

        ds, da = rows_backward(p, grad, ctx.beta)
        return ds.to(ctx.dtypes[0]), da.to(ctx.dtypes[1]), None, None


def neuralsort_topk_rows(scores: Tensor, row_sums: Tensor, k: int, beta: float) -> Tensor:
    """Top ``k`` rows of the NeuralSort matrix P̂ with the fused Triton kernels of
    :mod:`diffrank.kernels.neuralsort` (Grover et al. 2019, Eq. 5).

    Args:
        scores: ``(B, n)`` float16 / bfloat16 / float32 / float64 scores s on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``), validated by the caller (finite, ``n >= 1``).
        row_sums: ``(B, n)`` the row sums (A_s 1)_j = Σ_l |s_j - s_l| of the same dtype and device
            (:func:`abs_diff_row_sums`); gradients flow into it, and from it
            to ``scores`` through whatever computed it.
        k: number of rows (ranks 1..k, rank 1 = largest score), ``1 <= k <= n``.
        beta: inverse temperature β = 1/τ > 0.

    Returns:
        ``(B, k, n)`` of the scores' dtype, row r = softmax_j(β ((n + 1 - 2r) s_j - (A_s 1)_j)) for
        r = 1..k; rows sum to 1. Computed in float32 (float64 for float64 scores).

    Raises:
        ValueError: if the shapes disagree or ``k`` is outside ``[1, n]``.
    """
    if scores.dim() != 2 or row_sums.shape != scores.shape:
        raise ValueError(f"scores and row_sums must both be (B, n), got {tuple(scores.shape)} and "
                         f"{tuple(row_sums.shape)}")
    if not 1 <= int(k) <= scores.shape[1]:
        raise ValueError(f"k must satisfy 1 <= k <= n = {scores.shape[1]}, got {k}")
    return _NeuralSortRows.apply(scores, row_sums, int(k), float(beta))


class NeuralSort(RankingOperator):
    """NeuralSort relaxed permutation, rows = ranks (rank 1 = largest), computing only the top rows.

    Args:
        beta: inverse temperature β = 1/τ (Grover et al.'s τ); > 0. Default 0.5, the config's value
            (``configs/operator/neuralsort.yaml``: the difftopk README's ImageNet heads).
            A 0-d tensor that requires grad is learnable (:attr:`learnable_beta`; autograd gives ∂/∂β, on the
            PyTorch path: the kernels take a fixed β).
        backend: ``"auto"`` (Triton kernels on CUDA inputs, PyTorch elsewhere), ``"torch"`` or ``"triton"``
            (see :mod:`diffrank.operators.backend`); both compute the same rows.

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``; each row sums to 1 (a softmax);
    columns sum to ≈ 1 only (Grover et al. 2019, §3: P̂ is unimodal row-stochastic). ``soft_rank`` / ``soft_sort``
    → ``(B, n)``, streamed over chunks of P̂'s rows on the PyTorch path (:mod:`diffrank.operators.streaming`): never
    refused by the memory check, whatever n (``forward`` still is, P itself being n x n).

    Second derivatives are exact on both paths (the kernels' backward is differentiable). Under ``torch.compile``
    the PyTorch path compiles with ``fullgraph=True``.

    Raises:
        ValueError: for beta <= 0, an unknown backend, or ``backend="triton"`` with a learnable β; see
            :class:`RankingOperator` for input errors.
    """

    permutation_equivariant = True
    learnable_beta = True
    hard_beta = 200.0
    paper = "Grover, Wang, Zweig, Ermon, ICLR 2019, Eq. 5 (row-stochastic, §3)"
    parameter = "τ = 1/β"

    def __init__(self, beta: float | Tensor = 0.5, backend: str = "auto") -> None:
        super().__init__(beta)
        self.backend = check_backend(backend)
        if self.backend == "triton" and isinstance(self.beta, Tensor):
            raise ValueError("the Triton kernels take a fixed beta; a learnable (tensor) beta needs backend='torch' "
                             "or 'auto' (which then runs PyTorch)")

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Top ``k`` (or all n) rows of P̂ (Grover et al. 2019, Eq. 5). Shapes as in the class docstring."""
        n = scores.shape[-1]
        r = n if k is None else k
        if not isinstance(self.beta, Tensor) and use_triton(self.backend, scores):
            return neuralsort_topk_rows(scores, abs_diff_row_sums(scores), r, self.beta)
        ranks = torch.arange(1, r + 1, device=scores.device, dtype=scores.dtype)
        scale = (n + 1 - 2 * ranks).view(1, r, 1)  # (1, r, 1)
        logits = scale * scores.unsqueeze(1) - abs_diff_row_sums(scores).unsqueeze(1)
        return torch.softmax(logits * self.beta, dim=-1)

    def _soft_rank(self, x: Tensor) -> Tensor:
        """Σ_r r · P̂[r, j] (Grover et al. 2019, Eq. 5), ``(B, n)``, streamed where :meth:`_streams`."""
        if not self._streams(x, "soft_rank"):
            return super()._soft_rank(x)
        return streamed_rows(x, abs_diff_row_sums(x), self.beta, "neuralsort", "rank")

    def _soft_sort(self, x: Tensor) -> Tensor:
        """P̂ s, descending (Grover et al. 2019, Eq. 5), ``(B, n)``, streamed where :meth:`_streams`."""
        if not self._streams(x, "soft_sort"):
            return super()._soft_sort(x)
        return streamed_rows(x, abs_diff_row_sums(x), self.beta, "neuralsort", "sort")

    def _forms_p(self) -> bool:
        """Whether soft_rank / soft_sort always form P: a subclass whose rows differ (the stochastic NeuralSort's
        perturbed samples, straight-through rows) builds them from its own ``_permutation``; ``backend="triton"``
        from the kernels' P."""
        return type(self)._permutation is not NeuralSort._permutation or self.backend == "triton"

    def _streams(self, x: Tensor, method: str) -> bool:
        """Whether this soft_rank / soft_sort call accumulates P̂'s rows in chunks: on the PyTorch path always; under
        ``backend="auto"`` on CUDA (the kernels) only where the dense P̂ would not fit in memory."""
        if self._forms_p():
            return False
        if isinstance(self.beta, Tensor) or not use_triton(self.backend, x):
            return True
        return not dense_fits(type(self).__name__, method, x)

    def _dense_rows(self, capability: str, n: int, k) -> int | None:
        """As the base's, but soft_rank / soft_sort form n rows of P̂ only where :meth:`_forms_p` (elsewhere they
        stream, or, under ``"auto"`` on CUDA, check the memory themselves)."""
        if capability in (SOFT_RANK, SOFT_SORT) and self._forms_p():
            return n
        return super()._dense_rows(capability, n, k)

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, backend={self.backend!r}"
