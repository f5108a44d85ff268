"""SoftSort (Prillo & Eisenschlos, ICML 2020), top rows only.

P[r, j] = softmax_j(-|s̃_r - s_j| / τ) with s̃ the scores sorted in descending order
(Prillo & Eisenschlos 2020, Eq. 3 with d = |·|; Petersen et al. 2022 §2.3). τ = 1/β.
Only the k rows asked for are formed: the top-k values come from ``torch.topk`` (O(n log k)),
so time and memory are O(B · k · n) rather than difftopk's O(B · n²). With ``backend`` ``"triton"`` (or
``"auto"`` on CUDA) and power 1 the rows come from fused kernels (``src/diffrank/kernels/softsort.py``) that never store
the logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import RankingOperator, beta_repr


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

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``; rows sum to 1, columns ≈ 1.

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
            from diffrank.kernels.softsort import softsort_topk_rows

            return softsort_topk_rows(scores, r, self.beta)
        top = scores.topk(r, dim=-1, sorted=True).values  # (B, r), descending
        dist = (top.unsqueeze(-1) - scores.unsqueeze(1)).abs()
        if self.power != 1.0:
            dist = dist.pow(self.power)
        return torch.softmax(-self.beta * dist, dim=-1)

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, power={self.power}, backend={self.backend!r}"
