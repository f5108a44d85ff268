"""The official LapSum package's API (gmum/LapSum, Struski et al., ICML 2025) on diffrank's :class:`LapSum`.

Porting is one changed import::

    from lapsum.topk import soft_topk, log_soft_topk     ->  from diffrank.compat.lapsum import soft_topk, ...
    from lapsum.rank import soft_rank                    ->  from diffrank.compat.lapsum import soft_rank
    from lapsum.sort import soft_sort                    ->  from diffrank.compat.lapsum import soft_sort
    from lapsum.permute import cross_entropy             ->  from diffrank.compat.lapsum import cross_entropy

The official conventions, kept here (docs/conventions.md: α = -1/β for the largest first):

- ``alpha``: the Laplace scale; a number or a one-element tensor, which may require grad (its gradient is exact:
  diffrank's β = 1/|α| is a learnable temperature). Top-k: only |α| counts, ``largest`` picks the direction.
  Rank / sort: the sign is the direction, α < 0 largest first (the official default α = -1).
  ``cross_entropy``: α > 0 (default 1; the official code fails for α < 0).
- Ranks are 0-based (the official extension's: 0 = the first position), where diffrank's soft ranks start at 1.
- ``k`` is real, in (0, n], a tensor shaped like ``x`` but for ``dim`` (its size there, m, is the number of ks).

One difference: the official functions overwrite a tensor ``alpha`` in place with -|α| or |α| (``alpha.data =``);
these leave it as it is (the gradient is the derivative with respect to the tensor the caller holds).
"""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np
import torch
from torch import Tensor

from diffrank.operators.base import data_checks_traced
from diffrank.operators.lapsum import LapSum, log_interval_mass, log_laplace_cdf

__all__ = ["soft_topk", "log_soft_topk", "soft_rank", "soft_sort", "cross_entropy"]


def _alpha(alpha: float | Tensor, who: str) -> float | Tensor:
    """α validated: a non-zero finite real number, as a float, or the 0-d tensor of a tensor ``alpha``.

    Raises:
        ValueError: not one real number (a string, a bool, a complex or integer tensor, an array or tensor of several
            elements, a tensor on the meta device), zero, or not finite.
    """
    if isinstance(alpha, np.ndarray):
        if alpha.size != 1:
            raise ValueError(f"{who}: alpha must be one number, got an array of shape {alpha.shape}")
        alpha = alpha.reshape(()).item()
    if isinstance(alpha, Tensor):
        if alpha.numel() != 1 or not alpha.is_floating_point():
            raise ValueError(f"{who}: alpha must be one floating number, got shape {tuple(alpha.shape)}, "
                             f"dtype {alpha.dtype}")
        if alpha.is_meta:
            raise ValueError(f"{who}: alpha is on the meta device: it has a shape but no value; pass a float or a "
                             "tensor with a value")
        return alpha.reshape(())
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
        raise ValueError(f"{who}: alpha must be a non-zero finite number, got {alpha!r} of type "
                         f"{type(alpha).__name__}")
    value = float(alpha)
    if value == 0 or not math.isfinite(value):
        raise ValueError(f"{who}: alpha must be a non-zero finite number, got {alpha!r}")
    return value


def _beta(alpha: float | Tensor, who: str) -> float | Tensor:
    """β = 1/|α| (a tensor keeps its graph); α validated by :func:`_alpha` (one read of a tensor's value)."""
    a = _alpha(alpha, who)
    if isinstance(a, Tensor):
        value = float(a.detach())
        if value == 0 or not math.isfinite(value):
            raise ValueError(f"{who}: alpha must be a non-zero finite number, got {value}")
        return 1.0 / a.abs() if a.requires_grad else 1.0 / abs(value)
    return 1.0 / abs(a)


def _sign(alpha: float | Tensor) -> float:
    a = _alpha(alpha, "alpha")
    return math.copysign(1.0, float(a.detach()) if isinstance(a, Tensor) else a)


def _dim(dim: int, x: Tensor) -> int:
    """``dim`` as an index in ``[0, x.dim())``, as torch checks it.

    Raises:
        TypeError: ``dim`` not an integer (``1.0``, a string).
        IndexError: ``dim`` outside ``[-x.dim(), x.dim())`` (never wrapped round: ``dim=2`` of a 2-D ``x`` is not
            its rows).
    """
    try:
        if isinstance(dim, bool):
            raise TypeError
        dim = operator.index(dim)  # ints and integer-likes (numpy.int64)
    except TypeError:
        raise TypeError(f"dim must be an integer (the dimension that holds the items), got {dim!r} of type "
                        f"{type(dim).__name__}") from None
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"dim = {dim} is out of range for x with {x.dim()} dimensions (expected in "
                         f"[{-x.dim()}, {x.dim() - 1}])")
    return dim % x.dim()


def _rows(x: Tensor, dim: int) -> tuple[Tensor, tuple]:
    """``x`` with ``dim`` last, flattened to rows ``(R, n)``, and what :func:`_unrows` needs.

    Raises:
        TypeError: ``x`` not a floating tensor, ``dim`` not an integer. ValueError: a 0-dim ``x``. IndexError:
            ``dim`` out of range (:func:`_dim`).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point (float16 / bfloat16 / float32 / float64), got dtype {x.dtype}")
    dim = _dim(dim, x)
    moved = x.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]), (dim, moved.shape)


def _unrows(y: Tensor, meta: tuple) -> Tensor:
    dim, shape = meta
    return y.reshape(shape).movedim(-1, dim)


def _topk_args(x: Tensor, k: Tensor | float, dim: int) -> tuple[Tensor, Tensor, tuple, int]:
    """Rows of x ``(R, n)``, ks ``(R, m)``, the layout, and m (the official shape rules)."""
    rows, meta = _rows(x, dim)
    d = meta[0]
    if not isinstance(k, Tensor):
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Real):
            raise TypeError(f"k must be a real number or a tensor shaped like x but of size m along dim = {d} (m ks "
                            f"per row), got {type(k).__name__} {k!r}; several ks per row are a tensor, e.g. "
                            "torch.tensor([1.0, 2.0]).expand(B, 2) for a 2-D x (B, n)")
        k = torch.tensor(float(k), dtype=x.dtype, device=x.device)
    elif k.is_complex() or k.dtype == torch.bool:
        raise TypeError(f"k must be a real tensor, got dtype {k.dtype}")
    if k.dim() == x.dim() - 1:
        k = k.unsqueeze(d)
    if k.dim() == 0:
        k = k.reshape([1] * x.dim())
    if k.dim() != x.dim():
        raise ValueError(f"k must have the dimensions of x (or one fewer), got k {tuple(k.shape)}, x {tuple(x.shape)}")
    m = k.shape[d]
    target = list(x.shape)
    target[d] = m
    try:
        k = k.expand(target)
    except RuntimeError:
        raise ValueError(f"k must match x except along dim = {d}: k {tuple(k.shape)}, x {tuple(x.shape)}") from None
    if m != 1 and x.dim() != 2:
        raise ValueError(f"several ks per row (m = {m}) need a 2-D x (the official output is (B, m, n) only there)")
    return rows, k.movedim(d, -1).reshape(-1, m).to(x.dtype), meta, m


def _topk_out(p: Tensor, meta: tuple, m: int) -> Tensor:
    """``(R, m, n)`` memberships in the official layout: x's shape for m = 1, ``(B, m, n)`` for a 2-D x."""
    return _unrows(p[:, 0], meta) if m == 1 else p


def soft_topk(x: Tensor, k: Tensor | float, alpha: float | Tensor, dim: int = 1, largest: bool = True) -> Tensor:
    """Soft top-k memberships, the official ``lapsum.topk.soft_topk`` (Struski et al. 2025, Thm 3.3).

    p_i = F_α(b - x_i) with Σ_i p_i = k, F_α the Laplace CDF of scale α = -|alpha| (``largest``) or +|alpha|.

    Args:
        x: ``(..., n, ...)`` floating scores, n along ``dim``.
        k: real ks in (0, n]: a tensor shaped like ``x`` but of size m along ``dim`` (or without that dimension, or
            a number); may require grad.
        alpha: the scale (no default, as in the official package); only |alpha| counts. A tensor may require grad.
        dim: the dimension of the items (official default 1).
        largest: True (official default): the k largest get membership near 1; False: the k smallest.

    Returns:
        ``x``'s shape for m = 1; ``(B, m, n)`` for a 2-D ``x`` ``(B, n)`` and m ks per row (the official layout).

    Raises:
        ValueError / TypeError: alpha not one non-zero finite number, k not a real number or real tensor, k of
            another shape or outside (0, n], a non-integer ``dim``, bad scores (as :meth:`LapSum.topk_membership`).
        IndexError: ``dim`` outside ``[-x.dim(), x.dim())``.
    """
    rows, ks, meta, m = _topk_args(x, k, dim)
    op = LapSum(_beta(alpha, "soft_topk"))
    return _topk_out(op.topk_membership(rows if largest else -rows, ks), meta, m)


def log_soft_topk(x: Tensor, k: Tensor | float, alpha: float | Tensor, dim: int = 1, largest: bool = True) -> Tensor:
    """log of :func:`soft_topk`, the official ``lapsum.topk.log_soft_topk``, without underflow:
    log F(β(x - b)) in closed form (x - b far below the threshold gives a finite log, not log 0).

    Args, returns and errors: as :func:`soft_topk` (logsumexp over ``dim`` of the result is log k).
    """
    rows, ks, meta, m = _topk_args(x, k, dim)
    n = rows.shape[-1]
    beta = _beta(alpha, "log_soft_topk")
    op = LapSum(beta)
    s = rows if largest else -rows
    if not data_checks_traced(ks) and not bool(((ks > 0) & (ks <= n)).all()):  # no read under vmap / compile
        raise ValueError(f"k must satisfy 0 < k <= n = {n}")
    live = ks < n
    b = op.inverse(s, torch.where(live, ks, n / 2))  # validates the scores; k = n: log p = 0
    logp = log_laplace_cdf(beta * (s.unsqueeze(-2) - b.unsqueeze(-1)))
    return _topk_out(torch.where(live.unsqueeze(-1), logp, 0.0), meta, m)


def soft_rank(x: Tensor, alpha: float | Tensor = -1, dim: int = 1) -> Tensor:
    """Soft ranks, the official ``lapsum.rank.soft_rank`` (Thm 3.2): 0-based, 0 = the largest for α < 0
    (official default α = -1), 0 = the smallest for α > 0; R_i = Σ_{j≠i} F(β(x_j - x_i)) for α < 0, β = 1/|α|.

    Args:
        x: floating scores, items along ``dim`` (official: 2-D, default dim 1).
        alpha: scale, non-zero; sign = direction; a tensor may require grad.
        dim: the items' dimension.

    Returns:
        ``x``'s shape; each row sums to n(n - 1)/2.

    Raises:
        ValueError / TypeError: alpha not one non-zero finite number, a non-integer ``dim``, bad scores (as
            :meth:`LapSum.soft_rank`).
        IndexError: ``dim`` outside ``[-x.dim(), x.dim())``.
    """
    rows, meta = _rows(x, dim)
    op = LapSum(_beta(alpha, "soft_rank"))
    return _unrows(op.soft_rank(rows if _sign(alpha) < 0 else -rows) - 1, meta)


def soft_sort(x: Tensor, alpha: float | Tensor = -1, dim: int = 1) -> Tensor:
    """Soft sort, the official ``lapsum.sort.soft_sort`` (§3.2): descending for α < 0 (official default α = -1),
    ascending for α > 0; value i = Lap⁻¹(i + ½), β = 1/|α|.

    Args:
        x: floating scores, items along ``dim`` (official: 2-D, default dim 1).
        alpha: scale, non-zero; sign = direction; a tensor may require grad.
        dim: the items' dimension.

    Returns:
        ``x``'s shape.

    Raises:
        ValueError / TypeError: alpha not one non-zero finite number, a non-integer ``dim``, bad scores (as
            :meth:`LapSum.soft_sort`).
        IndexError: ``dim`` outside ``[-x.dim(), x.dim())``.
    """
    rows, meta = _rows(x, dim)
    op = LapSum(_beta(alpha, "soft_sort"))
    out = op.soft_sort(rows) if _sign(alpha) < 0 else -op.soft_sort(-rows)
    return _unrows(out, meta)


def cross_entropy(x: Tensor, target: Tensor, alpha: float | Tensor = 1, reduction: str = "mean") -> Tensor:
    """The soft-permutation cross-entropy, the official ``lapsum.permute.cross_entropy`` (§3.4, §5.2):
    -Σ_i log P[i, target_i] per row, P the doubly stochastic LapSum matrix with position 0 = the smallest score
    (α > 0; P[i, t] = F_α(b_t - x_i) - F_α(b_{t-1} - x_i), b_t = Lap⁻¹(t + 1)), in log space (no underflow).

    Args:
        x: ``(B, n)`` floating scores.
        target: ``(B, n)`` integer positions in [0, n): the ascending rank of each item.
        alpha: scale > 0 (official default 1); a tensor may require grad.
        reduction: ``"mean"`` (official default) or ``"sum"`` over rows; anything else gives the ``(B,)`` losses.

    Returns:
        A scalar, or ``(B,)``.

    Raises:
        ValueError / TypeError: alpha <= 0 or not finite, x not 2-D, a target of another shape, not integer or out
            of range, bad scores.
    """
    if _sign(alpha) < 0:
        raise ValueError("cross_entropy: alpha must be > 0 (position 0 = the smallest; the official code fails too)")
    beta = _beta(alpha, "cross_entropy")
    if not isinstance(target, Tensor) or target.is_floating_point() or target.shape != getattr(x, "shape", None):
        raise ValueError(f"cross_entropy: target must be an integer tensor shaped like x {tuple(x.shape)}")
    B, n = x.shape if x.dim() == 2 else (None, None)
    if B is None:
        raise ValueError(f"cross_entropy: x must be 2-D (B, n), got shape {tuple(x.shape)}")
    if n < 2:
        return x.new_zeros(() if reduction in ("mean", "sum") else (B,)) + 0 * x.sum()
    if not bool(((target >= 0) & (target < n)).all()):
        raise ValueError(f"cross_entropy: target positions must lie in [0, {n})")
    op = LapSum(beta)
    b = op.inverse(x, torch.arange(1, n, dtype=x.dtype, device=x.device))  # b_j = Lap⁻¹(j), decreasing, (B, n - 1)
    inf = torch.full_like(b[:, :1], math.inf)
    edges = torch.cat([inf, beta * b, -inf], dim=-1)  # β b_0 = +inf, ..., β b_n = -inf (β·inf: a NaN ∂/∂β)
    row = n - target.long()  # diffrank's rank (1 = largest) of position t (0 = smallest)
    s = beta * x
    logp = log_interval_mass(s - edges.gather(-1, row - 1), s - edges.gather(-1, row))
    loss = -logp.sum(-1)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss
