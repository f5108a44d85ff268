"""Ranking-supervision losses: a relaxed permutation (or soft ranks) against the true order of the values.

Project convention: the ground-truth permutation Q has ``Q[r, c] = 1`` iff item c holds the (r+1)-th
LARGEST value (row 0 = rank 1), the same layout as the operators' P (rows = ranks, columns = items).
Ties among true values are broken by item index (stable sort), as in :mod:`diffrank.experiments.metrics.sorting`.

- :class:`SortingBCELoss` (``loss=sort_bce``): element-wise binary cross-entropy between P and Q
  averaged over the B·n·n entries (official ``diffsort`` script, PyTorch ``BCELoss``, which clamps
  log at -100), or the column-wise cross-entropy of thesis Eq. 3.12, ``-(1/n) Σ_c log P[π(c), c]``
  (``form="ce"``; with ``"ce_rows"`` the row-wise form of LapSum's permutation loss, ``-(1/n) Σ_r log
  P[r, π⁻¹(r)]``).
- :class:`RowSoftmaxCELoss` (``loss=sort_rows_ce``): no operator: n × n logits predicted by the network itself,
  a softmax over each row and the row-wise cross-entropy against Q (the vanilla row-stochastic baseline of
  Grover et al. 2019, §6.1).
- :class:`BubbleSwapLoss` (``loss=sort_swaps``): the relaxed number of swaps the relaxed bubble sort makes on
  the scores listed in their true order (thesis §2.3, Table 2.1): 0 exactly when the scores are sorted.
- :class:`SoftRankMSELoss` (``loss=sort_rank_mse``): mean squared error between soft ranks and the true
  ranks (1 = largest), for operators that give no P (Fast Sort & Rank; thesis §3.5 "Training Settings").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffrank.losses.validation import call_operator
from diffrank.operators.base import PERMUTATION, SOFT_RANK, Check, check_scores_shape, require

_LOG_CLAMP = -100.0  # PyTorch BCELoss's floor on log, so that a hard 0 costs 100, not inf


def _check_values(scores: Tensor, values: Tensor) -> list[Check]:
    """The data-free checks of a batch (raised now) and the pending data-dependent one (finite float values).

    The scores' finiteness is not checked here: the operator checks its input in its own (single) read,
    and :func:`call_operator` adds these pending checks to that read.
    """
    check_scores_shape(scores)
    if values.shape != scores.shape:
        raise ValueError(f"values must have the shape of scores {tuple(scores.shape)}, got {tuple(values.shape)}")
    if values.is_floating_point():
        return [(torch.isfinite(values).all(), ValueError("values contain non-finite entries (NaN or inf)"))]
    return []


def _full_precision(scores: Tensor) -> Tensor:
    """float16 / bfloat16 scores in float32: under mixed precision (trainer=gpu) P and its logs would
    otherwise be rounded to 8 bits of mantissa; the caller also leaves autocast for the same reason."""
    return scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores


def true_order(values: Tensor) -> Tensor:
    """Items by decreasing value: ``order[b, r]`` = the item of rank r+1 (ties by item index).

    Args:
        values: ``(B, n)`` true values (int or float).

    Returns:
        ``(B, n)`` int64.
    """
    n = values.shape[1]
    # stable ascending sort then reverse would break ties by DEcreasing index; flip first to keep increasing
    asc = torch.argsort(values.flip(1), dim=1, stable=True)
    return (n - 1 - asc).flip(1)


def true_ranks(values: Tensor) -> Tensor:
    """Rank of each item, 1 = largest (ties by item index): ``(B, n)`` int64."""
    order = true_order(values)
    ranks = torch.empty_like(order)
    ar = torch.arange(1, values.shape[1] + 1, device=values.device).expand_as(order)
    return ranks.scatter_(1, order, ar)


def permutation_matrix(values: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Ground-truth Q ``(B, n, n)``: ``Q[b, r, c] = 1`` iff item c has rank r+1 (rank 1 = largest)."""
    n = values.shape[1]
    # a comparison, not F.one_hot: one_hot range-checks its indices, a host read on some devices / versions
    return (true_order(values).unsqueeze(-1) == torch.arange(n, device=values.device)).to(dtype)


class SortingBCELoss(nn.Module):
    """Cross-entropy between the operator's relaxed permutation P and the true permutation Q.

    Args:
        operator: a ranking operator providing ``"permutation"`` (full ``(B, n, n)`` P).
        form: ``"bce"`` (default; official diffsort script: mean over B·n·n of
            ``-[Q log P + (1-Q) log(1-P)]``), ``"ce"`` (thesis Eq. 3.12, columns: ``-(1/n) Σ_c log P[π(c), c]``),
            or ``"ce_rows"`` (LapSum's permutation CE, rows: ``-(1/n) Σ_r log P[r, item of rank r]``);
            the CE forms are averaged over the batch too.

    ``forward(scores (B, n) float, values (B, n)) -> scalar``. A stochastic operator with ``samples`` S > 1 gives P
    of shape ``(S, B, n, n)`` (:mod:`diffrank.operators.gumbel`): the loss is then the mean over the samples too.
    P is clamped to [0, 1] before the logs (sums of float rounding can leave it a hair outside) and logs are floored
    at -100 like ``BCELoss`` (and at log of the dtype's smallest normal number, -87.3 in float32, so that gradients
    stay finite).

    Raises:
        ValueError: an operator without ``"permutation"`` (message lists what it provides), an unknown
            ``form``, or bad scores / values (shape mismatch, non-finite).
    """

    def __init__(self, operator: nn.Module, form: str = "bce") -> None:
        super().__init__()
        require(operator, PERMUTATION, f"{type(self).__name__} (loss=sort_bce)")
        if form not in ("bce", "ce", "ce_rows"):
            raise ValueError(f"form must be 'bce', 'ce' or 'ce_rows', got {form!r}")
        self.operator, self.form = operator, form

    def forward(self, scores: Tensor, values: Tensor) -> Tensor:
        """Scalar loss (dtype of ``scores``, float32 for half-precision scores); one host synchronisation (the
        operator's check of its input)."""
        checks = _check_values(scores, values)
        scores = _full_precision(scores)
        with torch.autocast(device_type=scores.device.type, enabled=False):
            p = call_operator(self.operator, scores, checks=checks).clamp(0.0, 1.0)
        q = permutation_matrix(values, p.dtype)
        # clamp before the log: log(0) = -inf would give 0 · inf = NaN gradients even where the floor applies
        tiny = torch.finfo(p.dtype).tiny
        log_p = torch.log(p.clamp_min(tiny)).clamp_min(_LOG_CLAMP)
        if self.form == "bce":
            log_1mp = torch.log((1 - p).clamp_min(tiny)).clamp_min(_LOG_CLAMP)
            return -(q * log_p + (1 - q) * log_1mp).mean()
        # (B, n) per column / per row; negative dims so that a P with a leading samples dimension (S, B, n, n) of a
        # stochastic operator broadcasts against Q and the mean runs over the samples too
        picked = (q * log_p).sum(dim=-2 if self.form == "ce" else -1)
        return -picked.mean()


class RowSoftmaxCELoss(nn.Module):
    """Row-wise cross-entropy of row-softmaxed logits against the true permutation: ``-(1/n) Σ_r log
    softmax(L[r])[item of rank r + 1]``, averaged over the batch.

    Grover et al. (ICLR 2019), §6.1, the vanilla row-stochastic (RS) baseline (their ``run_sort.py``:
    ``softmax_cross_entropy_with_logits`` over the last axis, mean over rows and sets); quoted by LapSum (ICML
    2025) Table 4. Rows are ranks (row 0 = the largest value), columns items, as Q
    (:func:`permutation_matrix`). No ranking operator: the network outputs the logits
    (:class:`diffrank.experiments.models.sorting.RowStochasticNet`).

    ``forward(logits (B, n, n) float, values (B, n)) -> scalar`` (dtype of ``logits``; float32 for half precision).
    Computed by ``log_softmax``, so finite for any finite logits.

    Raises:
        ValueError: logits not ``(B, n, n)`` with ``values`` ``(B, n)``, or non-finite logits / values.
    """

    def forward(self, logits: Tensor, values: Tensor) -> Tensor:
        """Scalar loss; one host synchronisation (the finiteness check)."""
        if logits.dim() != 3 or values.dim() != 2 or tuple(logits.shape) != (*values.shape, values.shape[1]):
            raise ValueError(f"logits must be (B, n, n) and values (B, n), got {tuple(logits.shape)} and "
                             f"{tuple(values.shape)}")
        ok = torch.isfinite(logits).all()
        if values.is_floating_point():
            ok = ok & torch.isfinite(values).all()
        if not bool(ok):
            raise ValueError("logits or values contain non-finite entries (NaN or inf)")
        logits = _full_precision(logits)
        n = values.shape[1]
        return F.cross_entropy(logits.reshape(-1, n), true_order(values).reshape(-1))


class BubbleSwapLoss(nn.Module):
    """Relaxed swap count of the relaxed bubble sort on the scores in their true ascending order.

    Petersen, PhD thesis 2022, §2.3 (Table 2.1): the scores of a set, listed from the smallest true value to the
    largest, are fed to the relaxed bubble sort; every swap it makes is an inversion of the predicted order,
    so its relaxed (expected) swap count is a differentiable Kendall-τ-like distance that is 0 exactly when
    the prediction is sorted. This is the official AlgoVision sorting script's default (``loss_sum``); the
    thesis text also describes the product form ``1 - Π(1 - p)`` (the probability that any swap happens),
    which is not implemented.

    Args:
        operator: a :class:`~diffrank.operators.relaxed_bubble_sort.RelaxedBubbleSort` (anything with
            ``expected_swaps(scores (B, n), checks=...) -> (B,)``).

    ``forward(scores (B, n) float, values (B, n)) -> scalar``: the batch mean of the swap counts, in
    [0, n(n-1)/2] (dtype of ``scores``; float32 for half-precision scores). One host synchronisation.

    Raises:
        ValueError: an operator without ``expected_swaps``, or bad scores / values (shape mismatch,
            non-finite).
    """

    def __init__(self, operator: nn.Module) -> None:
        super().__init__()
        if not callable(getattr(operator, "expected_swaps", None)):
            raise ValueError(f"loss=sort_swaps needs operator=relaxed_bubble_sort (an operator with "
                             f"expected_swaps), got {type(operator).__name__}")
        self.operator = operator

    def forward(self, scores: Tensor, values: Tensor) -> Tensor:
        """Scalar loss: mean relaxed swap count."""
        checks = _check_values(scores, values)
        scores = _full_precision(scores)
        ascending = true_order(values).flip(1)  # items from the smallest true value to the largest
        with torch.autocast(device_type=scores.device.type, enabled=False):
            swaps = call_operator(self.operator.expected_swaps, scores.gather(1, ascending), checks=checks)
        return swaps.mean()


class SoftRankMSELoss(nn.Module):
    """Mean squared error between the operator's soft ranks and the true ranks (1 = largest).

    Thesis §3.5 ("Training Settings"): Fast Sort & Rank gives no P, so it is trained on ranks.

    Args:
        operator: a ranking operator providing ``"soft_rank"``.
        normalize: divide ranks by n before the error (keeps the scale independent of n).

    ``forward(scores (B, n) float, values (B, n)) -> scalar``, mean over B·n.

    Raises:
        ValueError: an operator without ``"soft_rank"``, or bad scores / values.
    """

    def __init__(self, operator: nn.Module, normalize: bool = False) -> None:
        super().__init__()
        require(operator, SOFT_RANK, f"{type(self).__name__} (loss=sort_rank_mse)")
        self.operator, self.normalize = operator, bool(normalize)

    def forward(self, scores: Tensor, values: Tensor) -> Tensor:
        """Scalar loss (dtype of ``scores``); one host synchronisation (the operator's check of its input)."""
        soft = call_operator(self.operator.soft_rank, scores, checks=_check_values(scores, values))
        target = true_ranks(values).to(soft.dtype)
        if self.normalize:
            n = scores.shape[1]
            soft, target = soft / n, target / n
        return F.mse_loss(soft, target)
