"""Input checks shared by the classification losses."""

from __future__ import annotations

from torch import Tensor

from diffrank.operators.base import check_scores


def check_logits_labels(logits: Tensor, labels: Tensor) -> None:
    """Validate a classification batch.

    Args:
        logits: ``(B, n)`` floating, finite.
        labels: ``(B,)`` integer class indices in ``[0, n)``.

    Raises:
        TypeError: non-floating logits or non-integer labels.
        ValueError: wrong shapes, non-finite logits, labels out of range.
    """
    check_scores(logits, "logits")
    if not isinstance(labels, Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == __import__("torch").bool:
        raise TypeError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    if labels.shape != logits.shape[:1]:
        raise ValueError(f"labels must have shape ({logits.shape[0]},) to match logits {tuple(logits.shape)}, "
                         f"got {tuple(labels.shape)}")
    n = logits.shape[1]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= n):
        raise ValueError(f"labels must lie in [0, {n - 1}], got range [{int(labels.min())}, {int(labels.max())}]")
