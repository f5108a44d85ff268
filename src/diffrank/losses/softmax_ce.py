"""Softmax cross-entropy baseline (the ``softmax_ce`` rows of Petersen et al. 2022, Tables 1-5)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from diffrank.losses.validation import check_logits_labels, index_labels


class SoftmaxCrossEntropyLoss(nn.Module):
    """Plain softmax cross-entropy with input validation; mean over the batch.

    Call: ``loss(logits (B, n) float, labels (B,) integer)`` → scalar; labels of any integer dtype (cast to
    int64: :func:`~diffrank.losses.validation.index_labels`).

    Raises:
        ValueError / TypeError: bad logits or labels (see ``check_logits_labels``).
    """

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Cross-entropy of ``logits`` against ``labels``."""
        check_logits_labels(logits, labels)
        return F.cross_entropy(logits.float() if logits.dtype.itemsize < 4 else logits, index_labels(labels))
