"""Composite classification tasks built from real MNIST / Fashion-MNIST images: several items side by side.

``data=fashion_pairs``: two Fashion-MNIST items side by side, labelled 10·left + right: 100 ordered class pairs,
so that top-5 means something and classes come in near-duplicate groups (T-shirt / shirt / pullover / coat
confuse, Xiao et al. 2017), the situation where the top-k losses of Petersen et al. (ICML 2022, §5) should differ
from softmax. Any number of slots and any mix of sources works (``sources: [fashion_mnist, mnist]`` gives
Fashion × MNIST pairs, three slots give 1 000 classes); the label is the mixed-radix number of the slot labels,
slot 0 most significant.

Splits, as in ``data=digits100`` (``diffrank.experiments.data.digits``): every source's official training file is
split into
a training pool and a validation pool (``val_size`` images, seeded by ``split_seed``), the test pool is the
official test file; composites are drawn only within a pool, so no source image appears in two splits.
Composites are class-balanced (every composite label equally often, ±1) and a pure function of
``split_seed``; ``seed`` only orders the training batches
(:class:`~diffrank.experiments.data.samplers.EpochSampler`).

Images are normalised per source (the mean / std of :data:`diffrank.experiments.data.image_readers.IMAGE_SETS`)
and optionally downscaled by an integer factor (mean pooling) to keep one training run cheap on a CPU thread.
Offline a missing file raises :class:`FileNotFoundError` naming it
(``diffrank.experiments.data.image_readers.load_image_arrays``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from diffrank.experiments.data.image_readers import IMAGE_SETS, load_image_arrays
from diffrank.experiments.data.samplers import EpochSampler

SPLITS = ("train", "val", "test")


def composite_labels(slot_labels: np.ndarray, num_classes: Sequence[int]) -> np.ndarray:
    """Mixed-radix label of a composite: slot 0 most significant (two 10-class slots: 10·left + right).

    Args:
        slot_labels: ``(N, S)`` int, slot s in ``[0, num_classes[s])``.
        num_classes: classes per slot, length S.

    Returns:
        ``(N,)`` int64 in ``[0, Π num_classes)``.

    Raises:
        ValueError: shape mismatch or a label outside its slot's range.
    """
    slot_labels = np.asarray(slot_labels)
    if slot_labels.ndim != 2 or slot_labels.shape[1] != len(num_classes):
        raise ValueError(f"slot_labels must be (N, {len(num_classes)}), got {slot_labels.shape}")
    out = np.zeros(len(slot_labels), dtype=np.int64)
    for s, c in enumerate(num_classes):
        col = slot_labels[:, s].astype(np.int64)
        if col.size and (col.min() < 0 or col.max() >= c):
            raise ValueError(f"slot {s} labels must lie in [0, {c}), got [{col.min()}, {col.max()}]")
        out = out * int(c) + col
    return out


def slot_labels_of(labels: np.ndarray, num_classes: Sequence[int]) -> np.ndarray:
    """Inverse of :func:`composite_labels`: ``(N,)`` composite labels → ``(N, S)`` int64 slot labels."""
    labels = np.asarray(labels, dtype=np.int64).copy()
    out = np.zeros((len(labels), len(num_classes)), dtype=np.int64)
    for s in range(len(num_classes) - 1, -1, -1):
        out[:, s] = labels % int(num_classes[s])
        labels //= int(num_classes[s])
    return out


def compose_indices(pool_labels: Sequence[np.ndarray], num_classes: Sequence[int], count: int,
                    seed: int | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``count`` class-balanced composites: which pool image fills each slot.

    Every composite label occurs ``count // C`` or ``count // C + 1`` times (C = Π num_classes); the order is
    shuffled; each slot's image is drawn uniformly (with replacement) among the pool images of its class.

    Args:
        pool_labels: per slot, the ``(N_s,)`` labels of that slot's source pool.
        num_classes: classes per slot.
        count: number of composites (≥ 1).
        seed: numpy seed (an int or a sequence of ints).

    Returns:
        ``(indices (count, S) int64 into each slot's pool, labels (count,) int64)``.

    Raises:
        ValueError: ``count < 1``, or a pool lacking a class (the composite label could not be drawn).
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = np.random.default_rng(seed)
    total = int(np.prod([int(c) for c in num_classes]))
    y = np.arange(count, dtype=np.int64) % total
    rng.shuffle(y)
    slots = slot_labels_of(y, num_classes)
    idx = np.zeros((count, len(num_classes)), dtype=np.int64)
    for s, (labels, c) in enumerate(zip(pool_labels, num_classes)):
        labels = np.asarray(labels)
        by_class = [np.flatnonzero(labels == k) for k in range(int(c))]
        empty = [k for k, b in enumerate(by_class) if len(b) == 0]
        if empty:
            raise ValueError(f"slot {s}: the pool has no image of class(es) {empty}; every class must occur "
                             "in each pool to compose all labels")
        for k, members in enumerate(by_class):
            rows = np.flatnonzero(slots[:, s] == k)
            idx[rows, s] = members[rng.integers(0, len(members), len(rows))]
    return idx, y


def item_side(factor: int) -> int:
    """Side of a 28×28 item after :func:`downscale` by ``factor``: 28 / factor, rounded up to even.

    Raises:
        ValueError: a factor that does not divide 28 (1, 2, 4, 7, 14, 28 do).
    """
    if factor < 1 or 28 % factor:
        raise ValueError(f"downscale must divide 28 (1, 2, 4, 7, 14), got {factor}")
    side = 28 // factor
    return side + side % 2


def downscale(images: Tensor, factor: int, background: float = 0.0) -> Tensor:
    """Mean-pool ``(N, C, 28, 28)`` float images by ``factor`` (1 = unchanged), then pad an odd side by one row /
    column of ``background`` at the bottom / right, to ``(N, C, s, s)`` with s = :func:`item_side` (the
    SmallCNN's single 2×2 pool needs even sides: factor 4 gives 7×7 items padded to 8×8).

    Raises:
        ValueError: see :func:`item_side`.
    """
    side = item_side(factor)
    if factor > 1:
        images = F.avg_pool2d(images, factor)
    if images.shape[-1] != side:
        images = F.pad(images, (0, 1, 0, 1), value=float(background))
    return images


class CompositeImageDataModule(L.LightningDataModule):
    """Real MNIST / Fashion-MNIST items side by side as one image with a composite label.

    Args:
        sources: the dataset of each slot, left to right (keys of ``IMAGE_SETS`` with 28×28 grey images:
            ``"mnist"``, ``"fashion_mnist"``); the same dataset may fill several slots.
        data_dir: torchvision root (``paths.data_dir``).
        download: let torchvision fetch missing files (online only).
        downscale: integer factor applied to every 28×28 item (mean pooling): 1 (28×28), 2 (14×14), 4 (7×7,
            padded to 8×8 with the black background), 7 (4×4), 14 (2×2).
        n_train / n_val / n_test: composites per split.
        val_size: source images held out of each official training file as the validation pool.
        batch_size: training composites per step (the global batch).
        eval_batch_size: validation / test batch size.
        seed: the training order (the run's seed). split_seed: pools and composites (fixed by default).
        num_workers: DataLoader workers (0: batches are tensor gathers).
        num_classes / image_shape: optional, checked against the data (the yaml states them for interpolation).

    Batches: ``(images (B, 1, s, S·s) float32, normalised per source, labels (B,) int64 in [0, Π classes))``,
    s = 28/d rounded up to even (:func:`item_side`).

    Attributes:
        num_classes: Π of the sources' class counts. image_shape: ``(1, s, S·s)``.
        source_indices: after ``setup``, per split and slot, the indices of the source images used, into the
            official train file (train, val) or test file (test): ``{split: [(count,) int64 per slot]}``.

    Raises:
        ValueError: (at construction) an unknown or non-28×28-grey source, fewer than 2 slots, a downscale that does
            not divide 28, counts < 1, or num_classes / image_shape that disagree with the data;
            (in ``setup``) ``val_size`` outside ``[1, N)`` or a pool lacking a class.
        FileNotFoundError: (in ``setup``) files missing offline, named with where to put them.
    """

    def __init__(self, sources: Sequence[str] = ("fashion_mnist", "fashion_mnist"), data_dir: str = "data",
                 download: bool = False, downscale: int = 2, n_train: int = 20000, n_val: int = 2000,
                 n_test: int = 5000, val_size: int = 5000, batch_size: int = 128, eval_batch_size: int = 1000,
                 seed: int = 0, split_seed: int = 0, num_workers: int = 0, num_classes: int | None = None,
                 image_shape: Sequence[int] | None = None) -> None:
        super().__init__()
        self.sources = tuple(str(s) for s in sources)
        if len(self.sources) < 2:
            raise ValueError(f"a composite needs at least 2 slots, got sources={list(self.sources)}")
        for s in self.sources:
            if s not in IMAGE_SETS or IMAGE_SETS[s].image_shape != (1, 28, 28):
                grey = sorted(k for k, v in IMAGE_SETS.items() if v.image_shape == (1, 28, 28))
                raise ValueError(f"sources must be 28x28 grey image sets {grey}, got {s!r}")
        self.factor = int(downscale)
        side = item_side(self.factor)
        self.n_train, self.n_val, self.n_test = int(n_train), int(n_val), int(n_test)
        if min(self.n_train, self.n_val, self.n_test) < 1:
            raise ValueError(f"n_train, n_val and n_test must be >= 1, got {(n_train, n_val, n_test)}")
        self.data_dir, self.download = str(data_dir), bool(download)
        self.val_size, self.batch_size, self.eval_batch_size = int(val_size), int(batch_size), int(eval_batch_size)
        self.seed, self.split_seed, self.num_workers = int(seed), int(split_seed), int(num_workers)
        self.slot_classes = tuple(IMAGE_SETS[s].num_classes for s in self.sources)
        self.num_classes = int(np.prod(self.slot_classes))
        self.image_shape = (1, side, side * len(self.sources))
        if num_classes is not None and int(num_classes) != self.num_classes:
            raise ValueError(f"num_classes = {num_classes} does not match the data ({self.num_classes})")
        if image_shape is not None and tuple(int(v) for v in image_shape) != self.image_shape:
            raise ValueError(f"image_shape = {tuple(image_shape)} does not match the data ({self.image_shape})")
        self.splits: dict[str, TensorDataset] = {}
        self.source_indices: dict[str, list[np.ndarray]] = {}

    def _pools(self, name: str) -> dict[str, tuple[Tensor, Tensor, np.ndarray]]:
        """Per split: (normalised downscaled images, labels, indices into the official file) of one source."""
        spec = IMAGE_SETS[name]
        x, y = load_image_arrays(name, self.data_dir, train=True, download=self.download)
        if not 0 < self.val_size < len(y):
            raise ValueError(f"val_size must be in [1, {len(y)}), got {self.val_size}")
        # one permutation per source name (not per slot): slots sharing a source share its pools, so a
        # validation image can never be a training image in the other slot
        # seeded by the name itself, so that registering another dataset never moves a split
        perm = np.random.default_rng([self.split_seed, 4, zlib.crc32(name.encode())]).permutation(len(y))
        parts = {"val": np.sort(perm[:self.val_size]), "train": np.sort(perm[self.val_size:])}
        tx, ty = load_image_arrays(name, self.data_dir, train=False, download=self.download)

        def prep(images: Tensor) -> Tensor:
            """uint8 ``(N, 1, H, W)`` → float32 normalised by the source's mean / std, downscaled by ``factor``."""
            mean, std = spec.mean[0], spec.std[0]
            # a padded border takes the value of a black pixel, the items' own background
            return downscale((images.float() / 255 - mean) / std, self.factor, background=-mean / std)

        full = prep(x)
        out = {k: (full[torch.from_numpy(v)], y[torch.from_numpy(v)], v) for k, v in parts.items()}
        out["test"] = (prep(tx), ty, np.arange(len(ty)))
        return out

    def setup(self, stage: str | None = None) -> None:
        """Read the files once and compose the three splits (a pure function of ``split_seed``)."""
        if self.splits:
            return
        pools = {name: self._pools(name) for name in dict.fromkeys(self.sources)}
        counts = dict(zip(SPLITS, (self.n_train, self.n_val, self.n_test)))
        for i, split in enumerate(SPLITS):
            per_slot = [pools[s][split] for s in self.sources]
            idx, y = compose_indices([p[1].numpy() for p in per_slot], self.slot_classes, counts[split],
                                     [self.split_seed, 5, i])
            images = torch.cat([p[0][torch.from_numpy(idx[:, s])] for s, p in enumerate(per_slot)], dim=3)
            self.splits[split] = TensorDataset(images.contiguous(), torch.from_numpy(y))
            self.source_indices[split] = [p[2][idx[:, s]] for s, p in enumerate(per_slot)]

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (order from ``(seed, epoch)``; the last partial batch dropped)."""
        ds = self.splits["train"]
        return DataLoader(ds, batch_size=self.batch_size, sampler=EpochSampler(len(ds), self.seed, stream=1),
                          drop_last=True, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed))

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.eval_batch_size, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        """Validation batches."""
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        """Test batches."""
        return self._eval_loader("test")
