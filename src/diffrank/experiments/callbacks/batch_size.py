"""What a batch holds, for callbacks that count samples (Lightning's ``ThroughputMonitor``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def batch_size(batch: Any) -> int:
    """Number of samples in a batch: the leading size of its first tensor.

    Args:
        batch: a tensor, or a tuple / list / dict whose first tensor (depth first) has the samples along dim 0:
            ``(images (B, …), labels (B,))`` for classification, ``(images (B, n, C, H, W), values (B, n), …)``
            for the sorting benchmark, where a sample is one set of n.

    Returns:
        ``B`` as a Python int.

    Raises:
        TypeError: if the batch holds no tensor, or its first tensor is 0-dimensional.
    """
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise TypeError("batch_size: the batch's first tensor is 0-dimensional (no sample dimension)")
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, Sequence) else ()
    for item in items:
        if isinstance(item, str):
            continue
        try:
            return batch_size(item)
        except TypeError:
            continue
    raise TypeError(f"batch_size: no tensor in a batch of type {type(batch).__name__}")
