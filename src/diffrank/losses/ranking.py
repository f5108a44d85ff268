"""Learning-to-rank losses: scores of the items of lists against their relevance labels, over any ranking operator.

Every loss takes scores ``(..., n)`` (the last dimension holds the items of one list; every other dimension is a
batch dimension), targets of the same shape and an optional ``mask`` (bool, same shape, True = a real item), and
returns the mean over the lists (``reduction="mean"``), their sum (``"sum"``) or one loss per list (``"none"``,
shape ``(...)``). Items are ranked by decreasing score, rank 1 = the largest (the operators' convention).

- :func:`approx_ndcg_loss`: 1 − ApproxNDCG (Qin, Liu, Li, Information Retrieval 13(4), 2010): NDCG with each item's
  rank replaced by a soft rank (by default the paper's sum of sigmoids, Eq. 11, :func:`sigmoid_soft_rank`).
- :func:`neural_ndcg_loss`: 1 − NeuralNDCG (Pobrotyn & Białobrzeski, "NeuralNDCG: Direct Optimisation of a Ranking
  Metric via Differentiable Relaxation of Sorting", arXiv:2102.07831, 2021): the gains sorted by a relaxed
  permutation matrix (NeuralSort by default), optionally Sinkhorn-scaled, and its transposed variant.
- :func:`pirank_loss`: 1 − PiRank's relaxed NDCG@k (Swezey et al., NeurIPS 2021): NeuralSort's top k rows, no scaling.
- :func:`smooth_ap_loss`: 1 − Smooth-AP (Brown et al., ECCV 2020): average precision over sigmoid-relaxed ranks.
- :func:`listnet_loss`: ListNet's cross-entropy of top-one probabilities (Cao, Qin, Liu, Tsai, Li, ICML 2007).
- :func:`listmle_loss`: ListMLE's negative log-likelihood of the true order under the Plackett-Luce model (Xia, Liu,
  Wang, Zhang, Li, ICML 2008), by ``logcumsumexp``: finite in float32 at n = 10⁴.
- :func:`soft_spearman_loss`: 1 − Spearman's ρ with soft ranks of the predictions (torchsort's README example).

Padding: a masked item contributes nothing, neither to the value nor to any gradient (its gradient is exactly 0),
and a masked list equals the same list with the padding removed. The lists are grouped by their number of real
items and each group runs on its real items only (one host read of the lengths and one call per distinct length);
operators that mix all items of a list (NeuralSort's row sums, Sinkhorn) would otherwise see the padding. A list
without a real item has loss 0; ``reduction="mean"`` averages over the lists that have one.

The NDCG losses use the gains and discounts of :func:`diffrank.metrics.ndcg` (``gain="exp2"``: 2^rel − 1 by
default, ``"linear"``: rel) and its ``empty=`` policy for a list with no relevant item (ideal DCG = 0): NDCG is then
0 (``"zero"``, the default: loss 1, constant, no gradient), 1 (``"one"``: loss 0) or NaN (``"nan"``, only on
request). With large β each NDCG loss tends to 1 − :func:`diffrank.metrics.ndcg` on untied scores.

Validation reads the inputs once on the host (finite scores, finite and non-negative labels among the real items);
with a mask, the lengths are a second read. These losses therefore do not trace under ``torch.compile``
``fullgraph=True``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch
from torch import Tensor

from diffrank._padding import per_length
from diffrank.metrics import EMPTY, average_ranks, check_gain, check_mask, check_policy, discounts, gains
from diffrank.operators.base import PERMUTATION, SOFT_RANK, check_int, compute_dtype, raise_failed, require
from diffrank.operators.fast_soft_sort import FastSoftSort
from diffrank.operators.neuralsort import NeuralSort

REDUCTIONS = ("mean", "sum", "none")

APPROX_BETA = 10.0  # PT-Ranking's ApproxNDCG alpha = 10 (allRank's approxNDCGLoss uses 1)
NEURAL_BETA = 1.0  # allRank's neuralNDCG temperature τ = 1 (β = 1/τ)
SPEARMAN_BETA = 1.0  # torchsort's regularization_strength ε = 1 (β = 1/ε)


def sigmoid_soft_rank(scores: Tensor, beta: float = APPROX_BETA) -> Tensor:
    """Soft ranks by a sum of sigmoids: π̂_i = 1 + Σ_{j ≠ i} σ(β (s_j − s_i)) (Qin, Liu, Li 2010, Eq. 11, with their
    α = β). Rank 1 = the largest score; tends to the hard rank as β → ∞ on untied scores (a tie counts ½ each way).

    Args:
        scores: ``(B, n)`` floating.
        beta: inverse temperature β > 0 (a float).

    Returns:
        ``(B, n)`` soft ranks in [1, n], dtype of ``scores``. Time and memory O(B n²) (the pairwise differences).

    Raises:
        ValueError: ``beta`` not a positive finite number.
    """
    beta = _check_beta(beta)
    diff = scores.unsqueeze(-2) - scores.unsqueeze(-1)  # [b, i, j] = s_j - s_i
    # the diagonal adds σ(0) = ½ exactly; 1 + Σ_{j≠i} = ½ + Σ_j
    return 0.5 + torch.sigmoid(beta * diff).sum(-1)


def sinkhorn_scaling(p: Tensor, iterations: int = 50, last: str = "rows") -> Tensor:
    """Alternate column and row normalisation of a non-negative matrix towards a doubly stochastic one (Sinkhorn &
    Knopp 1967), as NeuralNDCG scales NeuralSort's P̂ (Pobrotyn & Białobrzeski 2021, "scale(P̂)"; allRank's
    ``sinkhorn_scaling``, which stops at a tolerance of 1e-6 or 50 iterations: a fixed count here, so that the
    result is deterministic and needs no host read).

    Args:
        p: ``(..., n, n)`` non-negative, floating (rows = ranks, columns = items).
        iterations: the number of column-then-row passes (an integer >= 0).
        last: which normalisation comes last: ``"rows"`` (each rank a distribution over items, NeuralNDCG) or
            ``"columns"`` (each item a distribution over ranks, the transposed variant).

    Returns:
        The scaled ``(..., n, n)``, dtype of ``p``. A row or column summing to 0 is left at 0 (the division is by
        at least the dtype's smallest normal number), never NaN.

    Raises:
        ValueError: a negative ``iterations`` or an unknown ``last``. TypeError: a non-integer ``iterations``.
    """
    iterations = check_int(iterations, "iterations", low=0, what="the number of Sinkhorn passes")
    if last not in ("rows", "columns"):
        raise ValueError(f"last must be 'rows' or 'columns', got {last!r}")
    tiny = torch.finfo(p.dtype).tiny
    first, second = (-2, -1) if last == "rows" else (-1, -2)
    for _ in range(iterations):
        p = p / p.sum(first, keepdim=True).clamp_min(tiny)
        p = p / p.sum(second, keepdim=True).clamp_min(tiny)
    return p


def approx_ndcg_loss(scores: Tensor, relevance: Tensor, k: int | None = None, mask: Tensor | None = None,
                     operator: Callable[[Tensor], Tensor] | None = None, beta: float | None = None,
                     gain: str = "exp2", empty: str = "zero", reduction: str = "mean") -> Tensor:
    """1 − ApproxNDCG@k: NDCG with soft ranks π̂ in place of the ranks (Qin, Liu, Li, Information Retrieval 2010,
    the position function of Eq. 11 in NDCG): Σ_i gain_i / log2(1 + π̂_i) · t_i / ideal DCG@k.

    Args:
        scores: ``(..., n)`` floating (float16 / bfloat16 computed in float32).
        relevance: ``(..., n)`` graded labels, real, finite and >= 0 for the real items.
        k: cut-off rank (an integer >= 1; k >= n is the whole list) or None. With k, each item's term is weighted by
            the soft truncation t_i = σ(β (k + ½ − π̂_i)) (the paper's σ(α (k − π̂)), shifted by ½ so that the item
            of rank k counts fully in the hard limit), and the ideal DCG is truncated at k.
        mask: ``(..., n)`` bool, True = a real item; padded items contribute nothing (module docstring).
        operator: where the soft ranks come from: None (default) for :func:`sigmoid_soft_rank` with ``beta``, a
            :class:`~diffrank.operators.base.RankingOperator` providing ``"soft_rank"`` (its ``soft_rank``), or any
            function ``(B, n) scores -> (B, n)`` soft ranks (1 = largest). Ranks below 1 (a row-stochastic P's
            expected ranks can be) are clamped to 1 so that log2(1 + π̂) stays >= 1. ``(S, B, n)`` ranks of a
            stochastic operator's samples give the mean DCG over the samples.
        beta: inverse temperature of the default sigmoid ranks and of the truncation (default 10, PT-Ranking's
            α; allRank uses 1); with an ``operator`` it sets the truncation only (the operator has its own β).
        gain: ``"exp2"`` (default, 2^rel − 1 as in the paper) or ``"linear"`` (rel).
        empty: NDCG of a list without a relevant item: ``"zero"`` (default), ``"one"`` or ``"nan"``.
        reduction: ``"mean"`` (default, over the lists with a real item), ``"sum"`` or ``"none"`` (``(...)``).

    Returns:
        A scalar (or ``(...)`` per list), dtype of ``scores`` (float32 for half precision). Tends to 1 −
        :func:`diffrank.metrics.ndcg` (same k, gain, empty) as β → ∞.

    Raises:
        TypeError: non-tensor or non-floating scores, complex / bool relevance, a non-bool mask, a non-integer k,
            an operator that is neither a soft-rank operator nor callable.
        ValueError: mismatched shapes, k < 1, NaN / inf scores or labels or negative labels among the real items, a
            non-positive β, an operator without ``"soft_rank"``, unknown ``gain`` / ``empty`` / ``reduction``.
    """
    check_gain(gain)
    fill = check_policy(empty, "empty", EMPTY)
    k = None if k is None else check_int(k, "k", what="the cut-off rank")
    beta = APPROX_BETA if beta is None else _check_beta(beta)
    rank_fn = _soft_rank_function(operator, lambda x: sigmoid_soft_rank(x, beta), "approx_ndcg_loss")
    s, r, m, shape = _prepare(scores, relevance, mask, reduction, nonnegative=True)

    def rows(x: Tensor, rel: Tensor) -> Tensor:
        """The loss of each list ``(b,)`` from its real items: scores ``x`` ``(b, c)`` and targets ``(b, c)``."""
        n = x.shape[-1]
        ranks = rank_fn(x).clamp_min(1.0)
        g = gains(rel, gain)
        terms = g / torch.log2(1.0 + ranks)
        if k is not None and k < n:
            terms = terms * torch.sigmoid(beta * (k + 0.5 - ranks))
        return 1.0 - _ndcg(terms.sum(-1), _ideal_dcg(g, k), fill)

    return _reduce(_per_list(rows, s, r, m), m, reduction, shape)


def neural_ndcg_loss(scores: Tensor, relevance: Tensor, k: int | None = None, mask: Tensor | None = None,
                     operator: Callable[..., Tensor] | None = None, beta: float | None = None,
                     sinkhorn_iterations: int = 50, transposed: bool = False, gain: str = "exp2",
                     empty: str = "zero", reduction: str = "mean") -> Tensor:
    """1 − NeuralNDCG@k (Pobrotyn & Białobrzeski, arXiv:2102.07831, 2021, the NeuralNDCG definition): the gains
    sorted by a relaxed permutation matrix P (rows = ranks), Σ_{r ≤ k} (P g)_r d_r / ideal DCG@k with
    d_r = 1 / log2(r + 1).

    Args:
        scores: ``(..., n)`` floating (float16 / bfloat16 computed in float32).
        relevance: ``(..., n)`` graded labels, real, finite and >= 0 for the real items.
        k: cut-off rank (an integer >= 1; k >= n is the whole list) or None.
        mask: ``(..., n)`` bool, True = a real item; padded items contribute nothing (module docstring).
        operator: where P comes from: None (default) for NeuralSort (Grover et al., ICLR 2019) with ``beta``, a
            :class:`~diffrank.operators.base.RankingOperator` providing ``"permutation"`` (called as
            ``operator(scores, k)``), or any function ``(B, n) scores -> (B, n, n)`` P. A stochastic operator's
            ``(S, B, ·, n)`` samples (``NeuralSortStochastic(samples=S)``, allRank's stochastic NeuralNDCG) give the
            mean NDCG over the samples.
        beta: NeuralSort's inverse temperature β = 1/τ for the default operator (default 1, allRank's τ = 1); an
            error with an ``operator``, which has its own.
        sinkhorn_iterations: column-then-row Sinkhorn passes on P (:func:`sinkhorn_scaling`; default 50 as
            allRank's cap; 0 uses P as the operator gives it, and only its top k rows are formed when not
            ``transposed``).
        transposed: NeuralNDCG^T (the paper's transposed variant): Σ_i g_i (Pᵀ d)_i, each item's gain times its
            expected discount, the scaling ending on the columns (each item a distribution over ranks; without
            Sinkhorn the columns are normalised once). For the same P the two forms are the same sum
            Σ_{r,i} P[r, i] g_i d_r: the variants differ by the normalisation that comes last.
        gain: ``"exp2"`` (default, 2^rel − 1 as in the paper) or ``"linear"`` (rel).
        empty: NDCG of a list without a relevant item: ``"zero"`` (default), ``"one"`` or ``"nan"``.
        reduction: ``"mean"`` (default, over the lists with a real item), ``"sum"`` or ``"none"`` (``(...)``).

    Returns:
        A scalar (or ``(...)`` per list), dtype of ``scores`` (float32 for half precision). Tends to 1 −
        :func:`diffrank.metrics.ndcg` (same k, gain, empty) as β → ∞. Memory O(B n²) with Sinkhorn or
        ``transposed`` (the full P), O(B k n) otherwise.

    Raises:
        TypeError: bad tensors (as :func:`approx_ndcg_loss`), a non-integer k or ``sinkhorn_iterations``, an
            operator that is not callable.
        ValueError: as :func:`approx_ndcg_loss`; ``beta`` together with an ``operator``; an operator without
            ``"permutation"``; a function operator whose P is not ``(B, n, n)``.
    """
    check_gain(gain)
    fill = check_policy(empty, "empty", EMPTY)
    k = None if k is None else check_int(k, "k", what="the cut-off rank")
    iterations = check_int(sinkhorn_iterations, "sinkhorn_iterations", low=0, what="the number of Sinkhorn passes")
    if operator is None:
        operator = NeuralSort(beta=NEURAL_BETA if beta is None else _check_beta(beta))
    elif beta is not None:
        raise ValueError("beta sets the default NeuralSort's temperature; an operator has its own β: set it there")
    permutation = _permutation_function(operator, "neural_ndcg_loss")
    s, r, m, shape = _prepare(scores, relevance, mask, reduction, nonnegative=True)

    def rows(x: Tensor, rel: Tensor) -> Tensor:
        """The loss of each list ``(b,)`` from its real items: scores ``x`` ``(b, c)`` and targets ``(b, c)``."""
        n = x.shape[-1]
        top = n if k is None else min(k, n)
        full = transposed or iterations > 0
        p = permutation(x, None if full else top)
        if transposed:
            p = sinkhorn_scaling(p, iterations, last="columns") if iterations else _normalise(p, -2)
        elif iterations:
            p = sinkhorn_scaling(p, iterations, last="rows")
        g = gains(rel, gain)
        d = discounts(n, top, x.dtype, x.device)
        if transposed:
            dcg = (g * (p.transpose(-1, -2) @ d)).sum(-1)
        else:
            dcg = ((p[..., :top, :] @ g.unsqueeze(-1)).squeeze(-1) * d[:top]).sum(-1)
        return 1.0 - _ndcg(dcg, _ideal_dcg(g, k), fill)

    return _reduce(_per_list(rows, s, r, m), m, reduction, shape)


def pirank_loss(scores: Tensor, relevance: Tensor, k: int | None = None, mask: Tensor | None = None,
                beta: float | None = None, gain: str = "exp2", empty: str = "zero", reduction: str = "mean") -> Tensor:
    """1 − PiRank's relaxed NDCG@k (Swezey, Grover, Charron, Ermon, NeurIPS 2021, §3): the gains sorted by the top k
    rows of NeuralSort's P̂ (no Sinkhorn scaling), i.e. :func:`neural_ndcg_loss` with ``sinkhorn_iterations=0``;
    PiRank's divide-and-conquer sort for very long lists (their §3.2) is not implemented, and O(B k n) memory is what
    the top k rows take here.

    Args:
        scores, relevance, k, mask, gain, empty, reduction: as :func:`neural_ndcg_loss`.
        beta: NeuralSort's inverse temperature β = 1/τ (default 1).

    Returns:
        As :func:`neural_ndcg_loss`.

    Raises:
        As :func:`neural_ndcg_loss`.
    """
    return neural_ndcg_loss(scores, relevance, k=k, mask=mask, beta=beta, sinkhorn_iterations=0, gain=gain,
                            empty=empty, reduction=reduction)


SMOOTH_AP_BETA = 100.0  # Brown et al.'s τ = 0.01


def smooth_ap_loss(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, beta: float = SMOOTH_AP_BETA,
                   empty: str = "zero", reduction: str = "mean") -> Tensor:
    """1 − Smooth-AP (Brown, Xie, Kalogeiton, Zisserman, ECCV 2020, §3): average precision with each rank replaced by
    a sum of sigmoids, AP ≈ (1/|P|) Σ_{i ∈ P} (1 + Σ_{j ∈ P, j ≠ i} σ(β (s_j − s_i))) / (1 + Σ_{j ≠ i}
    σ(β (s_j − s_i))), P the relevant items (relevance > 0), β = 1/τ.

    Args:
        scores: ``(..., n)`` floating.
        relevance: ``(..., n)`` labels; an item is relevant when its label is > 0.
        mask: ``(..., n)`` bool, True = a real item; padded items contribute nothing (module docstring).
        beta: inverse temperature β = 1/τ > 0 (default 100: the paper's τ = 0.01).
        empty: AP of a list without a relevant item: ``"zero"`` (default: loss 1, no gradient), ``"one"``, ``"nan"``.
        reduction: ``"mean"`` (over the lists with a real item), ``"sum"`` or ``"none"``.

    Returns:
        A scalar (or ``(...)`` per list), dtype of ``scores`` (float32 for half precision); tends to 1 −
        :func:`diffrank.metrics.average_precision` on untied scores as β → ∞. Memory O(B n²) (the pairwise sigmoids).

    Raises:
        TypeError / ValueError: bad tensors or labels (as :func:`approx_ndcg_loss`), a bad ``beta`` or ``empty``.
    """
    fill = check_policy(empty, "empty", EMPTY)
    beta = _check_beta(beta)
    s, r, m, shape = _prepare(scores, relevance, mask, reduction, nonnegative=True)

    def rows(x: Tensor, rel: Tensor) -> Tensor:
        """The loss of each list ``(b,)`` from its real items: scores ``x`` ``(b, c)`` and targets ``(b, c)``."""
        relevant = (rel > 0).to(x.dtype)
        above = torch.sigmoid(beta * (x.unsqueeze(-2) - x.unsqueeze(-1)))  # [i, j]: σ(β (s_j − s_i))
        above = above * (1.0 - torch.eye(x.shape[-1], dtype=x.dtype, device=x.device))
        precision = (1.0 + above @ relevant.unsqueeze(-1)).squeeze(-1) / (1.0 + above.sum(-1))
        count = relevant.sum(-1)
        ap = (precision * relevant).sum(-1) / count.clamp_min(1.0)
        return 1.0 - torch.where(count > 0, ap, torch.full_like(ap, fill))

    return _reduce(_per_list(rows, s, r, m), m, reduction, shape)


def listnet_loss(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, reduction: str = "mean") -> Tensor:
    """ListNet: the cross-entropy between the top-one probabilities of the labels and of the scores, −Σ_i
    softmax(rel)_i · log softmax(s)_i (Cao, Qin, Liu, Tsai, Li, ICML 2007: the top-one probability with φ = exp
    and the cross-entropy between the two distributions).

    Args:
        scores: ``(..., n)`` floating (float16 / bfloat16 computed in float32).
        relevance: ``(..., n)`` labels, real and finite for the real items (any sign).
        mask: ``(..., n)`` bool, True = a real item; padded items contribute nothing.
        reduction: ``"mean"`` (default, over the lists with a real item), ``"sum"`` or ``"none"`` (``(...)``).

    Returns:
        A scalar (or ``(...)`` per list) >= 0 (the cross-entropy, in nats), dtype of ``scores`` (float32 for half
        precision); computed by ``log_softmax``, finite for finite input.

    Raises:
        TypeError: non-tensor or non-floating scores, complex / bool relevance, a non-bool mask.
        ValueError: mismatched shapes, NaN / inf among the real items, an unknown ``reduction``.
    """
    s, r, m, shape = _prepare(scores, relevance, mask, reduction, nonnegative=False)

    def rows(x: Tensor, rel: Tensor) -> Tensor:
        """The loss of each list ``(b,)`` from its real items: scores ``x`` ``(b, c)`` and targets ``(b, c)``."""
        return -(torch.softmax(rel, -1) * torch.log_softmax(x, -1)).sum(-1)

    return _reduce(_per_list(rows, s, r, m), m, reduction, shape)


def listmle_loss(scores: Tensor, relevance: Tensor, k: int | None = None, mask: Tensor | None = None,
                 reduction: str = "mean") -> Tensor:
    """ListMLE: the negative log-likelihood of the order of the labels under the Plackett-Luce model of the scores,
    Σ_{i ≤ k} [log Σ_{j ≥ i} exp(s_{y(j)}) − s_{y(i)}] with y the items by decreasing relevance (Xia, Liu, Wang,
    Zhang, Li, ICML 2008, the likelihood loss; its top-k form: Xia, Liu, Li, NeurIPS 2009).

    The suffix log-sums are one ``logcumsumexp`` over the reversed sorted scores: finite in float32 at n = 10⁴ and
    any score scale (exp of the raw scores would overflow beyond 88).

    Args:
        scores: ``(..., n)`` floating (float16 / bfloat16 computed in float32).
        relevance: ``(..., n)`` labels, real and finite for the real items; only their order is used. Tied labels
            keep their item order (a stable sort; allRank shuffles the items first to break ties at random: do that
            before the call for the same effect).
        k: the number of top positions whose terms count (an integer >= 1; k >= n is the whole list), or None.
        mask: ``(..., n)`` bool, True = a real item; padded items contribute nothing.
        reduction: ``"mean"`` (default, over the lists with a real item), ``"sum"`` or ``"none"`` (``(...)``).

    Returns:
        A scalar (or ``(...)`` per list) >= 0, in nats, dtype of ``scores`` (float32 for half precision).

    Raises:
        TypeError / ValueError: as :func:`listnet_loss`; a non-integer k or k < 1.
    """
    k = None if k is None else check_int(k, "k", what="the number of top positions")
    s, r, m, shape = _prepare(scores, relevance, mask, reduction, nonnegative=False)

    def rows(x: Tensor, rel: Tensor) -> Tensor:
        """The loss of each list ``(b,)`` from its real items: scores ``x`` ``(b, c)`` and targets ``(b, c)``."""
        order = torch.argsort(rel, dim=-1, descending=True, stable=True)
        xs = x.gather(-1, order)
        terms = xs.flip(-1).logcumsumexp(-1).flip(-1) - xs
        return (terms if k is None else terms[..., :k]).sum(-1)

    return _reduce(_per_list(rows, s, r, m), m, reduction, shape)


def soft_spearman_loss(pred: Tensor, target: Tensor, mask: Tensor | None = None,
                       operator: Callable[[Tensor], Tensor] | None = None, beta: float | None = None,
                       soft_target: bool = False, reduction: str = "mean") -> Tensor:
    """1 − Spearman's ρ with soft ranks: 1 − Pearson(soft ranks of ``pred``, ranks of ``target``) (the Spearman loss
    of torchsort's README, after Blondel et al., ICML 2020, §6).

    Args:
        pred: ``(..., n)`` floating predictions (float16 / bfloat16 computed in float32).
        target: ``(..., n)`` real targets, finite for the real items.
        mask: ``(..., n)`` bool, True = a real item; padded items contribute nothing.
        operator: where the soft ranks come from: None (default) for fast soft rank (Blondel et al. 2020, l2, as
            torchsort) with ``beta``; a :class:`~diffrank.operators.base.RankingOperator` providing
            ``"soft_rank"``; or any function ``(B, n) -> (B, n)`` soft ranks (``(S, B, n)`` samples: the mean ρ).
        beta: β = 1/ε of the default operator (default 1: torchsort's regularization_strength 1); an error with an
            ``operator``.
        soft_target: rank the target with the same soft ranks, as torchsort's README does; default False: the
            target's hard average ranks (``scipy.stats.spearmanr``'s tie convention), so that the loss tends to 1 −
            :func:`diffrank.metrics.spearman` as β → ∞.
        reduction: ``"mean"`` (default, over the lists with a real item), ``"sum"`` or ``"none"`` (``(...)``).

    A list with fewer than two real items or a constant target has no ρ: its loss is 0 (nothing to learn). Soft
    ranks of ``pred`` with no spread (all equal) give ρ = 0, loss 1, with zero gradient rather than NaN.

    Returns:
        A scalar (or ``(...)`` per list) in [0, 2], dtype of ``pred`` (float32 for half precision).

    Raises:
        TypeError: non-tensor or non-floating ``pred``, complex / bool ``target``, a non-bool mask, an operator
            that is not callable.
        ValueError: mismatched shapes, NaN / inf among the real items, ``beta`` with an ``operator``, an operator
            without ``"soft_rank"``, an unknown ``reduction``.
    """
    if operator is None:
        operator = FastSoftSort(beta=SPEARMAN_BETA if beta is None else _check_beta(beta))
    elif beta is not None:
        raise ValueError("beta sets the default fast soft rank's β; an operator has its own β: set it there")
    rank_fn = _soft_rank_function(operator, None, "soft_spearman_loss")
    s, t, m, shape = _prepare(pred, target, mask, reduction, nonnegative=False, names=("pred", "target"))

    def rows(x: Tensor, y: Tensor) -> Tensor:
        """The loss of each list ``(b,)`` from its real items: scores ``x`` ``(b, c)`` and targets ``(b, c)``."""
        rx = rank_fn(x)
        ry = rank_fn(y) if soft_target else average_ranks(y.detach())
        cx, cy = rx - rx.mean(-1, keepdim=True), ry - ry.mean(-1, keepdim=True)
        v = (cx * cx).sum(-1) * (cy * cy).sum(-1)
        # the where sits under the square root: sqrt's derivative at 0 is inf, and 0 · inf would be NaN
        rho = (cx * cy).sum(-1) / torch.sqrt(torch.where(v > 0, v, 1.0))
        if rho.dim() > 1:  # a stochastic operator's samples lead: their mean
            rho = rho.flatten(0, -2).mean(0)
        constant = (y.amax(-1) == y.amin(-1)) | (x.shape[-1] < 2)
        return torch.where(constant, 0.0, 1.0 - rho)

    return _reduce(_per_list(rows, s, t, m), m, reduction, shape)


# -- shared pieces ------------------------------------------------------------------------------------------------

def _check_beta(beta: float) -> float:
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 < beta < float("inf"):
        raise ValueError(f"beta must be a positive finite number, got {beta!r}")
    return float(beta)


def _soft_rank_function(operator, default: Callable[[Tensor], Tensor] | None, user: str) -> Callable:
    """``(B, n) -> (B, n)`` soft ranks from a loss's ``operator`` argument."""
    if operator is None:
        return default
    if hasattr(operator, "capabilities"):
        require(operator, SOFT_RANK, user)
        return operator.soft_rank
    if callable(operator):
        return operator
    raise TypeError(f"{user}: operator must be a ranking operator or a function of the scores, "
                    f"got {type(operator).__name__}")


def _permutation_function(operator, user: str) -> Callable[[Tensor, int | None], Tensor]:
    """``(x (B, n), k) -> P (B, k or n, n)`` from a loss's ``operator`` argument."""
    if hasattr(operator, "capabilities"):
        require(operator, PERMUTATION, user)
        return lambda x, k: operator(x, k)
    if not callable(operator):
        raise TypeError(f"{user}: operator must be a ranking operator or a function of the scores, "
                        f"got {type(operator).__name__}")

    def call(x: Tensor, k: int | None) -> Tensor:
        """P ``(B, n, n)`` of scores ``x`` ``(B, n)`` from a function operator (``k`` unused: all rows); ValueError on
        another shape."""
        p = operator(x)
        if not isinstance(p, Tensor) or p.shape != (*x.shape, x.shape[-1]):
            got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"{user}: the operator must return P of shape {(*x.shape, x.shape[-1])}, got {got}")
        return p if k is None else p[..., :k, :]

    return call


def _normalise(p: Tensor, dim: int) -> Tensor:
    return p / p.sum(dim, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)


def _ideal_dcg(g: Tensor, k: int | None) -> Tensor:
    """The DCG@k of the items ordered by gain: ``(B,)``."""
    n = g.shape[-1]
    top = g.detach().sort(dim=-1, descending=True).values
    return (top * discounts(n, k, g.dtype, g.device)).sum(-1)


def _ndcg(dcg: Tensor, ideal: Tensor, fill: float) -> Tensor:
    """DCG / ideal DCG, ``fill`` where the ideal DCG is 0 (no NaN in the value or the gradient). A ``(S, b)`` DCG
    (a stochastic operator's samples leading, :mod:`diffrank.operators.gumbel`) is averaged over the samples first,
    as allRank's stochastic NeuralNDCG averages its samples."""
    if dcg.dim() > 1:
        dcg = dcg.flatten(0, -2).mean(0)
    empty = ideal <= 0
    return torch.where(empty, fill, dcg / torch.where(empty, 1.0, ideal))


def _prepare(scores: Tensor, target: Tensor, mask: Tensor | None, reduction: str, nonnegative: bool,
             names: tuple[str, str] = ("scores", "relevance")) -> tuple[Tensor, Tensor, Tensor | None, torch.Size]:
    """Validate (one host read), then ``(B, n)`` scores and targets in the compute dtype, the ``(B, n)`` mask or
    None, and the batch shape."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")
    a, b = names
    if not isinstance(scores, Tensor):
        raise TypeError(f"{a} must be a torch.Tensor of shape (..., n), got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"{a} must be floating point, got dtype {scores.dtype}")
    if scores.dim() < 1 or scores.shape[-1] < 1:
        raise ValueError(f"{a} must have shape (..., n) with n >= 1, got {tuple(scores.shape)}")
    if not isinstance(target, Tensor):
        raise TypeError(f"{b} must be a torch.Tensor, got {type(target).__name__}")
    if target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"{b} must be a real (floating or integer) tensor, got dtype {target.dtype}")
    if target.shape != scores.shape:
        raise ValueError(f"{b} must have the shape of {a} {tuple(scores.shape)}, got {tuple(target.shape)}")
    if target.device != scores.device:
        raise ValueError(f"{b} is on {target.device}, {a} on {scores.device}: put them on one device")
    check_mask(mask, scores.shape, a)
    n = scores.shape[-1]
    dtype = compute_dtype(scores.dtype)
    s, t = scores.reshape(-1, n).to(dtype), target.reshape(-1, n).to(dtype)
    m = None if mask is None else mask.reshape(-1, n)
    padded = False if m is None else ~m  # what a padded item holds is never read
    checks = [((torch.isfinite(s.detach()) | padded).all(), ValueError(f"{a} contain NaN or inf among the real items")),
              ((torch.isfinite(t.detach()) | padded).all(), ValueError(f"{b} contain NaN or inf among the real items"))]
    if nonnegative:
        checks.append((((t.detach() >= 0) | padded).all(), ValueError(f"{b} must be >= 0 for the real items")))
    raise_failed(checks)
    return s, t, m, scores.shape[:-1]


def _per_list(rows: Callable[[Tensor, Tensor], Tensor], s: Tensor, t: Tensor, m: Tensor | None) -> Tensor:
    """``rows`` ((b, c) scores, (b, c) targets -> (b,) losses) on the real items of each list
    (:func:`diffrank._padding.per_length`): ``(B,)``, 0 for a list without a real item."""
    if m is None:
        return rows(s, t)
    return per_length(s, m, lambda c, _, tc: rows(c, tc).unsqueeze(-1), "position", (1,), 0.0, t)[:, 0]


def _reduce(per_list: Tensor, m: Tensor | None, reduction: str, shape: torch.Size) -> Tensor:
    if reduction == "none":
        return per_list.reshape(shape)
    if reduction == "sum":
        return per_list.sum()
    lists = per_list.shape[0] if m is None else m.any(-1).sum()
    # a batch without lists (or without a real item) has mean 0, not 0 / 0
    return per_list.sum() / (lists.clamp_min(1) if isinstance(lists, Tensor) else max(lists, 1))
