"""Top-K recommendation metrics over full rankings (RecBole's ``Recall@k`` and ``NDCG@k``, Zhao et al., CIKM 2021),
averaged over users, from :func:`diffrank.metrics.recall_at_k` and :func:`diffrank.metrics.ndcg` (``gain="linear"``:
binary relevance, so 1 per relevant item, as RecBole's NDCG).

Each user's list is every item it may be recommended: ``candidates`` is False on the items it is known to like
(its training positives; for test also its validation positives), which the metrics ignore entirely, as RecBole's
full-sort evaluation sets their scores to −∞. A user with no relevant candidate is not counted (RecBole evaluates the
users of the split). Sums and counts are reduced with ``dist_reduce_fx="sum"`` (DDP).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from diffrank.metrics import ndcg, recall_at_k

NAMES = ("recall", "ndcg")


class MeanListMetric(Metric):
    """The mean over users of Recall@k or NDCG@k.

    ``update(scores (B, n) float, targets (B, n) float 0/1 (or graded >= 0), candidates (B, n) bool)``: scores of
    every item; the user's relevant items of the split; False where an item is left out of the ranking (a known
    positive). ``compute()`` -> float32 scalar in [0, 1], 0 before any update.

    Args:
        name: ``"recall"`` or ``"ndcg"``.
        k: the cut-off (an integer >= 1).

    Raises:
        ValueError: an unknown ``name`` or k < 1; (``update``) shapes that differ.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, name: str, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        if name not in NAMES or int(k) < 1:
            raise ValueError(f"name must be one of {NAMES} and k >= 1, got {name!r} and {k}")
        self.name, self.k = name, int(k)
        self.add_state("total", default=torch.tensor(0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Tensor, targets: Tensor, candidates: Tensor) -> None:
        """Add the users of a batch (those with a relevant candidate)."""
        if not scores.shape == targets.shape == candidates.shape:
            raise ValueError(f"scores, targets and candidates must share one shape, got {tuple(scores.shape)}, "
                             f"{tuple(targets.shape)} and {tuple(candidates.shape)}")
        scores = scores.detach().float()
        if self.name == "recall":
            values = recall_at_k(scores, targets, self.k, mask=candidates)
        else:
            values = ndcg(scores, targets, self.k, mask=candidates, gain="linear")
        counted = ((targets > 0) & candidates).any(-1)
        self.total += values[counted].double().sum()
        self.count += counted.sum()

    def compute(self) -> Tensor:
        """The mean over the counted users, in [0, 1] (0 when none was seen)."""
        return (self.total / self.count.clamp_min(1)).float()
