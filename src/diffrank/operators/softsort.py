"""SoftSort (Prillo & Eisenschlos, ICML 2020), top rows only.

P[r, j] = softmax_j(-|s̃_r - s_j| / τ) with s̃ the scores sorted in descending order
(Prillo & Eisenschlos 2020, Eq. 3 with d = |·|; Petersen et al. 2022 §2.3). τ = 1/β.
Only the k rows asked for are formed: the top-k values come from ``torch.topk`` (O(n log k)),
so time and memory are O(B · k · n) rather than difftopk's O(B · n²). ``soft_rank`` and ``soft_sort`` form no P at
all on the PyTorch path: they accumulate its rows in chunks and recompute them in the backward pass
(:mod:`diffrank.operators.streaming`; O(B · n) saved, a peak of a few chunks of ~64 MiB). With ``backend``
``"triton"`` (or ``"auto"`` on CUDA) and power 1 the rows of ``forward`` / ``topk_membership`` (and of ``soft_rank`` /
``soft_sort`` while P fits in memory, always with ``"triton"``) come from fused kernels
(``src/diffrank/kernels/softsort.py``) that never store the logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import SOFT_RANK, SOFT_SORT, RankingOperator, beta_repr, fold_vmapped
from diffrank.operators.streaming import dense_fits, streamed_rows


class _SoftSortRows(torch.autograd.Function):
    """The top k rows of SoftSort through the Triton launches :func:`diffrank.kernels.softsort.rows_forward` and
    :func:`~diffrank.kernels.softsort.rows_backward`; a recorded backward computes the same formulas in PyTorch
    operations on the saved P (exact second derivatives); vmap folds into the batch."""

    twice_differentiable = True  # the recorded backward is PyTorch operations (read by diffrank.losses.newton)

    @staticmethod
    def forward(scores: Tensor, top: Tensor, beta: float) -> Tensor:
        from diffrank.kernels.softsort import rows_forward

        return rows_forward(scores, top, beta)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        scores, top, ctx.beta = inputs
        ctx.save_for_backward(scores, top, output)

    @staticmethod
    def vmap(info, in_dims, scores, top, beta):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        size = info.batch_size
        p = _SoftSortRows.apply(fold_vmapped(scores, in_dims[0], size), fold_vmapped(top, in_dims[1], size), beta)
        return p.unflatten(0, (size, -1)), 0

    @staticmethod
    def backward(ctx, grad: Tensor):
        s, t, p = ctx.saved_tensors
        if torch.is_grad_enabled():  # a recorded backward: the same formulas in differentiable operations
            dlogit = p * (grad - (p * grad).sum(-1, keepdim=True))
            sign = torch.sign(s.unsqueeze(1) - t.unsqueeze(-1)).detach()  # (B, k, n); its derivative is 0
            return ((sign * dlogit).sum(1) * -ctx.beta).to(s.dtype), ((sign * dlogit).sum(-1) * ctx.beta).to(t.dtype), \
                None
        from diffrank.kernels.softsort import rows_backward

        ds, dt = rows_backward(s, t, p, grad, ctx.beta)
        return ds.to(s.dtype), dt.to(t.dtype), None


def softsort_topk_rows(scores: Tensor, k: int, beta: float) -> Tensor:
    """Top ``k`` rows of the SoftSort matrix with the fused Triton kernels of
    :mod:`diffrank.kernels.softsort` (Prillo & Eisenschlos 2020, Eq. 3).

    Args:
        scores: ``(B, n)`` float16 / bfloat16 / float32 / float64 on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``); validated by the caller (finite, ``n >= 1``).
        k: number of rows (ranks 1..k, rank 1 = largest score), ``1 <= k <= n``.
        beta: inverse temperature β = 1/τ > 0.

    Returns:
        ``(B, k, n)`` of the scores' dtype, P[r, j] = softmax_j(-β |t_r - s_j|) with t_r the r-th largest
        score; rows sum to 1. Computed in float32 (float64 for float64 scores).

    Raises:
        ValueError: if ``scores`` is not 2-D or ``k`` is outside ``[1, n]``.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (B, n), got {tuple(scores.shape)}")
    if not 1 <= int(k) <= scores.shape[1]:
        raise ValueError(f"k must satisfy 1 <= k <= n = {scores.shape[1]}, got {k}")
    top = scores.topk(int(k), dim=-1, sorted=True).values
    return _SoftSortRows.apply(scores, top, float(beta))


class SoftSort(RankingOperator):
    """SoftSort relaxed permutation, rows = ranks (rank 1 = largest).

    Args:
        beta: inverse temperature β = 1/τ; > 0. Default 0.5, the config's value (``configs/operator/softsort.yaml``:
            the difftopk README's ImageNet heads).
            A 0-d tensor that requires grad is learnable (:attr:`learnable_beta`; autograd gives ∂/∂β, on the
            PyTorch path: the kernels take a fixed β).
        power: exponent of the distance |s̃_r - s_j| (Prillo & Eisenschlos use 1; difftopk's ``pow``).
        backend: ``"auto"`` (the fused Triton kernels of ``src/diffrank/kernels/softsort.py`` on CUDA inputs when
            ``power == 1``, PyTorch otherwise), ``"torch"`` or ``"triton"`` (always the kernels; see
            :mod:`diffrank.operators.backend`). Both compute the same rows.

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``; rows sum to 1, columns ≈ 1. ``soft_rank`` /
    ``soft_sort`` → ``(B, n)``, streamed over chunks of P's rows on the PyTorch path
    (:mod:`diffrank.operators.streaming`): never refused by the memory check, whatever n (``forward`` still is).
    Their gradient is 0, not NaN, through the entry where s̃_r is s_j itself for ``power < 1`` (that distance is
    identically 0), where the dense P's autograd gives NaN (``d^(p-1)`` at 0).

    Second derivatives are exact on both paths (the kernels' backward is differentiable). Under ``torch.compile``
    the PyTorch path compiles with ``fullgraph=True``.

    Raises:
        ValueError: for beta <= 0, power <= 0, an unknown backend, or ``backend="triton"`` with
            ``power != 1`` (the kernels implement |·| only) or a learnable β; see :class:`RankingOperator` for
            input errors.
    """

    permutation_equivariant = True
    learnable_beta = True
    hard_beta = 100.0
    paper = "Prillo & Eisenschlos, ICML 2020, Eq. 3 (row-stochastic)"
    parameter = "τ = 1/β"

    def __init__(self, beta: float | Tensor = 0.5, power: float = 1.0, backend: str = "auto") -> None:
        super().__init__(beta)
        self.backend = check_backend(backend)
        if self.backend == "triton" and isinstance(self.beta, Tensor):
            raise ValueError("the Triton kernels take a fixed beta; a learnable (tensor) beta needs backend='torch' "
                             "or 'auto' (which then runs PyTorch)")
        if not power > 0:
            raise ValueError(f"power must be > 0, got {power}")
        self.power = float(power)
        if self.backend == "triton" and self.power != 1.0:
            raise ValueError(f"the Triton kernel implements power = 1 only, got power = {self.power}; "
                             "use backend='torch' or 'auto'")

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Top ``k`` (or all n) rows of the SoftSort matrix (Prillo & Eisenschlos 2020, Eq. 3)."""
        r = scores.shape[-1] if k is None else k
        if self.power == 1.0 and not isinstance(self.beta, Tensor) and use_triton(self.backend, scores):
            return softsort_topk_rows(scores, r, self.beta)
        top = scores.topk(r, dim=-1, sorted=True).values  # (B, r), descending
        dist = (top.unsqueeze(-1) - scores.unsqueeze(1)).abs()
        if self.power != 1.0:
            dist = dist.pow(self.power)
        return torch.softmax(-self.beta * dist, dim=-1)

    def _soft_rank(self, x: Tensor) -> Tensor:
        """Σ_r r · P[r, j] (Prillo & Eisenschlos 2020, Eq. 3), ``(B, n)``, streamed where :meth:`_streams`."""
        if not self._streams(x, "soft_rank"):
            return super()._soft_rank(x)
        return streamed_rows(x, self._sorted(x), self.beta, "softsort", "rank", self.power)

    def _soft_sort(self, x: Tensor) -> Tensor:
        """P s, descending (Prillo & Eisenschlos 2020, Eq. 3), ``(B, n)``, streamed where :meth:`_streams`."""
        if not self._streams(x, "soft_sort"):
            return super()._soft_sort(x)
        return streamed_rows(x, self._sorted(x), self.beta, "softsort", "sort", self.power)

    @staticmethod
    def _sorted(x: Tensor) -> Tensor:
        """s̃, the scores in descending order, as ``_permutation`` takes them (the same call: the same gradient
        routing between tied scores)."""
        return x.topk(x.shape[-1], dim=-1, sorted=True).values

    def _forms_p(self) -> bool:
        """Whether soft_rank / soft_sort always form P: a subclass whose rows differ builds them from its own
        ``_permutation``; ``backend="triton"`` from the kernels' P."""
        return type(self)._permutation is not SoftSort._permutation or self.backend == "triton"

    def _streams(self, x: Tensor, method: str) -> bool:
        """Whether this soft_rank / soft_sort call accumulates P's rows in chunks: on the PyTorch path always; where
        the kernels apply (``"auto"`` on CUDA, power 1, a fixed β) only if the dense P would not fit in memory."""
        if self._forms_p():
            return False
        if self.power != 1.0 or isinstance(self.beta, Tensor) or not use_triton(self.backend, x):
            return True
        return not dense_fits(type(self).__name__, method, x)

    def _dense_rows(self, capability: str, n: int, k) -> int | None:
        """As the base's, but soft_rank / soft_sort form n rows of P only where :meth:`_forms_p` (elsewhere they
        stream, or, under ``"auto"`` on CUDA, check the memory themselves)."""
        if capability in (SOFT_RANK, SOFT_SORT) and self._forms_p():
            return n
        return super()._dense_rows(capability, n, k)

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, power={self.power}, backend={self.backend!r}"
