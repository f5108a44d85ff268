"""Ranking-supervision metrics (thesis §3.5 "Evaluation Metrics"; official ``diffsort`` ``ranking_accuracy``).

For one set with true values v and scores s, let a = argsort(v) and â = argsort(s) (ascending):

- EM (exact match): 1 if â = a everywhere, else 0;
- EW (element-wise): (1/n)·#{j : â[j] = a[j]}, the fraction of sorted positions holding the right item;
- EM5: EM on sets of 5 (the caller passes 5-sets).

Ties: values are compared through a *stable* ascending argsort on both sides, so tied true values are
ordered by item index and a prediction is right only if it orders them the same way (the reference
code's ``torch.argsort`` leaves this arbitrary; for four-digit numbers ties have probability ≈ n²/2·10⁻⁴).
Scores that tie are ordered by item index too.

All metrics accumulate counts with ``dist_reduce_fx="sum"`` so they synchronise under DDP, and
:meth:`compute` returns a fraction in [0, 1].
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


def _check(scores: Tensor, values: Tensor) -> None:
    b_n = tuple(values.shape)
    if values.dim() != 2 or tuple(scores.shape) not in (b_n, (*b_n, b_n[-1])):
        raise ValueError(f"scores must be (B, n) or (B, n, n) and values (B, n), got {tuple(scores.shape)} and "
                         f"{tuple(values.shape)}")
    if scores.is_floating_point() and not bool(torch.isfinite(scores).all()):
        raise ValueError("scores contain non-finite values (NaN or inf)")


def correct_positions(scores: Tensor, values: Tensor) -> Tensor:
    """Which sorted positions hold the right item: ``argsort(scores) == argsort(values)`` (both stable).

    Args:
        scores: ``(B, n)`` predicted scores (any real dtype), or ``(B, n, n)`` rank-by-item logits or
            probabilities (row r = rank r + 1, rank 1 = largest; the vanilla row-stochastic net,
            :class:`diffrank.experiments.models.sorting.RowStochasticNet`): the predicted item of rank r is the
            argmax of row r (Grover et al. 2019's ``prop_correct``; the rows need not form a permutation).
        values: ``(B, n)`` true values (int or float).

    Returns:
        ``(B, n)`` bool, by ascending sorted position.

    Raises:
        ValueError: shape mismatch, not 2-D values, or non-finite scores.
    """
    _check(scores, values)
    truth = torch.argsort(values, dim=1, stable=True)
    if scores.dim() == 3:
        # row r predicts the item of descending rank r, i.e. of ascending position n-1-r
        return scores.argmax(dim=2).flip(1) == truth
    return torch.argsort(scores, dim=1, stable=True) == truth


class FractionMetric(Metric):
    """Base of the count metrics: ``correct`` / ``total`` summed over updates (and DDP ranks); subclasses
    implement ``update``. ``compute()`` -> float32 scalar in [0, 1], 0 before any update."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.tensor(0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.float64), dist_reduce_fx="sum")

    def compute(self) -> Tensor:
        """Fraction correct in [0, 1] (NaN-free: 0 when nothing was seen)."""
        return (self.correct / self.total.clamp_min(1)).float()


class ExactMatch(FractionMetric):
    """EM: fraction of sets whose predicted order equals the true order.

    ``update(scores (B, n) or (B, n, n), values (B, n))`` (:func:`correct_positions`). EM5 is this metric fed
    with 5-sets.
    """

    def update(self, scores: Tensor, values: Tensor) -> None:
        """Accumulate a batch of sets."""
        ok = correct_positions(scores, values)
        self.correct += ok.all(dim=1).sum()
        self.total += ok.shape[0]


class ElementWiseAccuracy(FractionMetric):
    """EW: fraction of (set, sorted position) pairs holding the right item, i.e. the mean over sets of
    (1/n)·#correct positions (all sets of one run have the same n).

    ``update(scores (B, n) or (B, n, n), values (B, n))`` (:func:`correct_positions`).
    """

    def update(self, scores: Tensor, values: Tensor) -> None:
        """Accumulate a batch of sets."""
        ok = correct_positions(scores, values)
        self.correct += ok.sum()
        self.total += ok.numel()
