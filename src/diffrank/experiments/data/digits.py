"""Real offline classification data from scikit-learn's digits (1 797 real 8x8 handwritten digits).

- ``data=digits``: the 10-class set as it is, split train / val / test (about 70 / 15 / 15 %).
- ``data=digits100``: two real digit images side by side (8 x 16), labelled 10·left + right ∈ 00..99,
  100 classes so that top-5 means something. The source images are split into train / val / test
  pools first and pairs are composed only within a pool, so no image is shared across splits. Pairs
  are drawn deterministically from ``split_seed`` (class-balanced: each label equally often).

Seeds: ``split_seed`` fixes the data (the split and the composed pairs): fixed by default, as the
papers' splits are, so that a sweep over ``seed`` measures training variance only. ``seed`` drives the
order of the training batches (:class:`~diffrank.experiments.data.samplers.EpochSampler`, a pure function of
``(seed, epoch)``).
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from diffrank.experiments.data.samplers import EpochSampler, check_one_batch


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1 797 digits as ``(N, 8, 8)`` float32 images in [0, 1] and ``(N,)`` int64 labels.

    Raises:
        RuntimeError: if scikit-learn's bundled data file cannot be read (names the file).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - sklearn is a dependency
        raise RuntimeError("data=digits needs scikit-learn (pip install scikit-learn)") from e
    try:
        d = load_digits()
    except OSError as e:  # pragma: no cover - the csv ships inside the wheel
        raise RuntimeError("scikit-learn's digits file sklearn/datasets/data/digits.csv.gz is missing; "
                           "reinstall scikit-learn") from e
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def split_indices(labels: np.ndarray, fractions: tuple[float, float, float], seed: int) -> list[np.ndarray]:
    """Stratified split of indices into train / val / test by ``fractions`` (which must sum to 1)."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[], [], []]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        a = int(round(fractions[0] * len(idx)))
        b = a + int(round(fractions[1] * len(idx)))
        for p, chunk in zip(parts, (idx[:a], idx[a:b], idx[b:])):
            p.extend(chunk.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def compose_pairs(images: np.ndarray, labels: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` two-digit images (N, 8, 16) with labels 10·a + b, class-balanced, from one pool.

    Raises:
        ValueError: if the pool lacks a digit class.
    """
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in range(10)]
    if any(len(b) == 0 for b in by_class):
        raise ValueError("every digit 0-9 must occur in each pool to compose 100 classes")
    y = np.arange(count) % 100
    rng.shuffle(y)
    left = np.array([rng.choice(by_class[c]) for c in y // 10])
    right = np.array([rng.choice(by_class[c]) for c in y % 10])
    return np.concatenate([images[left], images[right]], axis=2), y.astype(np.int64)


class DigitsDataModule(L.LightningDataModule):
    """scikit-learn digits as a LightningDataModule (10 classes, or 100 with ``pairs=True``).

    Args:
        pairs: compose two digits side by side (100 classes, 8x16 images).
        n_train / n_val / n_test: number of composed pairs per split (ignored without ``pairs``).
        fractions: share of the source images in the train / val / test pools.
        batch_size: per device.
        seed: the order of the training batches (``seed`` of the run).
        split_seed: the split and the composition of the pairs (fixed by default).
        num_workers: DataLoader workers.
        num_classes / image_shape: optional, checked against the data (the yaml states them for interpolation).

    Batches: ``(images (B, 1, 8, 8 or 16) float32 in [0, 1], labels (B,) int64)``.

    Attributes:
        num_classes: 10 or 100. image_shape: (1, 8, 8) or (1, 8, 16).

    Raises:
        ValueError: bad fractions, an empty split (``n_train`` / ``n_val`` / ``n_test`` < 1 with ``pairs``), or
            num_classes / image_shape that disagree with the data; (``train_dataloader``) a training split smaller
            than one batch.
    """

    def __init__(self, pairs: bool = False, n_train: int = 20000, n_val: int = 2000, n_test: int = 5000,
                 fractions: tuple[float, float, float] = (0.7, 0.15, 0.15), batch_size: int = 128,
                 seed: int = 0, num_workers: int = 0, num_classes: int | None = None,
                 image_shape: tuple[int, ...] | None = None, split_seed: int = 0) -> None:
        super().__init__()
        self.pairs = bool(pairs)
        self.n_train, self.n_val, self.n_test = int(n_train), int(n_val), int(n_test)
        empty = [f"data.{k}={v}" for k, v in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)) if int(v) < 1]
        if self.pairs and empty:  # an empty split failed inside numpy's indexing (IndexError) when composed
            raise ValueError(f"{', '.join(empty)}: every split needs at least one pair (the validation split selects "
                             "the checkpoint, the test split is what the run reports); use a positive count")
        self.fractions = tuple(float(f) for f in fractions)
        if abs(sum(self.fractions) - 1) > 1e-6 or min(self.fractions) <= 0:
            raise ValueError(f"fractions must be three positive numbers summing to 1, got {fractions}")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.split_seed = int(split_seed)
        self.num_workers = int(num_workers)
        self.num_classes = 100 if self.pairs else 10
        self.image_shape = (1, 8, 16) if self.pairs else (1, 8, 8)
        # the yaml states both so that model configs can interpolate them; they must agree with the data
        if num_classes is not None and int(num_classes) != self.num_classes:
            raise ValueError(f"num_classes = {num_classes} does not match the data ({self.num_classes})")
        if image_shape is not None and tuple(image_shape) != self.image_shape:
            raise ValueError(f"image_shape = {tuple(image_shape)} does not match the data ({self.image_shape})")
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        """Build the three splits once (deterministic from ``split_seed``)."""
        if self.splits:
            return
        images, labels = load_digits_arrays()
        pools = split_indices(labels, self.fractions, self.split_seed)
        counts = (self.n_train, self.n_val, self.n_test)
        for i, (name, idx) in enumerate(zip(("train", "val", "test"), pools)):
            x, y = images[idx], labels[idx]
            if self.pairs:
                x, y = compose_pairs(x, y, counts[i], self.split_seed * 1000 + i)
            self.splits[name] = TensorDataset(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y))
        self.source_indices = dict(zip(("train", "val", "test"), pools))

    def _loader(self, name: str, shuffle: bool) -> DataLoader:
        if not shuffle:
            return DataLoader(self.splits[name], batch_size=self.batch_size, num_workers=self.num_workers)
        # the order is a pure function of (seed, epoch); the loader's own generator keeps iterator creation
        # from drawing on torch's global generator (which a resumed run restores)
        return DataLoader(self.splits[name], batch_size=self.batch_size, num_workers=self.num_workers,
                          sampler=EpochSampler(len(self.splits[name]), self.seed, stream=1), drop_last=True,
                          generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (order from ``(seed, epoch)``; last partial batch dropped, as the reference
        scripts do).

        Raises:
            ValueError: a training split smaller than one batch (no step would be taken).
        """
        check_one_batch(len(self.splits["train"]), self.batch_size, "data.n_train" if self.pairs else
                        "data.fractions[0] of the 1 797 digits")
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        """Validation batches."""
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        """Test batches."""
        return self._loader("test", False)

    def reference_dataloader(self) -> DataLoader:
        """The training split in order: the set a kNN classifier searches."""
        return self._loader("train", False)
