"""Hard ranking metrics, one value per list: NDCG, recall@k, MRR, average precision, Spearman's ρ, Kendall's τ-b.

Every function takes scores ``(..., n)`` (the last dimension holds the items of one list, every other dimension is a
batch dimension) and returns one value per list, shape ``(...)``: float64 when an input is float64, float32
otherwise (the computation itself runs in float64). An optional ``mask`` (bool, the shape of the scores; True = a
real item) drops padded items entirely: a masked list equals the same list with its padding removed, and the
values of padded items (NaN, -1 labels as allRank pads them) are never read. Items are ranked by decreasing score
(rank 1 = the largest), the project's convention.

Tie policies follow the reference implementations the tests compare against:

- :func:`ndcg` and :func:`recall_at_k` average over tied scores (scikit-learn's ``ndcg_score`` with
  ``ignore_ties=False``: every item of a tied group gets the group's mean gain, i.e. the expectation over the
  orders that break the tie uniformly at random).
- :func:`mrr` and :func:`average_precision` rank an item after every item it ties with (its rank is the number of
  items scoring at least as high), as scikit-learn's ``average_precision_score`` and
  ``label_ranking_average_precision_score`` do.
- :func:`spearman` ranks with average ranks, :func:`kendall_tau` is τ-b (``scipy.stats.spearmanr`` /
  ``kendalltau`` defaults).

A list whose metric is undefined (no relevant item: the ideal DCG is 0; a correlation of a constant list) gets the
value that ``empty=`` / ``undefined=`` names, by default 0, never a silent NaN. These metrics are for evaluation:
they read the inputs on the host once (validation) and are not differentiable; the differentiable counterparts are
in :mod:`diffrank.losses.ranking`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from diffrank.operators.base import check_int, raise_failed

__all__ = ["average_precision", "average_ranks", "kendall_tau", "mrr", "ndcg", "recall_at_k", "spearman"]

GAINS = ("exp2", "linear")
EMPTY = {"zero": 0.0, "one": 1.0, "nan": math.nan}
UNDEFINED = {"zero": 0.0, "nan": math.nan}
# Kendall's τ forms the (rows, n, n) pair signs: this many pair entries per chunk of rows bounds its memory
_PAIR_CHUNK = 1 << 24


def check_policy(value: str, name: str, choices: dict[str, float]) -> float:
    """The fill value of a policy argument (``empty=`` / ``undefined=``).

    Args:
        value: the user's choice, one of ``choices``' keys.
        name: the argument's name, for the message.
        choices: name → value.

    Returns:
        The float value the name stands for (0.0, 1.0 or NaN).

    Raises:
        ValueError: ``value`` is not one of the choices.
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return choices[value]


def check_gain(gain: str) -> str:
    """Validate a gain name: ``"exp2"`` (2^rel − 1, Burges et al. 2005; the learning-to-rank convention of
    LightGBM, allRank, Qin et al. 2010) or ``"linear"`` (rel itself, scikit-learn's ``ndcg_score``).

    Raises:
        ValueError: any other value.
    """
    if gain not in GAINS:
        raise ValueError(f"gain must be one of {list(GAINS)}, got {gain!r}")
    return gain


def gains(relevance: Tensor, gain: str) -> Tensor:
    """The gain of each item: ``2^rel − 1`` (``"exp2"``) or ``rel`` (``"linear"``), same shape and dtype."""
    return torch.exp2(relevance) - 1 if gain == "exp2" else relevance


def discounts(n: int, k: int | None, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The DCG discount of ranks 1..n: ``1 / log2(r + 1)``, 0 beyond rank ``k`` (Järvelin & Kekäläinen 2002, with
    the log2(r + 1) form of Burges et al. 2005); ``(n,)``."""
    d = 1.0 / torch.log2(torch.arange(2, n + 2, dtype=dtype, device=device))
    if k is not None and k < n:
        d[k:] = 0
    return d


def _real_dtype(t: Tensor, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be a real (floating or integer) tensor, got dtype {t.dtype}")


def check_mask(mask: Tensor | None, shape: torch.Size, name: str = "scores") -> None:
    """Validate a padding mask: None, or a bool tensor of ``shape`` (True = a real item).

    Raises:
        TypeError: not a tensor, or not bool. ValueError: another shape.
    """
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = a real item), got dtype {mask.dtype}")
    if mask.shape != shape:
        raise ValueError(f"mask must have the shape of {name} {tuple(shape)}, got {tuple(mask.shape)}")


def _prepare(x: Tensor, y: Tensor, mask: Tensor | None, names: tuple[str, str],
             nonnegative: bool) -> tuple[Tensor, Tensor, Tensor, torch.dtype]:
    """Validate, then flatten to ``(B, n)`` float64 with a ``(B, n)`` bool mask; masked entries are set to 0 (their
    values are never read)."""
    _real_dtype(x, names[0])
    _real_dtype(y, names[1])
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"{names[0]} must have shape (..., n) with n >= 1 items, got {tuple(x.shape)}")
    if y.shape != x.shape:
        raise ValueError(f"{names[1]} must have the shape of {names[0]} {tuple(x.shape)}, got {tuple(y.shape)}")
    if y.device != x.device:
        raise ValueError(f"{names[1]} is on {y.device}, {names[0]} on {x.device}: put them on one device")
    check_mask(mask, x.shape, names[0])
    out_dtype = torch.float64 if torch.float64 in (x.dtype, y.dtype) else torch.float32
    n = x.shape[-1]
    m = torch.ones(x.shape, dtype=torch.bool, device=x.device) if mask is None else mask.to(x.device)
    xd, yd = x.detach().to(torch.float64), y.detach().to(torch.float64)
    checks = [((torch.isfinite(xd) | ~m).all(), ValueError(f"{names[0]} contain NaN or inf among the real items")),
              ((torch.isfinite(yd) | ~m).all(), ValueError(f"{names[1]} contain NaN or inf among the real items"))]
    if nonnegative:
        checks.append((((yd >= 0) | ~m).all(),
                       ValueError(f"{names[1]} must be >= 0 for the real items (graded labels 0, 1, 2, ...; pad "
                                  "with any value and mask it out)")))
    raise_failed(checks)
    zero = xd.new_zeros(())
    xd, yd = torch.where(m, xd, zero), torch.where(m, yd, zero)
    return xd.reshape(-1, n), yd.reshape(-1, n), m.reshape(-1, n), out_dtype


def _finish(values: Tensor, shape: torch.Size, dtype: torch.dtype) -> Tensor:
    return values.reshape(shape[:-1]).to(dtype)


def _groups(s: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """Sort by decreasing score with the padded items last: ``(order, group)``, both ``(B, n)`` int64, where
    ``order[b, p]`` is the item at position p and ``group[b, p]`` numbers the tied groups 0, 1, ... in that order
    (padded items form groups of their own after the real ones)."""
    key = torch.where(m, s, s.new_tensor(-math.inf))
    order = torch.argsort(key, dim=-1, descending=True, stable=True)
    ks, ms = key.gather(-1, order), m.gather(-1, order)
    new = torch.ones_like(ms)
    # a padded item never joins a real one's group, even when no real item scores -inf (they cannot: finite)
    new[:, 1:] = (ks[:, 1:] != ks[:, :-1]) | (ms[:, 1:] != ms[:, :-1])
    return order, new.long().cumsum(-1) - 1


def _group_sum(group: Tensor, values: Tensor) -> Tensor:
    """Σ of ``values`` ``(B, n)`` (positions in sorted order) per tied group: ``(B, n)`` indexed by group."""
    return torch.zeros_like(values).scatter_add_(-1, group, values)


def _fill(values: Tensor, undefined: Tensor, fill: float) -> Tensor:
    return torch.where(undefined, values.new_tensor(fill), values)


def ndcg(scores: Tensor, relevance: Tensor, k: int | None = None, mask: Tensor | None = None, gain: str = "exp2",
         empty: str = "zero") -> Tensor:
    """Normalised discounted cumulative gain of each list, NDCG@k = DCG@k / ideal DCG@k.

    DCG@k = Σ_{r ≤ k} gain(rel of the item at rank r) / log2(r + 1) (Järvelin & Kekäläinen, ACM TOIS 2002; the
    log2(r + 1) discount and 2^rel − 1 gain of Burges et al., ICML 2005); the ideal DCG orders the items by
    relevance.

    Args:
        scores: ``(..., n)`` real (floating or integer); higher = ranked first.
        relevance: ``(..., n)`` graded labels, real and >= 0 for the real items.
        k: cut-off rank (an integer >= 1; k > n counts every item), or None for the whole list.
        mask: ``(..., n)`` bool, True = a real item; padded items are ignored entirely. None: all real.
        gain: ``"exp2"`` (default, 2^rel − 1: the learning-to-rank convention of LightGBM, allRank and the NDCG
            losses of :mod:`diffrank.losses.ranking`) or ``"linear"`` (rel itself, as scikit-learn's
            ``ndcg_score``). With binary labels both agree.
        empty: the value of a list whose ideal DCG is 0 (no relevant item among its real ones, or no real item):
            ``"zero"`` (default, as scikit-learn's ``ndcg_score``), ``"one"`` (LightGBM's and allRank's
            convention) or ``"nan"`` (to drop such lists with ``nanmean`` yourself).

    Ties: scores tied with each other share their group's mean gain (scikit-learn's ``ndcg_score``,
    ``ignore_ties=False``): the expected DCG over the orders that break the ties at random. A group that straddles
    rank k counts with the discounts of its positions up to k.

    Returns:
        ``(...)`` NDCG in [0, 1], float64 when ``scores`` or ``relevance`` is float64, else float32.

    Raises:
        TypeError: a non-tensor, complex or bool scores / relevance, a non-bool mask, a non-integer k.
        ValueError: mismatched shapes, 0-d inputs or n = 0, k < 1, NaN / inf or negative relevance among the real
            items, an unknown ``gain`` or ``empty``.
    """
    check_gain(gain)
    fill = check_policy(empty, "empty", EMPTY)
    k = None if k is None else check_int(k, "k", what="the cut-off rank")
    s, r, m, dtype = _prepare(scores, relevance, mask, ("scores", "relevance"), nonnegative=True)
    n = s.shape[-1]
    d = discounts(n, k, s.dtype, s.device).expand_as(s)
    g = gains(r, gain) * m
    order, group = _groups(s, m)
    gs = g.gather(-1, order)
    # mean gain of each tied group × the sum of the discounts of its positions (scikit-learn's _tie_averaged_dcg)
    count = _group_sum(group, torch.ones_like(gs))
    mean_gain = _group_sum(group, gs) / count.clamp_min(1)
    dcg = (mean_gain * _group_sum(group, d)).sum(-1)
    ideal = (g.sort(dim=-1, descending=True).values * d).sum(-1)
    out = dcg / torch.where(ideal > 0, ideal, 1.0)
    return _finish(_fill(out, ideal <= 0, fill), scores.shape, dtype)


def _relevant(r: Tensor, m: Tensor) -> Tensor:
    return (r > 0) & m


def recall_at_k(scores: Tensor, relevance: Tensor, k: int, mask: Tensor | None = None,
                empty: str = "zero") -> Tensor:
    """Recall@k of each list: the fraction of the relevant items (relevance > 0) ranked in the top k.

    Args:
        scores: ``(..., n)`` real; higher = ranked first.
        relevance: ``(..., n)`` labels, real and >= 0 for the real items; an item is relevant when its label is > 0.
        k: cut-off rank, an integer >= 1 (k > n counts every item).
        mask: ``(..., n)`` bool, True = a real item; padded items are ignored entirely.
        empty: the value of a list without a relevant item: ``"zero"`` (default), ``"one"`` or ``"nan"``.

    Ties: as :func:`ndcg`, a tied group straddling rank k counts the fraction of its positions within the top k
    (the expected recall when ties break at random).

    Returns:
        ``(...)`` recall in [0, 1]; float64 for float64 input, else float32.

    Raises:
        TypeError / ValueError: as :func:`ndcg` (k is required here).
    """
    fill = check_policy(empty, "empty", EMPTY)
    k = check_int(k, "k", what="the cut-off rank")
    s, r, m, dtype = _prepare(scores, relevance, mask, ("scores", "relevance"), nonnegative=True)
    rel = _relevant(r, m).to(s.dtype)
    order, group = _groups(s, m)
    rs = rel.gather(-1, order)
    top = (torch.arange(s.shape[-1], device=s.device) < k).to(s.dtype).expand_as(rs)
    count = _group_sum(group, torch.ones_like(rs))
    hits = (_group_sum(group, rs) / count.clamp_min(1) * _group_sum(group, top)).sum(-1)
    total = rel.sum(-1)
    out = hits / total.clamp_min(1)
    return _finish(_fill(out, total == 0, fill), scores.shape, dtype)


def mrr(scores: Tensor, relevance: Tensor, k: int | None = None, mask: Tensor | None = None,
        empty: str = "zero") -> Tensor:
    """Reciprocal rank of the first relevant item of each list (Voorhees, TREC-8 QA track 1999); average it over
    lists for the MRR.

    Args:
        scores: ``(..., n)`` real; higher = ranked first.
        relevance: ``(..., n)`` labels, real and >= 0 for the real items; relevant = label > 0.
        k: cut-off: a first relevant item ranked below k gives 0 (MRR@k); None for no cut-off.
        mask: ``(..., n)`` bool, True = a real item; padded items are ignored entirely.
        empty: the value of a list without a relevant item: ``"zero"`` (default, the TREC convention), ``"one"``
            or ``"nan"``.

    Ties: pessimistic: an item's rank is the number of real items scoring at least as high (scikit-learn's
    ``label_ranking_average_precision_score``, which equals 1/rank for a list with one relevant item).

    Returns:
        ``(...)`` reciprocal rank in [0, 1]; float64 for float64 input, else float32.

    Raises:
        TypeError / ValueError: as :func:`ndcg`.
    """
    fill = check_policy(empty, "empty", EMPTY)
    k = None if k is None else check_int(k, "k", what="the cut-off rank")
    s, r, m, dtype = _prepare(scores, relevance, mask, ("scores", "relevance"), nonnegative=True)
    rel = _relevant(r, m)
    best = torch.where(rel, s, s.new_tensor(-math.inf)).amax(-1, keepdim=True)
    rank = ((s >= best) & m).sum(-1).to(s.dtype)
    out = 1.0 / rank.clamp_min(1)
    if k is not None:
        out = torch.where(rank > k, 0.0, out)
    return _finish(_fill(out, ~rel.any(-1), fill), scores.shape, dtype)


def average_precision(scores: Tensor, relevance: Tensor, mask: Tensor | None = None, empty: str = "zero") -> Tensor:
    """Average precision of each list: the mean, over its relevant items (relevance > 0), of the precision at
    that item's rank (Manning, Raghavan, Schütze, Introduction to IR, 2008, §8.4); MAP is its mean over lists.

    Args:
        scores: ``(..., n)`` real; higher = ranked first.
        relevance: ``(..., n)`` labels, real and >= 0 for the real items; relevant = label > 0.
        mask: ``(..., n)`` bool, True = a real item; padded items are ignored entirely.
        empty: the value of a list without a relevant item: ``"zero"`` (default; scikit-learn's
            ``average_precision_score`` also returns 0 there, with a warning), ``"one"`` or ``"nan"``.

    Ties: pessimistic, as scikit-learn's ``average_precision_score`` (one threshold per distinct score): a tied
    group counts with the precision at its end, (relevant items scoring at least as high) / (items scoring at least
    as high).

    Returns:
        ``(...)`` average precision in [0, 1]; float64 for float64 input, else float32.

    Raises:
        TypeError / ValueError: as :func:`ndcg`.
    """
    fill = check_policy(empty, "empty", EMPTY)
    s, r, m, dtype = _prepare(scores, relevance, mask, ("scores", "relevance"), nonnegative=True)
    rel = _relevant(r, m).to(s.dtype)
    order, group = _groups(s, m)
    group_rel = _group_sum(group, rel.gather(-1, order))
    group_size = _group_sum(group, m.to(s.dtype).gather(-1, order))
    # groups are numbered in sorted order, so cumulative sums over the group index give the counts at each group's
    # end; unused group slots add zeros
    precision = group_rel.cumsum(-1) / group_size.cumsum(-1).clamp_min(1)
    total = rel.sum(-1)
    out = (group_rel * precision).sum(-1) / total.clamp_min(1)
    return _finish(_fill(out, total == 0, fill), scores.shape, dtype)


def average_ranks(values: Tensor, mask: Tensor | None = None) -> Tensor:
    """Ranks with ties averaged (1 = the largest; a tied group gets the mean of its positions), among the real
    items: ``scipy.stats.rankdata(-values, method="average")`` per list.

    Args:
        values: ``(B, n)`` float.
        mask: ``(B, n)`` bool or None; padded items get rank 0.

    Returns:
        ``(B, n)`` float ranks (dtype of ``values``); not differentiable (the ranks are piecewise constant).
    """
    m = torch.ones_like(values, dtype=torch.bool) if mask is None else mask
    order, group = _groups(values.detach(), m)
    pos = torch.arange(1, values.shape[-1] + 1, dtype=values.dtype, device=values.device).expand_as(values)
    mean_pos = _group_sum(group, pos) / _group_sum(group, torch.ones_like(pos)).clamp_min(1)
    ranks = torch.empty_like(values).scatter_(-1, order, mean_pos.gather(-1, group))
    return torch.where(m, ranks, 0.0)


def _constant(v: Tensor, m: Tensor) -> Tensor:
    """Whether the real entries of each row are all equal (or fewer than two): ``(B,)`` bool."""
    hi = torch.where(m, v, -math.inf).amax(-1)
    lo = torch.where(m, v, math.inf).amin(-1)
    return (m.sum(-1) < 2) | (hi == lo)


def spearman(x: Tensor, y: Tensor, mask: Tensor | None = None, undefined: str = "zero") -> Tensor:
    """Spearman's rank correlation ρ of each list: the Pearson correlation of the average ranks of x and y
    (Spearman 1904; ``scipy.stats.spearmanr`` per list).

    Args:
        x: ``(..., n)`` real.
        y: ``(..., n)`` real, the shape of ``x``.
        mask: ``(..., n)`` bool, True = a real item; padded items are ignored entirely.
        undefined: the value of a list where ρ is undefined (fewer than two real items, or all real x or all real
            y tied; scipy returns NaN with a warning there): ``"zero"`` (default) or ``"nan"``.

    Ties: average ranks (scipy's default).

    Returns:
        ``(...)`` ρ in [-1, 1]; float64 when x or y is float64, else float32.

    Raises:
        TypeError: non-tensor, complex or bool inputs, a non-bool mask.
        ValueError: mismatched shapes, 0-d inputs or n = 0, NaN / inf among the real items, an unknown ``undefined``.
    """
    fill = check_policy(undefined, "undefined", UNDEFINED)
    xs, ys, m, dtype = _prepare(x, y, mask, ("x", "y"), nonnegative=False)
    rx, ry = average_ranks(xs, m), average_ranks(ys, m)
    count = m.sum(-1, keepdim=True).clamp_min(1)
    cx = torch.where(m, rx - rx.sum(-1, keepdim=True) / count, 0.0)
    cy = torch.where(m, ry - ry.sum(-1, keepdim=True) / count, 0.0)
    bad = _constant(xs, m) | _constant(ys, m)
    den = torch.sqrt((cx * cx).sum(-1) * (cy * cy).sum(-1))
    out = ((cx * cy).sum(-1) / torch.where(bad, 1.0, den)).clamp(-1.0, 1.0)
    return _finish(_fill(out, bad, fill), x.shape, dtype)


def kendall_tau(x: Tensor, y: Tensor, mask: Tensor | None = None, undefined: str = "zero") -> Tensor:
    """Kendall's τ-b of each list (Kendall 1945): (concordant − discordant pairs) / √((pairs − pairs tied in x) ·
    (pairs − pairs tied in y)), ``scipy.stats.kendalltau``'s default ``variant="b"`` per list.

    O(n²) time; memory is bounded by working on chunks of lists (about 2^24 pairs at a time).

    Args:
        x: ``(..., n)`` real.
        y: ``(..., n)`` real, the shape of ``x``.
        mask: ``(..., n)`` bool, True = a real item; pairs with a padded item are ignored.
        undefined: the value of a list where τ-b is undefined (fewer than two real items, or all real x or all real
            y tied): ``"zero"`` (default) or ``"nan"``.

    Ties: τ-b: a pair tied in x (or y) counts neither as concordant nor as discordant and shrinks the normaliser.

    Returns:
        ``(...)`` τ-b in [-1, 1]; float64 when x or y is float64, else float32.

    Raises:
        TypeError / ValueError: as :func:`spearman`.

    Not :func:`diffrank.losses.resgro.kendall_tau`, the thesis's tie-free τ of ``(N, n)`` scores against values.
    """
    fill = check_policy(undefined, "undefined", UNDEFINED)
    xs, ys, m, dtype = _prepare(x, y, mask, ("x", "y"), nonnegative=False)
    n = xs.shape[-1]
    step = max(1, _PAIR_CHUNK // max(1, n * n))
    parts = []
    for lo in range(0, xs.shape[0], step):
        a, b, mm = xs[lo:lo + step], ys[lo:lo + step], m[lo:lo + step]
        pair = (mm.unsqueeze(-1) & mm.unsqueeze(-2)).to(a.dtype)
        sx = torch.sign(a.unsqueeze(-1) - a.unsqueeze(-2))
        sy = torch.sign(b.unsqueeze(-1) - b.unsqueeze(-2))
        # ordered pairs (i, j) and (j, i) both counted: every count doubles, τ does not change
        total = pair.sum((-1, -2)) - mm.sum(-1).to(a.dtype)  # the diagonal (i, i) is no pair
        untied_x = total - ((sx == 0) * pair).sum((-1, -2)) + mm.sum(-1).to(a.dtype)
        untied_y = total - ((sy == 0) * pair).sum((-1, -2)) + mm.sum(-1).to(a.dtype)
        parts.append(torch.stack([(sx * sy * pair).sum((-1, -2)), untied_x, untied_y], -1))
    if parts:
        num, ux, uy = torch.cat(parts).unbind(-1)
    else:
        num = ux = uy = xs.new_zeros(0)
    bad = (ux <= 0) | (uy <= 0)
    out = (num / torch.sqrt(torch.where(bad, 1.0, ux * uy))).clamp(-1.0, 1.0)
    return _finish(_fill(out, bad, fill), x.shape, dtype)
