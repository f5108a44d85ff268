"""DFTopK (Zhu et al. 2025, arXiv 2510.11472): the O(n) threshold soft top-k.

Each item's membership is a sigmoid of its distance to one threshold,

    m_i = σ(β (x_i - t)),   t = (x_(k) + x_(k+1)) / 2,   τ = 1/β,

with x_(k) the k-th largest score: the midpoint between the k-th and the (k+1)-th largest values, found
by ``torch.topk`` (O(n) selection, no full sort). The reference snippet of the paper (TensorFlow,
``tf.nn.top_k`` values, no stop-gradient) lets the gradient flow through t into the two scores that
define it; ``detach_threshold=True`` treats t as a constant instead. For k = n there is no (k+1)-th
value: t = -∞ and every membership is 1 (the hard result).

Unlike the projection-based operators, Σ_i m_i is not k (it tends to k as β·gap grows): the operator
declares ``sums_to_k = False`` and the contract tests check [0, 1] and the hard limit instead. The
memberships are in (0, 1); a sigmoid saturates to exact 0 / 1 in floating point only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.base import TOPK_MEMBERSHIP, RankingOperator, beta_repr


class DFTopK(RankingOperator):
    """Threshold soft top-k of DFTopK (Zhu et al. 2025): σ(β (x - t)) with t the midpoint of the k-th and the
    (k+1)-th largest scores.

    ``topk_membership(scores (B, n), ks)`` → ``(B, len(ks), n)`` in (0, 1) (exactly 1 for k = n), computed
    in the compute dtype (float32 for half inputs, cast back). O(n + k log k) per row (``torch.topk``).

    Args:
        beta: inverse temperature β = 1/τ > 0; a 0-d tensor that requires grad is learnable (``learnable_beta``).
        detach_threshold: if True, no gradient flows through t (default False, as the paper's snippet).

    Raises:
        ValueError: on a non-positive or non-finite β.
    """

    capabilities = frozenset({TOPK_MEMBERSHIP})
    permutation_equivariant = True
    sums_to_k = False
    learnable_beta = True  # σ(β (x - t)): autograd gives ∂/∂β
    hard_beta = 50.0  # σ(-50 × 0.225) < 2e-5: the contract's scores keep >= 0.225 from the midpoint
    low_memory = True  # no (B, m, n) buffer but for the permutation (diffrank.operators.memory)
    paper = "Zhu et al. 2025, arXiv 2510.11472 (σ(β(x − t)), t = midpoint of the k-th and (k+1)-th largest)"
    parameter = "τ = 1/β"

    def __init__(self, beta: float | Tensor = 10.0, detach_threshold: bool = False) -> None:
        super().__init__(beta)
        self.detach_threshold = bool(detach_threshold)

    def _topk_membership(self, x: Tensor, ks: list[int]) -> Tensor:
        """``(B, len(ks), n)``: σ(β (x - t_k)) for each k (one ``topk`` of max(ks) + 1 values)."""
        n = x.shape[-1]
        kmax = max(ks)
        top = torch.topk(x, min(kmax + 1, n), dim=-1, sorted=True).values
        if self.detach_threshold:
            top = top.detach()
        outs = []
        for k in ks:
            if k == n:
                outs.append(torch.ones_like(x) + 0 * x)  # t = -inf: hard 1, zero gradient, still on the graph
                continue
            t = (top[:, k - 1: k] + top[:, k: k + 1]) / 2
            # β (x - t) as β x - β t would cancel; the difference first keeps the small distances exact
            outs.append(torch.sigmoid((x - t) * self.beta))
        return torch.stack(outs, dim=1)

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, detach_threshold={self.detach_threshold}"
