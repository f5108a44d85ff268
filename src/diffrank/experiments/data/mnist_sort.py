"""Sets of multi-digit numbers for the ranking-supervision benchmark (thesis §2.3 / §3.5; Grover et al. 2019).

One *number* is ``digits`` (default 4) digit images drawn independently, uniformly and with replacement
from one split's pool and put side by side along the width (MNIST: 1 x 28 x 112); its value is the
decimal number they spell, leading zeros allowed (Σ_d 10^{digits-1-d} · label_d). One *set* holds n
numbers drawn independently. The network only learns from the order of the values.

Splits (thesis §3.5; the official ``diffsort`` loader): train = the first 55 000
MNIST training images, validation = the last 5 000, test = the 10 000 test images; digits never cross
splits. Pixels are uint8/255 in [0, 1], no normalisation, no augmentation.

Sampling: training sets are drawn afresh for every batch from ``(seed, epoch, batch index)`` (the
official code carries one RNG state; ours gives the same distribution and stays deterministic with
several workers or processes). Validation and test collections are materialised once per ``split_seed``
(fixed by default, so a sweep over ``seed`` is evaluated on the same sets) as digit indices, and
composed into images batch by batch. EM5 (docs/conventions.md) needs
sets of 5 from the same split: for n < 5 evaluation batches carry a dedicated collection of 5-sets; for
n >= 5 the model reads EM5 off the ⌊n/5⌋ disjoint 5-chunks of each n-set, which are 5-sets of
independently drawn numbers too (so large n costs no extra images).

Device-resident training sets (``device_resident``; docs/gpu.md): on CUDA the loader yields only a
:class:`SetKey` per step and the batch is composed on the device, from the training pool's images kept
there (55 000 x 28 x 28 uint8 = 43 MB), with digit indices drawn by a device generator seeded from
``(seed, epoch, batch index)``: no per-sample work on the host. Same distribution as the host path, other
draws (the host path's numbers are unchanged). Evaluation collections are always composed on the host.

- ``data=mnist_sort``: :class:`MultiDigitSortDataModule` on torchvision's MNIST files.
- ``data=digits_sort``: the same construction from scikit-learn's 1 797 real 8 x 8 digits (numbers are
  8 x 32 images), offline and seconds-long; the pools are a stratified 70/15/15 split.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from diffrank.experiments.data.number_sets import (
    DigitPool,
    FixedSets,
    RandomSetBatches,
    ResidentSetBatches,
    SetKey,
    check_mnist_files,
    load_mnist,
    parse_device_resident,
)
from diffrank.experiments.data.samplers import EpochSampler

_SPLITS = ("train", "val", "test")


class MultiDigitSortDataModule(L.LightningDataModule):
    """Sets of n multi-digit numbers (MNIST or scikit-learn digits) for learning to rank from order only.

    Args:
        n: set size (numbers per set), >= 2.
        source: ``"mnist"`` (torchvision files under ``data_dir``) or ``"digits"`` (scikit-learn, offline).
        data_dir: root with ``MNIST/raw/`` (``source="mnist"``).
        download: download MNIST when its files are missing.
        digits: digits per number (4 in the papers).
        batch_size: sets per batch (100 in the thesis).
        train_sets: sets per training "epoch" (55 000 in the code; with ``max_steps`` this only sets
            how often Lightning's epoch counter turns).
        val_sets / test_sets: size of the fixed evaluation collections (5 000 / 10 000 in the code).
        val_pool: images at the end of the MNIST training set used as the validation pool (5 000).
        eval_batch_size: sets per evaluation batch (default ``batch_size``).
        em5: build dedicated 5-sets for EM5 when n < 5 (for n >= 5 the 5-chunks of the n-sets serve).
        seed: seeds the training draws (``seed`` of the run).
        split_seed: seeds the evaluation collections and, for ``source="digits"``, the pools (fixed by default).
        num_workers: DataLoader workers.
        fractions: (train, val, test) pool shares for ``source="digits"``.
        image_shape: optional, checked against the data (the yaml states it for interpolation).
        device_resident: ``"auto"`` (default: when the trainer runs on CUDA), ``True`` or ``False``: compose
            the training batches on the trainer's device (:class:`ResidentSetBatches`; the loader then yields
            :class:`SetKey` and :meth:`transfer_batch_to_device` builds the batch).

    Batches: train ``(images (B, n, 1, H, W) float32 in [0, 1], values (B, n) int64)``; val / test add
    ``(images5 (B, 5, 1, H, W), values5 (B, 5))`` when ``em5`` and n < 5.
    MNIST: H, W = 28, 28·digits; digits: 8, 8·digits.

    Raises:
        ValueError: bad sizes or source; image_shape disagreeing with the data; device_resident not one of
            auto / true / false.
        FileNotFoundError: MNIST files missing and ``download`` false, at construction (see
            :func:`check_mnist_files`).
    """

    def __init__(self, n: int = 5, source: str = "mnist", data_dir: str | Path = "data", download: bool = False,
                 digits: int = 4, batch_size: int = 100, train_sets: int = 55000, val_sets: int = 5000,
                 test_sets: int = 10000, val_pool: int = 5000, eval_batch_size: int | None = None,
                 em5: bool = True, seed: int = 0, num_workers: int = 0,
                 fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
                 image_shape: tuple[int, ...] | None = None, split_seed: int = 0,
                 device_resident: bool | str = "auto") -> None:
        super().__init__()
        if int(n) < 2:
            raise ValueError(f"a set needs at least n = 2 numbers, got n = {n}")
        self.device_resident = parse_device_resident(device_resident)
        if source not in ("mnist", "digits"):
            raise ValueError(f"source must be 'mnist' or 'digits', got {source!r}")
        if int(digits) < 1 or min(int(batch_size), int(train_sets), int(val_sets), int(test_sets)) < 1:
            raise ValueError("digits, batch_size, train_sets, val_sets and test_sets must be positive")
        self.n, self.source, self.data_dir, self.download = int(n), source, Path(data_dir), bool(download)
        self.digits, self.batch_size = int(digits), int(batch_size)
        self.train_sets, self.val_sets, self.test_sets = int(train_sets), int(val_sets), int(test_sets)
        self.val_pool, self.em5, self.seed, self.num_workers = int(val_pool), bool(em5), int(seed), int(num_workers)
        self.split_seed = int(split_seed)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.fractions = tuple(float(f) for f in fractions)
        side = 28 if source == "mnist" else 8
        self.image_shape = (1, side, side * self.digits)
        if image_shape is not None and tuple(int(v) for v in image_shape) != self.image_shape:
            raise ValueError(f"image_shape = {tuple(image_shape)} does not match the data ({self.image_shape})")
        if source == "mnist" and not self.download:
            check_mnist_files(self.data_dir)  # now, naming the files, rather than at the first fit
        self.pools: dict[str, DigitPool] = {}
        self.datasets: dict[str, Dataset] = {}

    def _build_pools(self) -> None:
        if self.source == "mnist":
            data = load_mnist(self.data_dir, self.download)
            x, y = data["train"]
            if not 0 < self.val_pool < len(x):
                raise ValueError(f"val_pool must be in (0, {len(x)}), got {self.val_pool}")
            cut = len(x) - self.val_pool
            idx = torch.arange(len(x))
            self.pools = {"train": DigitPool(x[:cut], y[:cut], idx[:cut]),
                          "val": DigitPool(x[cut:], y[cut:], idx[cut:]),
                          # test indices offset so that they never equal training-set indices
                          "test": DigitPool(*data["test"], torch.arange(len(data["test"][0])) + len(x))}
        else:
            from diffrank.experiments.data.digits import load_digits_arrays, split_indices

            images, labels = load_digits_arrays()
            parts = split_indices(labels, self.fractions, self.split_seed)
            self.pools = {name: DigitPool(torch.from_numpy(images[p]), torch.from_numpy(labels[p]),
                                          torch.from_numpy(p)) for name, p in zip(_SPLITS, parts)}

    def setup(self, stage: str | None = None) -> None:
        """Load the digits and materialise the evaluation collections (once, deterministic from ``split_seed``)."""
        if self.datasets:
            return
        self._build_pools()
        self.datasets["train"] = RandomSetBatches(self.pools["train"], self.n, self.digits, self.batch_size,
                                                  max(1, self.train_sets // self.batch_size), self.seed)
        for k, (name, count) in enumerate((("val", self.val_sets), ("test", self.test_sets)), start=1):
            rng = np.random.default_rng([self.split_seed, k])
            pool = self.pools[name]
            idx = pool.draw(rng, count, self.n, self.digits)
            # n >= 5: EM5 is read off disjoint 5-chunks of the n-sets (their numbers are i.i.d.), no extra images
            idx5 = pool.draw(rng, count, 5, self.digits) if self.em5 and self.n < 5 else None
            self.datasets[name] = FixedSets(pool, idx, idx5)

    def resident(self) -> bool:
        """Whether training batches are composed on the device: ``device_resident``, with ``"auto"`` = the
        attached trainer runs on CUDA (False without a trainer)."""
        if self.device_resident != "auto":
            return self.device_resident
        trainer = getattr(self, "trainer", None)
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        """One fresh batch per step (the dataset yields whole batches, ``batch_size=None``); when
        :meth:`resident`, one :class:`SetKey` per step instead, composed in :meth:`transfer_batch_to_device`."""
        ds = self._resident_batches() if self.resident() else self.datasets["train"]
        # own generator: creating the iterator does not draw on torch's global generator (restored on resume)
        return DataLoader(ds, batch_size=None, sampler=EpochSampler(len(ds), keys=True), num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.seed))

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """Lightning's hook: a :class:`SetKey` becomes its batch composed on ``device``; anything else is moved
        as usual."""
        if isinstance(batch, SetKey):
            return self._resident_batches().compose(batch, device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def _resident_batches(self) -> ResidentSetBatches:
        if "train_resident" not in self.datasets:
            ds = self.datasets["train"]
            self.datasets["train_resident"] = ResidentSetBatches(ds.pool, ds.n, ds.digits, ds.batch_size,
                                                                 ds.batches, ds.seed)
        return self.datasets["train_resident"]

    def _eval_loader(self, name: str) -> DataLoader:
        return DataLoader(self.datasets[name], batch_size=self.eval_batch_size, shuffle=False,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        """The fixed validation collection."""
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        """The fixed test collection."""
        return self._eval_loader("test")


