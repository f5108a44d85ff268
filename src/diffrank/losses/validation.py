"""Input checks shared by the losses, written so that a training step reads the device at most once.

A data-dependent check (finite logits, labels in range) needs its flag read on the host, which on CUDA is a
synchronisation. The operators already read their own checks together, once per call
(:func:`diffrank.operators.base.raise_failed`); the losses here split their checks into the data-free ones
(shapes, dtypes: raised at once, no synchronisation) and *pending* ones (``(ok, error)`` pairs,
:data:`diffrank.operators.base.Check`), which :func:`call_operator` hands to the operator so that they share
its single read when the operator accepts them (a ``checks`` keyword), and reads in one synchronisation of
its own otherwise. docs/gpu.md ("One host synchronisation per step") lists what a step reads.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from diffrank.operators.base import Check, check_scores_shape, finite_check, raise_failed


class LabelRangeError(ValueError):
    """Labels outside ``[0, n)``; the observed range is read from the labels only when the message is shown,
    so that building the error (before it is known to be needed) costs no synchronisation.

    Args:
        labels: ``(B,)`` integer labels (any device).
        n: number of classes.
    """

    def __init__(self, labels: Tensor, n: int) -> None:
        super().__init__(labels, n)
        self.labels, self.n = labels, int(n)

    def __str__(self) -> str:
        lo, hi = int(self.labels.min()), int(self.labels.max())
        return f"labels must lie in [0, {self.n - 1}], got range [{lo}, {hi}]"


def logits_labels_checks(logits: Tensor, labels: Tensor, finite: bool = True) -> list[Check]:
    """Validate a classification batch without reading data; return the data-dependent checks, unread.

    Args:
        logits: ``(B, n)`` floating.
        labels: ``(B,)`` integer class indices.
        finite: include the check that the logits are finite (leave it out when an operator validates the
            same logits anyway).

    Returns:
        A list of pending checks (labels in ``[0, n)``, and finite logits when ``finite``); read them with
        :func:`diffrank.operators.base.raise_failed` or pass them to :func:`call_operator`.

    Raises:
        TypeError: non-floating logits or non-integer labels.
        ValueError: wrong shapes (logits not 2-D, labels not ``(B,)``, n < 1).
    """
    check_scores_shape(logits, "logits")
    if not isinstance(labels, Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    if labels.shape != logits.shape[:1]:
        raise ValueError(f"labels must have shape ({logits.shape[0]},) to match logits {tuple(logits.shape)}, "
                         f"got {tuple(labels.shape)}")
    n = logits.shape[1]
    checks: list[Check] = [finite_check(logits, "logits")] if finite else []
    if labels.numel():
        checks.append((((labels >= 0) & (labels < n)).all(), LabelRangeError(labels, n)))
    return checks


def index_labels(labels: Tensor) -> Tensor:
    """Class labels in int64, the index dtype of ``gather`` / ``scatter`` and of ``F.cross_entropy``.

    The losses accept labels of every integer dtype (uint8, int8, int16, int32, int64: data sets store labels
    compactly, numpy defaults to int32 on some platforms) and cast them here, after
    :func:`logits_labels_checks` refused floating, complex and bool labels; torch's own
    ``cross_entropy`` takes int64 and uint8 only, and ``gather`` int64 and int32, so without the cast a uint8 or
    int32 batch failed inside one of them.

    Args:
        labels: ``(B,)`` integer tensor.

    Returns:
        ``labels`` itself when already int64, else an int64 copy (same device).
    """
    return labels if labels.dtype == torch.int64 else labels.long()


def check_logits_labels(logits: Tensor, labels: Tensor) -> None:
    """Validate a classification batch (one host synchronisation for all data-dependent checks).

    Args:
        logits: ``(B, n)`` floating, finite.
        labels: ``(B,)`` integer class indices in ``[0, n)``.

    Raises:
        TypeError: non-floating logits or non-integer labels.
        ValueError: wrong shapes, non-finite logits, labels out of range.
    """
    raise_failed(logits_labels_checks(logits, labels))


@functools.lru_cache(maxsize=256)
def _takes_checks(fn: Callable) -> bool:
    try:
        return "checks" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def accepts_checks(method: Callable) -> bool:
    """Whether an operator method (or a module, through its ``forward``) takes pending checks as ``checks=``.

    Args:
        method: a bound method such as ``operator.topk_membership``, or an ``nn.Module``.

    Returns:
        True when its signature has a ``checks`` parameter.
    """
    fn = method.forward if isinstance(method, nn.Module) else method
    return _takes_checks(getattr(fn, "__func__", fn))


def call_operator(method: Callable, *args, checks: Sequence[Check] = ()) -> Tensor:
    """Call an operator method, reading ``checks`` in the same host synchronisation as the operator's own.

    Args:
        method: e.g. ``operator`` (its forward), ``operator.topk_membership``, ``operator.soft_rank``.
        *args: its positional arguments (scores first).
        checks: pending ``(ok, error)`` pairs. Passed on as ``checks=`` when the method accepts them;
            otherwise read here first, in one synchronisation (none when ``checks`` is empty).

    Returns:
        What ``method`` returns.

    Raises:
        The error of the first failed check, and whatever ``method`` raises.
    """
    checks = list(checks)
    if checks and accepts_checks(method):
        return method(*args, checks=checks)
    raise_failed(checks)
    return method(*args)
