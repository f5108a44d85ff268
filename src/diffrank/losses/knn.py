"""The deep kNN loss: soft top-k mass that a query puts on templates of another label.

Grover et al. 2019 (§5.2) and Xie et al. 2020 (§4.1, App. C): queries and templates go through the same
feature network; the scores of a query are the negative Euclidean distances (not squared) to the templates,
the operator's top-k membership A (the soft k nearest) weights them, and the loss of a query is
L_q = Σ_j A_qj · 1[y_j ≠ y_q] = k − Σ_j A_qj · 1[y_j = y_q], averaged over the queries.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diffrank.operators.base import TOPK_MEMBERSHIP, require
from diffrank.operators.lapsum import LapSum
from diffrank.operators.neuralsort import NeuralSort
from diffrank.operators.softsort import SoftSort
from diffrank.operators.sorting_network import ComparatorNetwork

# operators whose output depends on the scores only through β·s, so that a learned scale of the scores is a
# learned β (LapSum trains α this way: Struski et al. 2025, §5.1)
_BETA_TIMES_SCORES = (LapSum, NeuralSort, SoftSort, ComparatorNetwork)



def pairwise_euclidean(a: Tensor, b: Tensor, squared: bool = False, eps: float = 1e-12) -> Tensor:
    """Euclidean distances between the rows of ``a`` and of ``b``.

    Args:
        a: ``(Q, D)`` float tensor. b: ``(T, D)``, same dtype and device.
        squared: return ‖a_i − b_j‖² instead of ‖a_i − b_j‖.
        eps: floor of the squared distance before the square root, so the gradient at coincident points
            is 0 instead of NaN.

    Returns:
        ``(Q, T)`` of the dtype of ``a``, ≥ 0.

    Raises:
        ValueError: not 2-D, or feature sizes that differ.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need (Q, D) and (T, D) features, got {tuple(a.shape)} and {tuple(b.shape)}")
    d2 = (a * a).sum(1, keepdim=True) + (b * b).sum(1) - 2 * (a @ b.T)
    d2 = d2.clamp_min(eps)
    return d2 if squared else d2.sqrt()


class NeighbourLoss(nn.Module):
    """Deep kNN loss (Xie et al. 2020, App. C; Grover et al. 2019, §5.2).

    Args:
        operator: a ranking operator with ``"topk_membership"``.
        k: neighbours (9 in the papers).
        learn_beta: learn β as ``operator.beta · exp(θ)`` (θ a scalar parameter, 0 at start; LapSum's
            trainable α). Only for operators whose output depends on β·scores.

    Call: ``loss(queries (Q, D), query_labels (Q,), templates (T, D), template_labels (T,))`` → scalar;
    features float, labels int64, T > k. The mean over queries of the membership mass on wrong labels,
    in ``[0, k]``.

    Raises:
        ValueError: an operator without top-k membership; ``learn_beta`` with an operator it does not fit;
            k < 1; (call) T ≤ k or mismatched shapes.
    """

    def __init__(self, operator: nn.Module, k: int = 9, learn_beta: bool = False) -> None:
        super().__init__()
        require(operator, TOPK_MEMBERSHIP, "NeighbourLoss")
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if learn_beta and not isinstance(operator, _BETA_TIMES_SCORES):
            raise ValueError(f"learn_beta needs an operator whose output depends on beta * scores "
                             f"({', '.join(c.__name__ for c in _BETA_TIMES_SCORES)}), got {type(operator).__name__}")
        self.operator, self.k = operator, int(k)
        self.log_scale = nn.Parameter(torch.zeros(())) if learn_beta else None

    @property
    def beta(self) -> Tensor | float:
        """The effective inverse temperature (a 0-d tensor when learned)."""
        return self.operator.beta if self.log_scale is None else self.operator.beta * self.log_scale.exp()

    def forward(self, queries: Tensor, query_labels: Tensor, templates: Tensor, template_labels: Tensor) -> Tensor:
        """Mean wrong-label membership mass of the queries."""
        if templates.shape[0] <= self.k:
            raise ValueError(f"need more than k = {self.k} templates, got {templates.shape[0]}")
        if query_labels.shape != queries.shape[:1] or template_labels.shape != templates.shape[:1]:
            raise ValueError("one label per query and per template is needed")
        scores = -pairwise_euclidean(queries, templates)
        if self.log_scale is not None:
            scores = scores * self.log_scale.exp()
        membership = self.operator.topk_membership(scores, [self.k])[:, 0]  # (Q, T), rows sum to k
        wrong = query_labels.unsqueeze(1) != template_labels.unsqueeze(0)
        return (membership * wrong).sum(1).mean()
