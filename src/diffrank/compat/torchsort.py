"""torchsort's ``soft_rank`` / ``soft_sort`` (teddykoker/torchsort 0.1.10) on diffrank's fast soft sort: porting is
``import diffrank.compat.torchsort as torchsort``.

Same signature, defaults and results as torchsort (Blondel et al. 2020, §5; torchsort's README):

- ``regularization="l2"`` (quadratic) or ``"kl"`` (entropic), default ``"l2"``;
- ``regularization_strength`` ε, default 1.0; diffrank's inverse temperature is **β = 1/ε**
  (``diffrank.functional.soft_rank(x, method="fast_soft_sort", beta=1/ε)``);
- **ascending**: rank 1 = the smallest value, the soft sort increasing; for ``"kl"`` this is the descending
  operator applied to ``-values`` (torchsort's own construction: ``FastSoftSort``'s ascending hooks), which is
  not the reflection n + 1 - r that :func:`diffrank.functional.soft_rank` uses for its ascending ranks (equal
  for ``"l2"`` only);
- ``values`` must be 2-D ``(B, n)``; integer tensors are promoted to the default float dtype (float32 unless
  changed), as torchsort's ``values * (1/ε)`` promotes them; float16 / bfloat16 are computed in float32 and
  returned in their dtype; the gradient at kinks and ties is torchsort's (and the authors' code's).

Differences: NaN / ±inf raise ``ValueError`` (torchsort returns garbage); ε <= 0 raises; a 0-d tensor ε that
requires grad is learnable (torchsort ignores its gradient); double backward, ``torch.func`` and ``torch.compile``
work (see :class:`diffrank.operators.fast_soft_sort.FastSoftSort`); integer input with ``"kl"`` soft sort is
computed (torchsort raises a dtype error).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.base import SOFT_RANK, SOFT_SORT
from diffrank.operators.fast_soft_sort import FastSoftSort

__all__ = ["soft_rank", "soft_sort"]

_OPS: dict[tuple[str, float], FastSoftSort] = {}


def _operator(values: Tensor, regularization: str, regularization_strength: float | Tensor) -> tuple[Tensor,
                                                                                                    FastSoftSort]:
    """torchsort's argument checks (same messages), the promoted values, and the (cached) operator for ε."""
    if len(values.shape) != 2:
        raise ValueError(f"'values' should be a 2d-tensor but got {values.shape}")
    if regularization not in ["l2", "kl"]:
        raise ValueError("'regularization' should be a 'l2' or 'kl'")
    if not values.is_floating_point():
        values = values.to(torch.get_default_dtype())
    if isinstance(regularization_strength, Tensor) and regularization_strength.requires_grad:
        return values, FastSoftSort(1 / regularization_strength, regularization)
    key = (regularization, float(regularization_strength))
    op = _OPS.get(key)
    if op is None:
        op = _OPS[key] = FastSoftSort.with_strength(key[1], regularization)
    return values, op


def soft_rank(values: Tensor, regularization: str = "l2", regularization_strength: float | Tensor = 1.0) -> Tensor:
    """Soft ranks, ascending (1 = the smallest), as ``torchsort.soft_rank``.

    Args:
        values: ``(B, n)`` tensor (floating, or integer: promoted to the default float dtype).
        regularization: ``"l2"`` (default) or ``"kl"``.
        regularization_strength: ε > 0 (default 1.0; β = 1/ε); smaller = closer to the hard ranks.

    Returns:
        ``(B, n)`` soft ranks in [1, n] (``"l2"``: each row sums to n(n+1)/2), dtype of the (promoted) values.

    Raises:
        ValueError: ``values`` not 2-D, an unknown regularization, ε <= 0, NaN / inf values.
    """
    values, op = _operator(values, regularization, regularization_strength)
    return op._per_item(SOFT_RANK, "soft_rank", values, op._soft_rank_ascending)


def soft_sort(values: Tensor, regularization: str = "l2", regularization_strength: float | Tensor = 1.0) -> Tensor:
    """Soft-sorted values, ascending, as ``torchsort.soft_sort``.

    Args:
        values: ``(B, n)`` tensor (floating, or integer: promoted to the default float dtype).
        regularization: ``"l2"`` (default) or ``"kl"``.
        regularization_strength: ε > 0 (default 1.0; β = 1/ε).

    Returns:
        ``(B, n)``, increasing along each row (``"l2"``: same row sums as ``values``).

    Raises:
        ValueError: ``values`` not 2-D, an unknown regularization, ε <= 0, NaN / inf values.
    """
    values, op = _operator(values, regularization, regularization_strength)
    return op._per_item(SOFT_SORT, "soft_sort", values, op._soft_sort_ascending)
