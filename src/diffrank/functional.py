"""Functional API of the relaxed sorting / ranking / top-k operators, in torch's conventions.

``soft_sort``, ``soft_rank``, ``topk_membership`` and ``permutation_matrix`` take a tensor of any shape and
work along one dimension ``dim`` (default the last), like :func:`torch.sort`; ``soft_sort`` and ``soft_rank``
are **ascending** by default (the smallest value gets rank 1, as ``torch.argsort(x).argsort() + 1`` and
``torchsort.soft_rank``). ``descending=True`` gives exactly the operators' own convention (rank 1 = the
largest; :class:`~diffrank.operators.base.RankingOperator`, docs/conventions.md "Relaxed permutation matrix:
rows = ranks"), and the ascending results are obtained from it exactly:

- ascending soft-sorted values = the descending ones flipped along ``dim``;
- ascending soft rank = n + 1 − descending soft rank.

``method`` names an operator config (``diffrank.operators.available()`` lists them; their table is in
docs/api.md), built by :func:`diffrank.operators.load` with ``beta`` and the extra keyword ``**options``
(constructor arguments, e.g. ``sigmoid="cauchy"``, ``regularization="kl"``) replacing the config's values; built
operators are cached per (name, β, options), so a training loop does not rebuild one every call. A ``beta`` tensor that
requires grad (a learnable temperature, for the operators whose ``learnable_beta`` is True: docs/api.md,
"Learnable temperature") builds a fresh, uncached operator each call, so that ∂/∂β reaches the tensor; the other
methods refuse it with a ``ValueError``. ``method`` may also
be an already-built :class:`~diffrank.operators.base.RankingOperator`, used as is (then ``beta`` and
``**options`` must not be given). Operators built here are in evaluation mode: the stochastic methods
(``"gumbel_sinkhorn"``, ``"neuralsort_stochastic"``) then draw no noise unless ``noise=True`` is passed
(:mod:`diffrank.operators.gumbel`), and ``samples`` must stay 1 (the functions keep ``x``'s shape).

``hard=True`` is the straight-through estimator: the forward value is the exact hard result, the backward
pass the relaxation's gradient (``hard + (soft - soft.detach())``). Ties in the hard forward are broken as
``torch.sort(..., stable=True)`` breaks them: among equal values the one with the smaller index along ``dim``
comes first in the sorted order (it gets the smaller ascending rank, and the smaller descending rank with
``descending=True``; it wins a top-k place).

Every function raises what its operator raises, also :class:`~diffrank.operators.memory.DenseMemoryError` (a
``MemoryError``) where the rows of P a method forms would not fit in memory: the message names the O(n log n)
methods (``fast_soft_sort``, ``lapsum``, …; :mod:`diffrank.operators.memory`, ``DIFFRANK_MAX_DENSE_BYTES``).

Shapes: the dimension ``dim`` holds the n items; every other dimension is a batch dimension. Internally
``dim`` is moved last and the rest flattened into the ``(B, n)`` batch the operators take.
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
import types
from typing import Any, NamedTuple

import torch
from torch import Tensor

from diffrank._padding import per_length, real_items
from diffrank.operators import load
from diffrank.operators.base import RankingOperator, check_beta, data_checks_traced
from diffrank.operators.gumbel import GumbelSampling
from diffrank.registry import load_yaml, locate

__all__ = ["SoftTopkIndices", "permutation_matrix", "soft_argsort", "soft_median", "soft_quantile", "soft_rank",
           "soft_sort", "soft_take_along_dim", "soft_topk_indices", "topk_membership"]


_CACHE: dict[Any, str] = {}  # (method, options) -> the name of the built operator in _BUILT
_BUILT = types.SimpleNamespace()
_SERIAL = itertools.count()
_CACHE_SIZE = 64


def _operator(method: str | RankingOperator, beta: float | Tensor | None, options: dict[str, Any]) -> RankingOperator:
    """The operator ``method`` names (built by :func:`diffrank.operators.load`, cached) or ``method`` itself.

    Raises:
        ValueError: an operator instance together with ``beta`` or options; ``samples`` other than 1 (option or
            instance) for the Gumbel-sampling methods, which add a samples dimension; an unknown name (from ``load``,
            which lists the known ones); a bad β or option (from the operator's constructor), a β that requires
            grad for an operator that cannot learn it.
        TypeError: ``method`` neither a name nor a :class:`RankingOperator`.
    """
    if isinstance(method, RankingOperator):
        given = ([] if beta is None else ["beta"]) + sorted(options)
        if given:
            raise ValueError(f"method is an operator instance ({type(method).__name__}); {', '.join(given)} "
                             "must not be given with it (set them when building the operator)")
        if isinstance(method, GumbelSampling) and method.samples != 1:
            raise ValueError(f"method has samples={method.samples}: the functional API returns x's shape, without "
                             "the leading samples dimension; call the operator itself")
        return method
    if not isinstance(method, str):
        raise TypeError(f"method must be an operator name (str) or a RankingOperator, got {type(method).__name__}")
    if options.get("samples", 1) != 1 and issubclass(_target_class(method), GumbelSampling):
        raise ValueError(f"samples={options['samples']!r}: the functional API returns x's shape, without the leading "
                         "samples dimension of samples > 1; call the operator itself (diffrank.operators.load)")
    if isinstance(beta, Tensor) and beta.requires_grad and not beta.is_meta:
        # a learnable β: the operator keeps the tensor in the caller's graph, so a cached one would hold a stale
        # graph (and the refusal of a non-learnable operator comes from its constructor)
        return _build(method, {**options, "beta": beta})
    if beta is not None:
        options = {**options, "beta": check_beta(beta)}  # a float (the cache key), or beta's own error
    key = (method, tuple(sorted(options.items())))
    try:
        hash(key)
    except TypeError:  # an unhashable option value: build without caching
        return _build(method, options)
    return getattr(_BUILT, _cache_operator(key))


def _target_class(method: str) -> type:
    """The class the config ``method`` builds (``object`` for an unknown name: ``load`` names the error)."""
    try:
        return locate(load_yaml("operator", method)["_target_"])
    except (ValueError, FileNotFoundError, KeyError):
        return object


def _build(method: str, options: dict[str, Any]) -> RankingOperator:
    """``load(method, **options)`` in evaluation mode (the module docstring: no noise unless asked for)."""
    return load(method, **options).eval()


def _cache_operator(key: tuple[str, tuple[tuple[str, Any], ...]]) -> str:
    """Put the operator ``load(method, **dict(options))`` of ``key = (method, options)`` in the cache (built on a
    miss, the oldest entry dropped when full); returns the name of its attribute of ``_BUILT``.

    ``torch.compile`` runs this function at trace time and takes its result as a constant (the mark below is what
    ``torch._dynamo.assume_constant_result`` sets, set directly so that the library does not import dynamo):
    building an operator reads a yaml file and imports modules, which dynamo cannot trace, so a compiled function's
    first call would break the graph there (and ``fullgraph=True`` fail). The traced code then reads the operator
    as an attribute of ``_BUILT``, which dynamo reads afresh (a dict it has already read in the same frame it would
    not: a second method in one compiled function would miss)."""
    if key not in _CACHE:
        method, options = key
        op = _build(method, dict(options))
        if len(_CACHE) >= _CACHE_SIZE:
            delattr(_BUILT, _CACHE.pop(next(iter(_CACHE))))  # the oldest entry
        _CACHE[key] = f"op{next(_SERIAL)}"
        setattr(_BUILT, _CACHE[key], op)
    return _CACHE[key]


_cache_operator._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _clear_cache() -> None:
    """Drop every cached operator (tests: a fresh process's first call)."""
    for name in _CACHE.values():
        delattr(_BUILT, name)
    _CACHE.clear()


def _rows(x: Tensor, dim: int) -> tuple[Tensor, tuple[int, ...], int]:
    """``x`` with ``dim`` moved last and the other dims flattened: ``(B, n)``, the batch shape and ``dim``
    normalised to ``[0, x.dim())``.

    Raises:
        TypeError: ``x`` not a tensor; ``dim`` not an integer (``dim=1.0``). ValueError: a 0-dim ``x`` or n = 0.
        IndexError: ``dim`` out of range.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    try:
        if isinstance(dim, bool):  # an int to Python, a flag to the caller (torch.sort refuses it too)
            raise TypeError
        dim = operator.index(dim)  # ints and integer-likes (numpy.int64); 1.0 would fail later as a tuple index
    except TypeError:
        raise TypeError(f"dim must be an integer (the dimension that holds the items, as in torch.sort), got "
                        f"{dim!r} of type {type(dim).__name__}") from None
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the items along dim), got a 0-dim tensor")
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"dim = {dim} is out of range for a tensor with {x.dim()} dimensions")
    dim = dim % x.dim()
    n = x.shape[dim]
    if n == 0:
        raise ValueError(f"x must have at least one item along dim = {dim}, got shape {tuple(x.shape)}")
    moved = x.movedim(dim, -1)
    return moved.reshape(-1, n), tuple(moved.shape[:-1]), dim


def _real(x: Tensor, rows: Tensor, batch: tuple[int, ...], dim: int, mask: Tensor | None,
          lengths: Tensor | None) -> Tensor | None:
    """The ``(B, n)`` real items of ``x`` from ``mask`` / ``lengths`` (:func:`diffrank._padding.real_items`)."""
    def moved(m: Tensor) -> Tensor:
        """``mask`` (x's shape) as the scores were moved: ``(B, n)``; a mask of another shape raises ValueError."""
        if tuple(m.shape) != tuple(x.shape):
            raise ValueError(f"mask's shape must be x's {tuple(x.shape)}, got {tuple(m.shape)}")
        return m.movedim(dim, -1).reshape(rows.shape)

    return real_items(rows, mask, lengths, batch, moved)


def _restore(out: Tensor, batch: tuple[int, ...], dim: int) -> Tensor:
    """``(B, n)`` back to x's shape: the batch dims, then the items moved back to ``dim``."""
    return out.reshape(*batch, out.shape[-1]).movedim(-1, dim)


def _straight_through(hard: Tensor, soft: Tensor) -> Tensor:
    """Forward value ``hard`` exactly, gradient of ``soft``."""
    return hard + (soft - soft.detach())


def _hard_order(rows: Tensor, descending: bool) -> Tensor:
    """``(B, n)`` item indices in sorted order, ties by index (``torch.sort(stable=True)``)."""
    return torch.sort(rows.detach(), dim=-1, descending=descending, stable=True).indices


def _hard_ranks(rows: Tensor, descending: bool) -> Tensor:
    """Exact ranks 1..n as floats of ``rows``' dtype: the position + 1 of each item in the stable sort."""
    order = _hard_order(rows, descending)
    pos = torch.arange(1, rows.shape[-1] + 1, dtype=rows.dtype, device=rows.device).expand_as(rows)
    return torch.empty_like(rows).scatter_(-1, order, pos)


def soft_sort(x: Tensor, *, method: str | RankingOperator, beta: float | Tensor | None = None, descending: bool = False,
              dim: int = -1, hard: bool = False, key: Tensor | None = None, mask: Tensor | None = None,
              lengths: Tensor | None = None, **options: Any) -> Tensor:
    """Soft-sorted values along ``dim``, ascending unless ``descending`` (like ``torch.sort(x, dim).values``).

    The operator's soft sort is descending (``P @ s`` for an operator with a relaxed permutation P: NeuralSort,
    Grover et al. 2019, Eq. 5; SoftSort, Prillo & Eisenschlos 2020, Eq. 3; Sinkhorn, Cuturi et al. 2019, §3;
    sorting networks, Petersen et al. 2021, Eq. 1 / 2022, Eq. 3; relaxed bubble sort, Petersen 2022 thesis
    §2.3; the permutahedron projection of Blondel et al. 2020, §5 for ``"fast_soft_sort"``; LapSum,
    Struski et al. 2025, §3.2). ``descending=True`` returns it as is; the ascending result is that tensor
    flipped along ``dim`` (for ``"fast_soft_sort"`` with ``regularization="l2"`` this equals
    ``torchsort.soft_sort(x, regularization_strength=1/beta)``).

    Args:
        x: floating tensor (float16 / bfloat16 / float32 / float64; half precision is computed in float32)
            of any shape with at least one dimension; ``dim`` holds the n >= 1 items, every other dim is a
            batch dim. Finite values.
        method: an operator name (``diffrank.operators.available()``) or a built
            :class:`~diffrank.operators.base.RankingOperator` (then no ``beta`` / ``options``).
        beta: inverse temperature β > 0 (larger = closer to the hard sort); default None: the
            method's config β (``configs/operator/<method>.yaml``). For ``"fast_soft_sort"`` β = 1/ε, ε
            torchsort's ``regularization_strength``. A number, a NumPy scalar or one-element array, or a
            one-element tensor (a string or a bool raises ``ValueError``). A 0-d tensor that requires grad is a
            learnable β for the methods that support it (``learnable_beta``; others raise ``ValueError``),
            checked at every call; parametrise it as ``softplus(raw)`` (docs/api.md, "Learnable temperature").
        descending: False (default): ascending; True: descending (the operator convention).
        dim: the dimension to sort along.
        hard: straight-through: the forward value is ``torch.sort(x, dim, descending).values`` exactly, the
            gradient that of the soft sort.
        key: sort ``x`` by another tensor (torchsort's "sort by key", OTT's ``sort_with``): P is the relaxed
            permutation of ``key`` (any method with ``"permutation"``) and the result ``P @ x`` along ``dim``, so
            the softness of the key's order is carried to the values. ``key`` is a floating tensor whose shape is
            the leading part of ``x``'s (``x`` may have trailing dims: ``key (B, n)``, ``x (B, n, d)`` sorts d-dim
            items); ``dim`` indexes ``key``'s dims. Gradients reach both. With ``hard``, the forward value is
            ``x`` gathered in ``torch.sort(key, dim, descending, stable=True)``'s order.
        mask: bool tensor of ``x``'s shape, True = a real item: each set is computed on its real items only, in their
            order, exactly as the same set unpadded (values and gradients); padded items get no slot: the L sorted real
            values fill the first L places along ``dim``, the rest is 0 with no gradient; a set without real items
            zeros. One host read of the lengths, one operator call per distinct length. Default None: every item is
            real.
        lengths: integer tensor of the batch shape (``x``'s shape without ``dim``): right padding, the first
            ``lengths`` items along ``dim`` are real (instead of ``mask``).
        **options: constructor arguments of the operator replacing its config's (e.g. ``sigmoid="cauchy"``).

    Returns:
        Same shape and dtype as ``x``.

    Raises:
        TypeError: ``x`` not a tensor or not floating point (the operator's message); ``method`` of another type;
            a non-integer ``dim``.
        ValueError: a 0-dim ``x``, n = 0, non-finite values, an unknown method name, an operator instance with
            ``beta`` / options, a bad β / option, or an operator without ``"soft_sort"`` (e.g. ``"soft_topk"``,
            ``"difftopk_splitter"``; the operator's message lists what it provides); with ``key``: a ``key``
            whose shape is not the leading part of ``x``'s, or a method without ``"permutation"``.
        IndexError: ``dim`` out of range.
    """
    op = _operator(method, beta, options)
    if key is not None:
        if mask is not None or lengths is not None:
            raise ValueError("soft_sort with key takes no mask / lengths (sort the padded lists by a key whose "
                             "padded entries are the smallest, or gather their real items first)")
        return _sort_by_key(x, key, op, descending, dim, hard)
    rows, batch, dim = _rows(x, dim)
    real = _real(x, rows, batch, dim, mask, lengths)
    if real is not None:
        out = per_length(rows, real, lambda c, _: soft_sort(c, method=op, descending=descending, hard=hard),
                         "position", (rows.shape[-1],))
        return _restore(out, batch, dim)
    desc = op.soft_sort(rows)
    out = desc if descending else desc.flip(-1)
    if hard:
        out = _straight_through(torch.sort(rows.detach(), dim=-1, descending=descending, stable=True).values, out)
    return _restore(out, batch, dim)


def soft_rank(x: Tensor, *, method: str | RankingOperator, beta: float | Tensor | None = None, descending: bool = False,
              dim: int = -1, hard: bool = False, mask: Tensor | None = None, lengths: Tensor | None = None,
              **options: Any) -> Tensor:
    """Soft ranks in [1, n] along ``dim``; ascending by default: the smallest value gets rank 1.

    Ascending ranks are what ``torch.argsort(x, dim).argsort(dim) + 1`` and ``torchsort.soft_rank`` give;
    ``descending=True`` gives rank 1 to the largest value and equals the operator method
    ``op.soft_rank(scores)`` (for an operator with P, the expected rank Σ_r r · P[r, j]: Petersen et al.
    2022, §2; Blondel et al. 2020, §5 for ``"fast_soft_sort"``; Struski et al. 2025, Thm 3.2 for
    ``"lapsum"``). The ascending rank is n + 1 − the descending one, exactly. For ``"fast_soft_sort"`` with
    ``regularization="l2"`` (default), ``soft_rank(x, method="fast_soft_sort", beta=1/ε)`` equals
    ``torchsort.soft_rank(x, regularization_strength=ε)``; with ``"kl"`` the ascending result is still the
    reflection n + 1 − r of the descending one, which is not torchsort's ascending ``"kl"`` rank (the
    entropic projection is not symmetric under that reflection).

    Args:
        x: floating tensor of any shape with at least one dimension (see :func:`soft_sort`).
        method: an operator name or a built :class:`~diffrank.operators.base.RankingOperator`.
        beta: inverse temperature β > 0, default the config's (``"fast_soft_sort"``: β = 1/ε).
        descending: False (default): rank 1 = the smallest; True: rank 1 = the largest (operator convention).
        dim: the dimension that holds the items.
        hard: straight-through: the forward value is the exact ranks 1..n as floats, ties broken as
            ``torch.sort(x, dim, descending, stable=True)`` (the item with the smaller index gets the smaller
            rank), the gradient that of the soft ranks.
        mask: bool tensor of ``x``'s shape, True = a real item: each set is computed on its real items only, in their
            order, exactly as the same set unpadded (values and gradients); padded items get rank 0 (no rank; the real
            items' ranks lie in [1, L]) and no gradient, a set without real items zeros. One host read of the lengths,
            one operator call per distinct length. Default None: every item is real.
        lengths: integer tensor of the batch shape (``x``'s shape without ``dim``): right padding, the first
            ``lengths`` items along ``dim`` are real (instead of ``mask``).
        **options: constructor arguments of the operator (e.g. ``regularization="kl"``).

    Returns:
        Same shape and dtype as ``x``; along ``dim`` the ranks sum to n(n + 1)/2 for a doubly stochastic P and
        for ``"fast_soft_sort"`` / ``"lapsum"``.

    Raises:
        TypeError: ``x`` not a tensor or not floating point; ``method`` of another type; a non-integer ``dim``.
        ValueError: a 0-dim ``x``, n = 0, non-finite values, an unknown method, an operator instance with
            ``beta`` / options, a bad β / option, or an operator without ``"soft_rank"``.
        IndexError: ``dim`` out of range.
    """
    op = _operator(method, beta, options)
    rows, batch, dim = _rows(x, dim)
    real = _real(x, rows, batch, dim, mask, lengths)
    if real is not None:
        out = per_length(rows, real, lambda c, _: soft_rank(c, method=op, descending=descending, hard=hard), "item",
                         (rows.shape[-1],))
        return _restore(out, batch, dim)
    desc = op.soft_rank(rows)
    out = desc if descending else (rows.shape[-1] + 1) - desc
    if hard:
        out = _straight_through(_hard_ranks(rows, descending), out)
    return _restore(out, batch, dim)


def _is_integral(k: numbers.Real | Tensor) -> bool:
    """Whether every value of ``k`` is a whole number (reads a tensor ``k`` on the host)."""
    if isinstance(k, Tensor):
        return not k.is_floating_point() or bool(torch.equal(k, k.floor()))
    return float(k).is_integer()


def _topk_ks(k: int | float | Tensor, batch: tuple[int, ...]) -> Any:
    """:func:`topk_membership`'s ``k`` as the operator's ``ks``: ``[k]`` for a number or an integer 0-d tensor
    (read as an int), ``(1,)`` for a real 0-d tensor (one k for every set), ``(B, 1)`` for a tensor of the batch
    shape (one k per set).

    Raises:
        ValueError: a tensor on the meta device or of another shape.
    """
    if not isinstance(k, Tensor):
        return [k]
    if k.is_meta:
        raise ValueError("k is on the meta device: it has a shape but no values; pass a number or a tensor with "
                         "values")
    if k.dim() == 0 and not k.is_floating_point() and not k.is_complex() and k.dtype != torch.bool:
        return [int(k)]
    if k.dim() == 0:
        return k.reshape(1)  # one k for every set: (M = 1,)
    if tuple(k.shape) == batch:
        return k.reshape(-1, 1)  # one k per set: (B, M = 1)
    raise ValueError(f"k must be a number or a tensor of shape () or of the batch shape {batch} (x's shape "
                     f"without dim), got shape {tuple(k.shape)}")


def topk_membership(x: Tensor, k: int | float | Tensor, *, method: str | RankingOperator,
                    beta: float | Tensor | None = None, dim: int = -1, hard: bool = False, mask: Tensor | None = None,
                    lengths: Tensor | None = None, **options: Any) -> Tensor:
    """Probability that each item is among the k largest along ``dim``.

    For an operator with a relaxed permutation P (rows = ranks, rank 1 = largest) this is the inner sum of
    Petersen et al. 2022, Eq. 2, Σ_{r<=k} P[r, j]; ``"soft_topk"`` solves an entropic OT onto two anchors
    (Xie et al. 2020, Eq. 4); ``"lapsum"`` is p_j = F_α(Lap_s⁻¹(k) − s_j) (Struski et al. 2025, Thm 3.3),
    which takes real k and sums to k exactly. The same as ``op.topk_membership(scores, [k])[:, 0]``.

    Args:
        x: floating tensor of any shape with at least one dimension (see :func:`soft_sort`).
        k: the number of top items: an ``int`` in [1, n]; for a method that takes real k (``"lapsum"``) also
            a float in (0, n], or a tensor of shape ``()`` or of the batch shape (x's shape without ``dim``:
            one k per set), which may require grad (LapSum gives ∂/∂k). Integer 0-dim tensors are read as
            ints (for every method). Other methods refuse a non-integer k with their own ``TypeError``.
        method: an operator name or a built :class:`~diffrank.operators.base.RankingOperator`.
        beta: inverse temperature β > 0, default the config's.
        dim: the dimension that holds the items.
        hard: straight-through: the forward value is the exact 0/1 indicator of the k largest (ties broken as
            ``torch.sort(x, dim, descending=True, stable=True)``: the smaller index wins), the gradient that of
            the soft memberships. Needs a whole-number k.
        mask: bool tensor of ``x``'s shape, True = a real item: each set is computed on its real items only, in their
            order, exactly as the same set unpadded (values and gradients); padded items get membership 0 and no
            gradient, a set without real items zeros. One host read of the lengths, one operator call per distinct
            length. Default None: every item is real.
        lengths: integer tensor of the batch shape (``x``'s shape without ``dim``): right padding, the first
            ``lengths`` items along ``dim`` are real (instead of ``mask``).
            A set with L < k real items uses k = L (all its items are in its top k).
        **options: constructor arguments of the operator.

    Returns:
        Same shape and dtype as ``x``; along ``dim`` they sum to k (the top k rows of P sum to 1 each;
        LapSum and SOFT top-k by construction). Values lie in [0, 1], up to the column sums of a
        row-stochastic P (NeuralSort, SoftSort: columns sum to ≈ 1 only). The k *smallest* are
        ``topk_membership(-x, k, ...)``.

    Raises:
        TypeError: ``x`` not a tensor or not floating point; a k of the wrong type for the method (a per-row or
            real k is LapSum's: the message says so); a non-integer ``dim``.
        ValueError: a 0-dim ``x``, n = 0, non-finite values, k out of range, a tensor k of another shape or on the
            meta device, an unknown method, an operator instance with ``beta`` / options, an operator without
            ``"topk_membership"`` (e.g. ``"fast_soft_sort"``), or ``hard=True`` with a fractional k.
        IndexError: ``dim`` out of range.
    """
    op = _operator(method, beta, options)
    rows, batch, dim = _rows(x, dim)
    real = _real(x, rows, batch, dim, mask, lengths)
    if real is not None:
        def member(c: Tensor, idx: Tensor) -> Tensor:
            """The memberships of the sets ``idx`` ``(b, L)``, k capped at L."""
            kk = k.reshape(-1).to(idx.device)[idx] if isinstance(k, Tensor) and k.dim() > 0 else k
            kk = kk.clamp(max=c.shape[-1]) if isinstance(kk, Tensor) else min(kk, c.shape[-1])
            return topk_membership(c, kk, method=op, hard=hard)

        return _restore(per_length(rows, real, member, "item", (rows.shape[-1],)), batch, dim)
    out = op.topk_membership(rows, _topk_ks(k, batch))[:, 0]
    if hard:
        if not _is_integral(k):
            raise ValueError(f"hard=True needs a whole-number k (the hard top-k of a fractional k is undefined), "
                             f"got k = {k}")
        kk = k.reshape(-1, 1).to(rows.device) if isinstance(k, Tensor) and k.dim() > 0 else k
        hard_out = (_hard_ranks(rows, True) <= kk).to(rows.dtype)
        out = _straight_through(hard_out, out)
    return _restore(out, batch, dim)


def permutation_matrix(x: Tensor, *, method: str | RankingOperator, beta: float | Tensor | None = None,
                       k: int | None = None, dim: int = -1, hard: bool = False, mask: Tensor | None = None,
                       lengths: Tensor | None = None, **options: Any) -> Tensor:
    """Relaxed permutation matrix P in the project's convention: rows = ranks (row 0 = rank 1 = the largest),
    columns = items along ``dim``.

    P is NeuralSort's P̂ (Grover et al. 2019, Eq. 5), SoftSort's (Prillo & Eisenschlos 2020, Eq. 3), the
    scaled entropic-OT plan (Cuturi et al. 2019, §3), the product of a relaxed comparator network's layer
    matrices (Petersen et al. 2021, Eq. 1-2; top-k rows by the bidirectional evaluation of Petersen et al.
    2022, Eq. 3), the relaxed bubble sort's (Petersen 2022 thesis §2.3) or LapSum's (Struski et al. 2025,
    Def. 3.5). ``P @ v`` (v the items along ``dim``, as a column) is the soft sort in descending order; there is
    no ascending variant (flip the rows for one). Each row sums to 1.

    Args:
        x: floating tensor of any shape with at least one dimension (see :func:`soft_sort`).
        method: an operator name or a built :class:`~diffrank.operators.base.RankingOperator`.
        beta: inverse temperature β > 0, default the config's.
        k: ``None`` for all n rows, else only the top k rows (an int in [1, n]).
        dim: the dimension that holds the items.
        hard: straight-through: the forward value is the exact 0/1 permutation (``P[r, j] = 1`` iff item j is
            at position r of ``torch.sort(x, dim, descending=True, stable=True)``: ties by index), the gradient
            that of the relaxed P.
        mask: bool tensor of ``x``'s shape, True = a real item: each set is computed on its real items only, in their
            order, exactly as the same set unpadded (values and gradients); padded items get zero columns, and the rows
            of ranks past L are zero and no gradient, a set without real items zeros. One host read of the lengths, one
            operator call per distinct length. Default None: every item is real.
        lengths: integer tensor of the batch shape (``x``'s shape without ``dim``): right padding, the first
            ``lengths`` items along ``dim`` are real (instead of ``mask``).
        **options: constructor arguments of the operator.

    Returns:
        Shape ``(*batch, m, n)`` with ``batch`` = the dims of ``x`` other than ``dim``, in their order
        (e.g. ``x`` of shape ``(A, n, C)`` with ``dim=1`` → ``(A, C, m, n)``), ``m = n`` or ``k``, n the size of
        ``dim``; dtype of ``x``. ``P[..., r, j]``: the probability that item j has rank r + 1.

    Raises:
        TypeError: ``x`` not a tensor or not floating point; a non-integer k or ``dim``.
        ValueError: a 0-dim ``x``, n = 0, non-finite values, k outside [1, n], an unknown method, an operator
            instance with ``beta`` / options, or an operator without ``"permutation"`` (``"fast_soft_sort"``,
            ``"soft_topk"``, ``"difftopk_splitter"``).
        IndexError: ``dim`` out of range.
    """
    op = _operator(method, beta, options)
    rows, batch, dim = _rows(x, dim)
    real = _real(x, rows, batch, dim, mask, lengths)
    if real is not None:
        n = rows.shape[-1]
        p = per_length(rows, real, lambda c, _: permutation_matrix(
            c, method=op, k=None if k is None else min(k, c.shape[-1]), hard=hard), "matrix",
            (n if k is None else k, n))
        return p.reshape(*batch, *p.shape[-2:])
    p = op(rows, k)
    if hard:
        m = p.shape[-2]
        order = _hard_order(rows, True)[:, :m]
        hard_p = torch.zeros_like(p).scatter_(-1, order.unsqueeze(-1), 1.0)
        p = _straight_through(hard_p, p)
    return p.reshape(*batch, *p.shape[-2:])


# -- soft indices: sort by key, argsort, top-k indices, take along dim -------------------------------------------

def _rows_of_p(op: RankingOperator, rows: Tensor, k: int | None, descending: bool, hard: bool) -> Tensor:
    """``(B, m, n)`` rows of P of ``rows`` ``(B, n)``: the top m = k (or n) ranks, in ascending order of the values
    unless ``descending`` (the last m rows flipped), straight-through hard rows with ``hard``."""
    n = rows.shape[-1]
    m = n if k is None else k
    p = op(rows, m if descending else None)
    if not descending:
        p = p.flip(-2)[:, :m]  # rank n first: the smallest value
    if hard:
        order = _hard_order(rows, descending)[:, :m]
        p = _straight_through(torch.zeros_like(p).scatter_(-1, order.unsqueeze(-1), 1.0), p)
    return p


def _items_last(values: Tensor, lead: int, dim: int, n: int) -> tuple[Tensor, tuple[int, ...]]:
    """``values`` whose first ``lead`` dims hold the batch and the n items at ``dim`` as ``(B, n, T)`` (T the
    trailing dims flattened), and the trailing shape."""
    moved = values.movedim(dim, lead - 1)
    trail = tuple(moved.shape[lead:])
    return moved.reshape(-1, n, max(1, math.prod(trail))), trail


def _sort_by_key(x: Tensor, key: Tensor, op: RankingOperator, descending: bool, dim: int, hard: bool) -> Tensor:
    """:func:`soft_sort` with ``key``: ``P(key) @ x`` along ``dim`` (shapes in its docstring)."""
    if not isinstance(x, Tensor) or not isinstance(key, Tensor):
        raise TypeError(f"x and key must be torch.Tensors, got {type(x).__name__} and {type(key).__name__}")
    if tuple(x.shape[:key.dim()]) != tuple(key.shape):
        raise ValueError(f"key's shape {tuple(key.shape)} must be the leading part of x's {tuple(x.shape)} (x may "
                         "add trailing dims: key (B, n), x (B, n, d))")
    rows, batch, dim = _rows(key, dim)
    p = _rows_of_p(op, rows, None, descending, hard)
    return soft_take_along_dim(x, p.reshape(*batch, *p.shape[-2:]), dim)


def soft_argsort(x: Tensor, *, method: str | RankingOperator, beta: float | Tensor | None = None,
                 descending: bool = False, dim: int = -1, hard: bool = False, mask: Tensor | None = None,
                 lengths: Tensor | None = None, **options: Any) -> Tensor:
    """Soft ``torch.argsort``: at each sorted position the expected index of the item there, Σ_j P[r, j] · j
    (P the method's relaxed permutation, rows = sorted positions; Grover et al. 2019, Eq. 5 for NeuralSort, and
    the other methods of :func:`permutation_matrix`), ascending unless ``descending``.

    Args:
        x: floating tensor of any shape with at least one dimension (see :func:`soft_sort`).
        method: an operator name or a built operator with ``"permutation"``.
        beta: inverse temperature β > 0, default the config's.
        descending: False: position 0 holds the smallest value (``torch.argsort``'s default); True: the largest.
        dim: the dimension that holds the items.
        hard: straight-through: the forward value is ``torch.argsort(x, dim, descending, stable=True)`` as floats,
            the gradient that of the expected indices.
        mask, lengths: the real items of variable-length sets, as :func:`soft_rank` takes them; the rows of P are
            those of each set's real items (columns of padded items 0), and a sorted place past a set's L real
            items gets the index −1 (no item) with no gradient.
        **options: constructor arguments of the operator.

    Returns:
        Same shape as ``x``, dtype of ``x``: indices in [0, n − 1] (real numbers; equal to ``torch.argsort``'s
        where P is hard). Gather with :func:`soft_take_along_dim` and the rows of :func:`permutation_matrix`, not
        with these real indices.

    Raises:
        As :func:`permutation_matrix`.
    """
    op = _operator(method, beta, options)
    rows, batch, dim = _rows(x, dim)
    real = _real(x, rows, batch, dim, mask, lengths)
    p = _rows_of_p_per_set(op, rows, real, None, descending, hard)
    return _restore(_expected_index(p, real), batch, dim)


def _rows_of_p_per_set(op: RankingOperator, rows: Tensor, real: Tensor | None, k: int | None, descending: bool,
                       hard: bool) -> Tensor:
    """:func:`_rows_of_p` ``(B, k or n, n)``, of each set's real items when ``real`` ``(B, n)`` is given (k capped at a
    set's L; its other rows and columns 0)."""
    if real is None:
        return _rows_of_p(op, rows, k, descending, hard)
    n = rows.shape[-1]
    return per_length(rows, real, lambda c, _: _rows_of_p(op, c, None if k is None else min(k, c.shape[-1]),
                                                         descending, hard), "matrix", (n if k is None else k, n))


def _expected_index(p: Tensor, real: Tensor | None) -> Tensor:
    """Σ_j P[r, j] · j ``(B, m)`` of rows of P ``(B, m, n)``; −1 at the places past a set's real items."""
    index = p @ torch.arange(p.shape[-1], dtype=p.dtype, device=p.device)
    if real is None:
        return index
    places = torch.arange(p.shape[-2], device=p.device) < real.sum(-1, keepdim=True)
    return torch.where(places, index, torch.full_like(index, -1.0))


class SoftTopkIndices(NamedTuple):
    """What :func:`soft_topk_indices` returns: ``indices`` ``(*batch, k)`` (at ``dim``), the expected index at each
    of the k top places, and ``one_hot`` ``(*batch, k, n)``, the relaxed one-hot rows (the top k rows of P)."""

    indices: Tensor
    one_hot: Tensor


def soft_topk_indices(x: Tensor, k: int, *, method: str | RankingOperator, beta: float | Tensor | None = None,
                      dim: int = -1, hard: bool = False, mask: Tensor | None = None, lengths: Tensor | None = None,
                      **options: Any) -> SoftTopkIndices:
    """Soft ``torch.topk(x, k, dim).indices``: the top k rows of the relaxed permutation (relaxed one-hot vectors
    of the items at places 1..k, largest first; Petersen et al. 2022, Eq. 3 for the networks' k rows) and the
    expected index at each place.

    Args:
        x: floating tensor of any shape with at least one dimension (see :func:`soft_sort`).
        k: the number of places, an int in [1, n].
        method: an operator name or a built operator with ``"permutation"``.
        beta: inverse temperature β > 0, default the config's.
        dim: the dimension that holds the items.
        hard: straight-through: the forward values are ``torch.topk(x, k, dim)``'s indices (ties as
            ``torch.sort(stable=True)``: the smaller index first) and their one-hot rows, the gradient that of the
            relaxed rows.
        mask, lengths: the real items of variable-length sets, as :func:`soft_rank` takes them; the rows of P are
            those of each set's real items (columns of padded items 0), and a top place past a set's L real
            items gets the index −1 (no item) with no gradient.
        **options: constructor arguments of the operator.

    Returns:
        :class:`SoftTopkIndices` ``(indices, one_hot)``: ``indices`` has ``x``'s shape with k at ``dim``;
        ``one_hot`` is ``(*batch, k, n)`` as :func:`permutation_matrix` (batch = the dims of ``x`` other than
        ``dim``); dtype of ``x``. ``soft_take_along_dim(v, one_hot, dim)`` gathers values or embeddings.

    Raises:
        As :func:`permutation_matrix` (``k`` outside [1, n], a method without ``"permutation"``, …).
    """
    op = _operator(method, beta, options)
    rows, batch, dim = _rows(x, dim)
    real = _real(x, rows, batch, dim, mask, lengths)
    p = _rows_of_p_per_set(op, rows, real, k, True, hard)
    return SoftTopkIndices(_restore(_expected_index(p, real), batch, dim), p.reshape(*batch, *p.shape[-2:]))


def soft_take_along_dim(values: Tensor, one_hot: Tensor, dim: int = -1) -> Tensor:
    """Soft ``torch.take_along_dim``: the rows of ``one_hot`` (relaxed one-hot vectors over the n items, e.g. from
    :func:`soft_topk_indices` or :func:`permutation_matrix`) applied to the items of ``values`` along ``dim``.

    Args:
        values: tensor whose shape is ``(*batch, n)`` with the items at ``dim`` (``batch`` = the other dims, as
            :func:`permutation_matrix` orders them), plus any trailing dims after the first ``len(batch) + 1``
            (``(B, n, d)`` embeddings with ``dim=1``).
        one_hot: ``(*batch, m, n)`` weights; each row picks (a mixture of) items.
        dim: the dimension of ``values`` that holds the n items.

    Returns:
        ``values``'s shape with m instead of n at ``dim``; the dtype of ``values`` and ``one_hot`` promoted.
        Differentiable with respect to both.

    Raises:
        TypeError: arguments that are not tensors. ValueError: shapes that do not match as above.
        IndexError: ``dim`` out of range.
    """
    if not isinstance(values, Tensor) or not isinstance(one_hot, Tensor):
        raise TypeError(f"values and one_hot must be torch.Tensors, got {type(values).__name__} and "
                        f"{type(one_hot).__name__}")
    lead = one_hot.dim() - 1  # batch dims + the items' dim
    if lead < 1 or values.dim() < lead:
        raise ValueError(f"one_hot must be (*batch, m, n) and values have at least its batch dims + 1, got "
                         f"{tuple(one_hot.shape)} and {tuple(values.shape)}")
    if not -lead <= dim < lead:
        raise IndexError(f"dim = {dim} is out of range for the {lead} leading dims of values")
    dim %= lead
    n = one_hot.shape[-1]
    batch = tuple(one_hot.shape[:-2])
    moved = values.movedim(dim, lead - 1)
    if tuple(moved.shape[:lead]) != (*batch, n):
        raise ValueError(f"values (items at dim {dim}) {tuple(values.shape)} do not match one_hot "
                         f"{tuple(one_hot.shape)}: expected batch {batch} and n = {n}")
    v, trail = _items_last(values, lead, dim, n)
    w = one_hot.reshape(-1, *one_hot.shape[-2:])
    dtype = torch.promote_types(v.dtype, w.dtype)
    out = (w.to(dtype) @ v.to(dtype)).reshape(*batch, one_hot.shape[-2], *trail)
    return out.movedim(lead - 1, dim)


def _check_q(q: float | Tensor, like: Tensor) -> tuple[Tensor, bool]:
    """The quantile levels as a 1-D tensor of ``like``'s dtype and device, and whether ``q`` was a scalar.

    Raises:
        TypeError: ``q`` neither a real number nor a floating tensor (an integer, bool or complex tensor, a bool, a
            string, …).
        ValueError: a tensor ``q`` with more than one dimension; a level outside [0, 1] or NaN (one host read of a
            tensor ``q``, skipped under ``torch.compile`` / ``vmap``).
    """
    if isinstance(q, Tensor):
        if not q.is_floating_point():
            raise TypeError(f"q must be a float or a floating-point tensor, got a tensor of dtype {q.dtype}")
        if q.dim() > 1:
            raise ValueError(f"q must be a number, a 0-d or a 1-d tensor, got shape {tuple(q.shape)}")
        if q.is_meta:
            raise ValueError("q is on the meta device: it has a shape but no values. Pass the levels as a float or a "
                             "tensor with values (on any device: it is cast to x's)")
        scalar, levels = q.dim() == 0, q.reshape(-1).to(device=like.device, dtype=like.dtype)
        if not data_checks_traced(q) and not bool(((q >= 0) & (q <= 1)).all()):  # NaN fails both comparisons
            raise ValueError(f"q must lie in [0, 1], got {q.detach().cpu().tolist()}")
        return levels, scalar
    if isinstance(q, bool) or not isinstance(q, numbers.Real):
        raise TypeError(f"q must be a float in [0, 1] or a floating-point tensor, got {type(q).__name__} {q!r}")
    if not 0 <= q <= 1:  # NaN too
        raise ValueError(f"q must lie in [0, 1], got {q}")
    return torch.tensor([float(q)], dtype=like.dtype, device=like.device), True


def soft_quantile(x: Tensor, q: float | Tensor, *, method: str | RankingOperator, beta: float | Tensor | None = None,
                  dim: int = -1, keepdim: bool = False, hard: bool = False, mask: Tensor | None = None,
                  lengths: Tensor | None = None, **options: Any) -> Tensor:
    """Soft q-quantiles along ``dim``, interpolated as ``torch.quantile(x, q, dim, keepdim)`` (``"linear"``) does,
    on the method's soft-sorted values.

    With v the ascending soft sort along ``dim`` (:func:`soft_sort`) and h = q · (n − 1), the quantile is
    ``torch.lerp(v[⌊h⌋], v[min(⌊h⌋ + 1, n − 1)], h − ⌊h⌋)``, torch's linear interpolation between the order statistics
    (Hyndman & Fan 1996, definition 7). Where the soft sort tends to the sort (β → ∞), the result tends to
    ``torch.quantile``; ``hard=True`` (the straight-through soft sort) gives ``torch.quantile``'s values with the
    relaxation's gradient, and so does a sorting network with ``error_free=True``. The gradient reaches the values
    through the relaxed permutation (every item, not only the two order statistics) and ``q`` through h − ⌊h⌋.

    Args:
        x: floating tensor of any shape with at least one dimension (see :func:`soft_sort`).
        q: the level(s) in [0, 1]: a Python float, or a floating tensor of shape ``()`` or ``(m,)`` (any floating
            dtype and device: it is cast to ``x``'s), which may require grad. A tensor's range is checked by one host
            read, which ``vmap`` and ``torch.compile`` skip; there h is clamped to [0, n − 1], so a level outside
            [0, 1] gives the soft minimum or maximum (never a value extrapolated beyond them), a NaN level NaN.
        method: any method that provides ``"soft_sort"`` (an operator name or a built operator); the others raise.
        beta: inverse temperature β > 0, default the config's.
        dim: the dimension that holds the items.
        keepdim: keep ``dim`` with size 1, as ``torch.quantile``.
        hard: straight-through: the forward values are ``torch.quantile``'s.
        mask, lengths: the real items of variable-length sets, as :func:`soft_rank` takes them: each set's quantile
            is that of its L real items (h = q · (L − 1)); a set without real items gets 0.
        **options: constructor arguments of the operator.

    Returns:
        ``torch.quantile``'s shape: ``x``'s shape without ``dim`` (with size 1 there if ``keepdim``), with a leading
        dimension of size m for a 1-d ``q``; dtype of ``x``.

    Raises:
        TypeError: ``x`` not a floating tensor; ``q`` not a real number or floating tensor (integer / bool tensors,
            bools, strings).
        ValueError: ``q`` outside [0, 1] or NaN (eagerly), ``q`` with more than one dimension or on the meta device,
            non-finite ``x``, an unknown method or an operator without ``"soft_sort"`` (the message lists what it
            provides), and the errors of :func:`soft_sort`.
        IndexError: ``dim`` out of range.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    levels, scalar = _check_q(q, x)
    op = _operator(method, beta, options)
    rows, batch, dim = _rows(x, dim)
    real = _real(x, rows, batch, dim, mask, lengths)
    if real is None:
        out = _quantiles(soft_sort(rows, method=op, hard=hard), levels)
    else:
        out = per_length(rows, real, lambda c, _: _quantiles(soft_sort(c, method=op, hard=hard), levels),
                         "position", (levels.shape[0],))
    out = out.reshape(*batch, levels.shape[0])
    if keepdim:
        out = out.unsqueeze(dim)  # the items' dimension back as size 1, the levels last
    out = out.movedim(-1, 0)  # (m, ...), torch.quantile's layout
    return out[0] if scalar else out


def _quantiles(v: Tensor, levels: Tensor) -> Tensor:
    """``torch.quantile``'s linear interpolation ``(B, m)`` of ascending values ``v`` ``(B, n)`` at ``levels``
    ``(m,)`` (Hyndman & Fan 1996, definition 7)."""
    n = v.shape[-1]
    # clamped to [0, n - 1]: a level outside [0, 1] that the range check could not read (vmap, torch.compile) gives
    # the minimum or maximum, never a value extrapolated past them; a NaN level stays NaN (the weight below)
    h = (levels * (n - 1)).clamp(0, n - 1)
    lo = h.detach().nan_to_num(0.0).floor().long()
    hi = (lo + 1).clamp(max=n - 1)
    return torch.lerp(v[..., lo], v[..., hi], (h - lo.to(h.dtype)).expand(*v.shape[:-1], -1))


def soft_median(x: Tensor, *, method: str | RankingOperator, beta: float | Tensor | None = None, dim: int = -1,
                keepdim: bool = False, hard: bool = False, mask: Tensor | None = None, lengths: Tensor | None = None,
                **options: Any) -> Tensor:
    """Soft median along ``dim``: :func:`soft_quantile` at q = 0.5, i.e. ``torch.quantile(x, 0.5, dim, keepdim)`` in
    the hard limit, the mean of the two middle values for an even n (``torch.median`` returns the lower one).

    Args:
        x, method, beta, dim, keepdim, hard, mask, lengths, **options: as :func:`soft_quantile`.

    Returns:
        ``x``'s shape without ``dim`` (size 1 there if ``keepdim``), dtype of ``x``.

    Raises:
        As :func:`soft_quantile`.
    """
    return soft_quantile(x, 0.5, method=method, beta=beta, dim=dim, keepdim=keepdim, hard=hard, mask=mask,
                         lengths=lengths, **options)
