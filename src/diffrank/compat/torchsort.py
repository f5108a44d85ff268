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

Differences: NaN / ±inf raise ``ValueError`` (torchsort returns garbage); an ε that is not one finite positive
number raises ``ValueError`` naming ``regularization_strength``; complex ``values`` raise ``TypeError`` (torchsort
ranks their real parts, with only torch's casting warning); a 0-d tensor ε that requires grad is learnable
(torchsort ignores its gradient); double backward, ``torch.func`` and ``torch.compile``
work (see :class:`diffrank.operators.fast_soft_sort.FastSoftSort`); integer input with ``"kl"`` soft sort is
computed (torchsort raises a dtype error).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import Tensor

from diffrank.operators.base import SOFT_RANK, SOFT_SORT, data_checks_traced
from diffrank.operators.fast_soft_sort import FastSoftSort

__all__ = ["soft_rank", "soft_sort"]

_OPS: dict[tuple[str, float], FastSoftSort] = {}

_EPS = "regularization_strength (ε = 1/β)"


def _strength(regularization_strength: float | Tensor) -> float | Tensor:
    """ε validated under its own name (the caller never passed a β): a float, or the 0-d tensor of a learnable ε.

    Raises:
        ValueError: not one real number (a string, a bool, a complex, an array or tensor of several elements, a
            tensor on the meta device), not finite, not > 0, or so small that β = 1/ε overflows.
    """
    eps = regularization_strength
    if isinstance(eps, np.ndarray):
        if eps.size != 1:
            raise ValueError(f"{_EPS} must be one number, got an array of shape {eps.shape}")
        eps = eps.reshape(()).item()
    if isinstance(eps, Tensor):
        if eps.numel() != 1:
            raise ValueError(f"{_EPS} must be one number (a float or a one-element tensor), got a tensor of shape "
                             f"{tuple(eps.shape)}")
        if eps.is_meta:
            raise ValueError(f"{_EPS} is on the meta device: it has a shape but no value; pass a float or a tensor "
                             "with a value")
        if eps.is_complex() or eps.dtype == torch.bool:
            raise ValueError(f"{_EPS} must be a real number, got a tensor of dtype {eps.dtype}")
        if eps.requires_grad:  # learnable: kept in the graph, its value read once (not under tracing)
            eps = eps.reshape(())
            if not data_checks_traced(eps):
                _strength(float(eps.detach()))
            return eps
        eps = float(eps)
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise ValueError(f"{_EPS} must be a finite positive number, got {eps!r} of type {type(eps).__name__}")
    eps = float(eps)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"{_EPS} must be a finite positive number, got {eps}")
    if not math.isfinite(1.0 / eps):
        raise ValueError(f"{_EPS} = {eps} is too small: β = 1/ε overflows; use ε >= "
                         f"{1 / torch.finfo(torch.float64).max:.3g}")
    return eps


def _operator(values: Tensor, regularization: str, regularization_strength: float | Tensor) -> tuple[Tensor,
                                                                                                    FastSoftSort]:
    """torchsort's argument checks (same messages), the promoted values, and the (cached) operator for ε.

    Raises:
        TypeError: ``values`` not a tensor, or complex (torchsort would rank the real parts).
        ValueError: ``values`` not 2-D, an unknown regularization, a bad ε (:func:`_strength`).
    """
    if not isinstance(values, Tensor):
        raise TypeError(f"'values' must be a torch.Tensor of shape (B, n), got {type(values).__name__}")
    if len(values.shape) != 2:
        raise ValueError(f"'values' should be a 2d-tensor but got {values.shape}")
    if regularization not in ["l2", "kl"]:
        raise ValueError("'regularization' should be a 'l2' or 'kl'")
    if values.is_complex():
        # promoting would drop the imaginary parts with only torch's warning, and rank the real parts
        raise TypeError(f"'values' must be real (floating point, integer or bool), got dtype {values.dtype}")
    if not values.is_floating_point():
        values = values.to(torch.get_default_dtype())
    eps = _strength(regularization_strength)
    if isinstance(eps, Tensor):
        return values, FastSoftSort(1 / eps, regularization)
    key = (regularization, eps)
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
        TypeError: ``values`` not a tensor, or complex.
        ValueError: ``values`` not 2-D, an unknown regularization, ε not one finite positive number (the message
            names ``regularization_strength``), NaN / inf values.
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
        TypeError: ``values`` not a tensor, or complex.
        ValueError: ``values`` not 2-D, an unknown regularization, ε not one finite positive number (the message
            names ``regularization_strength``), NaN / inf values.
    """
    values, op = _operator(values, regularization, regularization_strength)
    return op._per_item(SOFT_SORT, "soft_sort", values, op._soft_sort_ascending)
