"""Losses of top-K recommendation over the whole item catalogue: a user's scores of all n items against its training
positives (a multi-hot), ``loss(scores (B, n) float, positives (B, n) float 0/1) -> scalar``.

- :class:`BPRLoss`: Bayesian personalised ranking (Rendle et al., UAI 2009, Eq. for BPR-Opt without the prior), one
  uniformly drawn negative per positive, as RecBole's BPR with ``train_neg_sample_args: {distribution: uniform,
  sample_num: 1}``;
- :class:`ItemSoftmaxLoss`: the full softmax cross-entropy over all items of each positive (RecBole's
  ``loss_type: CE`` with every item as a class);
- :class:`NeuralNDCGLoss` / :class:`ApproxNDCGLoss`: 1 − NeuralNDCG@k / ApproxNDCG of
  :mod:`diffrank.losses.ranking`, each user's list being every item and its relevance the training positives.

The two baselines average over the positive interactions of the batch (each interaction weighs the same, as in
RecBole's interaction batches); the NDCG losses average over the users.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffrank.losses.ranking import approx_ndcg_loss, neural_ndcg_loss


def _check(scores: Tensor, positives: Tensor) -> Tensor:
    """The positives as a bool mask; shapes, dtypes and at least one positive checked."""
    if not scores.is_floating_point() or scores.dim() != 2 or positives.shape != scores.shape:
        raise ValueError(f"need floating scores (B, n) and positives of the same shape, got {scores.dtype} "
                         f"{tuple(scores.shape)} and {tuple(positives.shape)}")
    pos = positives > 0
    if not bool(pos.any()):
        raise ValueError("the batch holds no positive item: nothing to learn from")
    return pos


def sample_negatives(positives: Tensor, rows: Tensor, generator: torch.Generator | None = None,
                     tries: int = 100) -> Tensor:
    """One item per entry of ``rows``, uniform among the items that row's user has no positive for (rejection
    sampling, as RecBole's uniform sampler draws outside a user's used items).

    Args:
        positives: ``(B, n)`` bool. rows: ``(P,)`` int64 row of each draw.
        generator: the torch generator (None: the global one, which the run seeds).
        tries: redraw rounds before giving up.

    Returns:
        ``(P,)`` int64 item indices.

    Raises:
        ValueError: a row whose user has every item as a positive (no negative exists), or draws still rejected
            after ``tries`` rounds.
    """
    n = positives.shape[1]
    if bool(positives[rows].all(1).any()):
        raise ValueError("a user has every item as a positive: no negative to sample")
    items = torch.randint(n, rows.shape, generator=generator, device=positives.device)
    for _ in range(tries):
        bad = positives[rows, items]
        if not bool(bad.any()):
            return items
        items = torch.where(bad, torch.randint(n, rows.shape, generator=generator, device=positives.device), items)
    raise ValueError(f"negative sampling: draws still hit positives after {tries} rounds")


class BPRLoss(nn.Module):
    """−mean log σ(s_pos − s_neg) over the positives of the batch, one uniform negative each (Rendle et al. 2009).

    Call: ``loss(scores (B, n) float, positives (B, n) float 0/1) -> scalar`` (dtype of ``scores``).

    Raises:
        ValueError: shapes or dtypes as :func:`_check`, a batch without positives, a user without negatives.
    """

    def forward(self, scores: Tensor, positives: Tensor) -> Tensor:
        """BPR of one batch; negatives from the global torch generator."""
        pos = _check(scores, positives)
        rows, items = pos.nonzero(as_tuple=True)
        negatives = sample_negatives(pos, rows)
        return -F.logsigmoid(scores[rows, items] - scores[rows, negatives]).mean()


class ItemSoftmaxLoss(nn.Module):
    """−mean over the batch's positives (u, i) of log softmax(s_u)_i, the softmax over all n items.

    Call: ``loss(scores (B, n) float, positives (B, n) float 0/1) -> scalar`` (float32 for half precision).

    Raises:
        ValueError: as :class:`BPRLoss` (but needs no negatives).
    """

    def forward(self, scores: Tensor, positives: Tensor) -> Tensor:
        """Full softmax cross-entropy of one batch."""
        pos = _check(scores, positives)
        logp = torch.log_softmax(scores.float() if scores.dtype.itemsize < 4 else scores, dim=-1)
        return -(logp * pos).sum() / pos.sum()


class NeuralNDCGLoss(nn.Module):
    """1 − NeuralNDCG@k of each user's ranking of all items (:func:`diffrank.losses.ranking.neural_ndcg_loss`).

    Args:
        operator: a ranking operator with ``"permutation"`` (its β is the relaxation's) or None for NeuralSort.
        k: the cut-off. sinkhorn_iterations: Sinkhorn passes on P (0: only the top k rows of P are formed, O(B k n)
            memory; with passes the full P, O(B n²)). transposed: NeuralNDCG^T. gain: ``"linear"`` or ``"exp2"``
            (equal on 0/1 relevance).

    Call: ``loss(scores (B, n), positives (B, n)) -> scalar``, the mean over users.

    Raises:
        TypeError / ValueError: as :func:`~diffrank.losses.ranking.neural_ndcg_loss`.
    """

    def __init__(self, operator: nn.Module | None = None, k: int | None = 10, sinkhorn_iterations: int = 0,
                 transposed: bool = False, gain: str = "linear") -> None:
        super().__init__()
        self.operator, self.k = operator, k
        self.sinkhorn_iterations, self.transposed, self.gain = int(sinkhorn_iterations), bool(transposed), gain

    def forward(self, scores: Tensor, positives: Tensor) -> Tensor:
        """1 − NeuralNDCG@k, mean over the users of the batch."""
        return neural_ndcg_loss(scores, positives, k=self.k, operator=self.operator,
                                sinkhorn_iterations=self.sinkhorn_iterations, transposed=self.transposed,
                                gain=self.gain)


class ApproxNDCGLoss(nn.Module):
    """1 − ApproxNDCG(@k) of each user's ranking of all items (:func:`diffrank.losses.ranking.approx_ndcg_loss`).

    Args:
        operator: None for the paper's sigmoid soft ranks (O(B n²) memory), or a ranking operator with
            ``"soft_rank"`` / a function ``scores -> soft ranks``.
        k: the cut-off (None: the whole list). beta: the sigmoids' inverse temperature (None: the function's
            default, 10). gain: ``"linear"`` or ``"exp2"``.

    Call: ``loss(scores (B, n), positives (B, n)) -> scalar``, the mean over users.

    Raises:
        TypeError / ValueError: as :func:`~diffrank.losses.ranking.approx_ndcg_loss`.
    """

    def __init__(self, operator: Callable | None = None, k: int | None = None, beta: float | None = None,
                 gain: str = "linear") -> None:
        super().__init__()
        self.operator, self.k, self.beta, self.gain = operator, k, beta, gain

    def forward(self, scores: Tensor, positives: Tensor) -> Tensor:
        """1 − ApproxNDCG, mean over the users of the batch."""
        return approx_ndcg_loss(scores, positives, k=self.k, operator=self.operator, beta=self.beta, gain=self.gain)
