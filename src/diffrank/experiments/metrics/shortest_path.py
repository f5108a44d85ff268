"""Shortest-path metrics for the Warcraft task (Petersen's thesis §2.4 "perfect matches"; Vlastelica et al.,
ICLR 2020, §5.1, and their cost ratio).

Both metrics take *hard* predicted paths: the exact Dijkstra path of the predicted cost map
(:func:`predicted_paths`; the model computes it once per batch and feeds both metrics).

- :class:`PathExactMatch`: 1 if the predicted path equals the label on all k² cells, else 0, averaged over
  maps; a fraction in [0, 1] like every diffrank accuracy (the report shows it in %). When the label has
  several optimal paths, another optimal path counts as a miss (as in the thesis).
- :class:`CostRatio`: ``Σ c_true·ŷ / Σ c_true·y`` per map (≥ 1 for a valid path when y is optimal), mean
  over maps.

Counts are accumulated with ``dist_reduce_fx="sum"`` (synchronised under DDP).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from diffrank.experiments.algorithms.dijkstra import shortest_paths
from diffrank.experiments.metrics.sorting import FractionMetric


def predicted_paths(costs: Tensor) -> Tensor:
    """Hard predicted paths: exact Dijkstra on ``|costs|`` (``(B, k, k)`` float -> ``(B, k, k)`` 0/1, same dtype).

    The absolute value makes any network output a valid cost map (a no-op for non-negative outputs), as the
    blackbox reference code does.

    Raises:
        ValueError: bad shape or non-finite costs.
    """
    return shortest_paths(costs.detach().abs())


def _check_paths(pred: Tensor, target: Tensor) -> None:
    if pred.dim() != 3 or tuple(pred.shape) != tuple(target.shape) or pred.shape[1] != pred.shape[2]:
        raise ValueError(f"pred and target must both be (B, k, k), got {tuple(pred.shape)} and {tuple(target.shape)}")


class PathExactMatch(FractionMetric):
    """Fraction of maps whose predicted path equals the label on all cells (thesis §2.4, Table 2.2 "EM").

    ``update(pred (B, k, k) 0/1, target (B, k, k) 0/1)``; ``compute()`` -> scalar float32 in [0, 1] (0 before
    any update).

    Raises:
        ValueError: (update) shapes differ or are not ``(B, k, k)``.
    """

    def update(self, pred: Tensor, target: Tensor) -> None:
        """Count the maps whose 0/1 path ``pred`` (rounded) equals ``target`` everywhere."""
        _check_paths(pred, target)
        same = (pred.round() == target.round()).flatten(1).all(1)
        self.correct += same.sum().to(torch.float64)
        self.total += same.numel()


class CostRatio(Metric):
    """Mean over maps of ``Σ c_true·ŷ / Σ c_true·y``: true cost of the predicted path over that of the label
    (Vlastelica et al., ICLR 2020; 1 = optimal).

    ``update(pred (B, k, k) 0/1, target (B, k, k) 0/1, true_costs (B, k, k) > 0)``; ``compute()`` -> scalar
    float64 (0 before any update).

    Raises:
        ValueError: (update) shapes differ, or a label path of true cost <= 0 (the ratio is undefined).
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("ratio_sum", default=torch.tensor(0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor, true_costs: Tensor) -> None:
        """Add the per-map cost ratios of a batch."""
        _check_paths(pred, target)
        if tuple(true_costs.shape) != tuple(target.shape):
            raise ValueError(f"true_costs {tuple(true_costs.shape)} must have the paths' shape {tuple(target.shape)}")
        c = true_costs.to(torch.float64)
        label = (c * target.to(torch.float64)).flatten(1).sum(1)
        if bool((label <= 0).any()):
            raise ValueError("a label path has true cost <= 0: the cost ratio is undefined")
        ours = (c * pred.to(torch.float64)).flatten(1).sum(1)
        self.ratio_sum += (ours / label).sum()
        self.total += label.numel()

    def compute(self) -> Tensor:
        """Mean cost ratio over the maps seen."""
        return self.ratio_sum / self.total.clamp_min(1.0)


__all__ = ["CostRatio", "PathExactMatch", "predicted_paths"]
