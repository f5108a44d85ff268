"""SoftSort (Prillo & Eisenschlos, ICML 2020), top rows only.

P[r, j] = softmax_j(-|s̃_r - s_j| / τ) with s̃ the scores sorted in descending order
(Prillo & Eisenschlos 2020, Eq. 3 with d = |·|; Petersen et al. 2022 §2.3). τ = 1/β.
Only the k rows asked for are formed: the top-k values come from ``torch.topk`` (O(n log k)),
so time and memory are O(B · k · n) rather than difftopk's O(B · n²).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.base import RankingOperator


class SoftSort(RankingOperator):
    """SoftSort relaxed permutation, rows = ranks (rank 1 = largest).

    Args:
        beta: inverse temperature β = 1/τ; > 0.
        power: exponent of the distance |s̃_r - s_j| (Prillo & Eisenschlos use 1; difftopk's ``pow``).
        use_triton: fused Triton kernels (``kernels/softsort.py``) for the top-k rows: ``None`` = on CUDA
            inputs with power 1, ``True`` = always (CPU needs ``TRITON_INTERPRET=1``), ``False`` = never.

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``; rows sum to 1, columns ≈ 1.

    Raises:
        ValueError: for beta <= 0 or power <= 0; see :class:`RankingOperator` for input errors.
    """

    permutation_equivariant = True
    hard_beta = 100.0

    def __init__(self, beta: float = 1.0, power: float = 1.0, use_triton: bool | None = None) -> None:
        super().__init__(beta)
        if not power > 0:
            raise ValueError(f"power must be > 0, got {power}")
        self.power = float(power)
        if use_triton and self.power != 1.0:
            raise ValueError("the Triton kernel implements power = 1 only")
        self.use_triton = use_triton

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Top ``k`` (or all n) rows of the SoftSort matrix (Prillo & Eisenschlos 2020, Eq. 3)."""
        r = scores.shape[-1] if k is None else k
        if self.use_triton or (self.use_triton is None and scores.is_cuda and self.power == 1.0):
            from diffrank.kernels.softsort import softsort_topk_rows

            return softsort_topk_rows(scores, r, self.beta)
        top = scores.topk(r, dim=-1, sorted=True).values  # (B, r), descending
        dist = (top.unsqueeze(-1) - scores.unsqueeze(1)).abs()
        if self.power != 1.0:
            dist = dist.pow(self.power)
        return torch.softmax(-self.beta * dist, dim=-1)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, power={self.power}"
