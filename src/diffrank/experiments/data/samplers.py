"""The one training sampler of the data modules: an epoch's order as a pure function of ``(seed, epoch)``.

Lightning calls :meth:`EpochSampler.set_epoch` before every epoch and the order is drawn when iteration starts
(a resumed run creates its iterator before Lightning sets the epoch); :meth:`EpochSampler.set_start` makes the
next pass skip what a resumed run already trained on (``diffrank.experiments.callbacks.ResumeState``). So a run
sees the same batches whatever the workers, the restarts or the other draws of the process.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler


class EpochSampler(Sampler):
    """The order of an epoch over ``n`` items, drawn from ``(seed, stream, epoch)``.

    Args:
        n: items (or batches, with ``keys``) per epoch.
        seed: the run's seed; ``None`` keeps the items in order (evaluation).
        stream: a constant that separates the data modules' draws of one seed (digits 1, images 2, Warcraft 3,
            embeddings 5, MovieLens 6), so that their orders are independent.
        batch_size: ``None`` yields item indices (a DataLoader batches them); an int yields index arrays of
            ``batch_size`` items, the last one smaller (the Warcraft reference's loader: no ``drop_last``).
        keys: yield ``(epoch, i)`` for ``i < n`` instead of indices: for data sets that draw batch ``i`` of an
            epoch afresh from ``(seed, epoch, i)`` (the sorting benchmarks' sets of n numbers).

    ``set_start(s)`` skips the first ``s`` things the next pass would yield (items, index arrays or keys: what
    a DataLoader with ``batch_size=None`` counts as one batch).

    Raises:
        ValueError: ``n < 0``, ``batch_size < 1``, or ``keys`` together with ``batch_size``.
    """

    def __init__(self, n: int, seed: int | None = None, stream: int = 1, batch_size: int | None = None,
                 keys: bool = False) -> None:
        if int(n) < 0 or (batch_size is not None and int(batch_size) < 1) or (keys and batch_size is not None):
            raise ValueError(f"need n >= 0, batch_size >= 1 and not both keys and batch_size; got n={n}, "
                             f"batch_size={batch_size}, keys={keys}")
        self.n, self.seed, self.stream = int(n), None if seed is None else int(seed), int(stream)
        # _batch, not batch_size: subclasses that cut whole batches into their permutation keep that name
        self._batch, self.keys = None if batch_size is None else int(batch_size), bool(keys)
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next pass yields."""
        self.epoch = int(epoch)

    def set_start(self, start: int) -> None:
        """Skip the first ``start`` yields (items, index arrays or keys) of the next pass only."""
        self.start = int(start)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch ``epoch`` (int64 positions)."""
        if self.seed is None:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, self.stream, int(epoch)]).permutation(self.n)

    def __iter__(self) -> Iterator[Any]:
        start, self.start = self.start, 0
        if self.keys:
            for i in range(start, self.n):
                yield (self.epoch, i)
            return
        order = self.permutation(self.epoch)
        if self._batch is None:
            yield from order[start:].tolist()
            return
        for i in range(start * self._batch, len(order), self._batch):
            yield order[i : i + self._batch]

    def __len__(self) -> int:
        return self.n if self._batch is None else math.ceil(self.n / self._batch)


def check_one_batch(n: int, batch_size: int, size_key: str) -> None:
    """Refuse a training split smaller than one batch where the last partial batch is dropped: it yields no batch,
    and the run would take no step (Lightning then ran 0 steps and the run failed for want of a validation,
    advising a longer ``trainer.max_epochs``, which cannot help).

    Args:
        n: training items. batch_size: items per step (per device).
        size_key: the config key that sets ``n`` (``data.n_train``), for the message.

    Raises:
        ValueError: ``n < batch_size``; the message names both keys and the fix.
    """
    if n < batch_size:
        raise ValueError(f"the training set ({size_key}: {n} items) is smaller than one batch (data.batch_size="
                         f"{batch_size}) and the last partial batch is dropped, so no training step would be taken; "
                         f"use {size_key} >= {batch_size} or data.batch_size <= {n}")
