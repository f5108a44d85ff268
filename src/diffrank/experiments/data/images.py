"""MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 in torchvision's on-disk formats, held in memory as tensors.

``data=mnist`` / ``fashion_mnist`` / ``cifar10`` / ``cifar100``: the canonical train / test files under
``paths.data_dir`` (torchvision's layout: ``MNIST/raw/``, ``FashionMNIST/raw/``, ``cifar-10-batches-py/``,
``cifar-100-python/``), a seeded validation split held out of the training set (Grover et al. 2019 hold out
5 000 MNIST images; Petersen et al. 2022 hold out 5 % of CIFAR-100). The sets are small enough to keep in memory
as tensors (MNIST 190 MB, CIFAR-10 600 MB in float32), so a batch is an index gather: no per-image transforms,
no workers.

Without augmentation (the kNN protocols: Xie et al. 2020, App. I) the images are stored normalised in float32.
With ``augment=true`` (the CIFAR-100 top-k protocol: RandomCrop 32 with 4 pixels of zero padding and a
horizontal flip, as the difftopk code does) they stay uint8 in memory (4x less) and the crop, flip and the
per-channel normalisation run on the batch after it reached the device (:meth:`ImageDataModule.
on_after_batch_transfer`, batched tensor ops), so a GPU run has no CPU data-loading bottleneck.

Offline (``download=false``, the default) a missing file raises :class:`FileNotFoundError` naming it and where
to put it; ``download=true`` lets torchvision fetch the files.
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from diffrank.experiments.data.image_readers import IMAGE_SETS, load_image_arrays
from diffrank.experiments.data.samplers import EpochSampler, check_one_batch


def crop_flip(images: Tensor, offsets: Tensor, flips: Tensor, padding: int) -> Tensor:
    """Zero-pad every image by ``padding`` pixels, cut the ``H × W`` window at ``offsets`` and mirror the rows
    marked in ``flips``: torchvision's ``RandomCrop(size, padding)`` + ``RandomHorizontalFlip`` for a whole batch
    with given parameters (one gather, no per-image loop).

    Args:
        images: ``(B, C, H, W)``, any dtype (uint8 before normalisation: padding with 0 is a black pixel, as
            torchvision pads the PIL image).
        offsets: ``(B, 2)`` int64, (top, left) of each window in the padded image, in ``[0, 2 · padding]``.
        flips: ``(B,)`` bool, mirror left-right.
        padding: pixels added on each side (>= 0).

    Returns:
        ``(B, C, H, W)``, same dtype and device.

    Raises:
        ValueError: shapes that disagree, a negative padding or offsets outside ``[0, 2 · padding]``.
    """
    if images.ndim != 4 or offsets.shape != (len(images), 2) or flips.shape != (len(images),) or padding < 0:
        raise ValueError(f"need images (B, C, H, W), offsets (B, 2), flips (B,), padding >= 0; got "
                         f"{tuple(images.shape)}, {tuple(offsets.shape)}, {tuple(flips.shape)}, {padding}")
    if len(offsets) and (int(offsets.min()) < 0 or int(offsets.max()) > 2 * padding):
        raise ValueError(f"offsets must lie in [0, {2 * padding}]")
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (padding,) * 4) if padding else images
    offsets, flips = offsets.to(images.device), flips.to(images.device)
    cols = torch.arange(w, device=images.device)
    cols = torch.where(flips[:, None], w - 1 - cols, cols)  # the flip is a reversed column index
    rows = offsets[:, :1] + torch.arange(h, device=images.device)  # (B, H)
    cols = offsets[:, 1:] + cols  # (B, W)
    batch = torch.arange(b, device=images.device)[:, None, None]
    # advanced indices (B,1,1), (B,H,1), (B,1,W) around the channel slice put the channel axis last
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def random_crop_flip(images: Tensor, seed: Sequence[int], padding: int = 4) -> Tensor:
    """:func:`crop_flip` with parameters drawn from ``numpy.random.default_rng(seed)``: offsets uniform in
    ``[0, 2 · padding]``, each image flipped with probability 1/2. A pure function of ``seed`` (the data module
    passes (seed, rank, epoch, step), so a resumed run augments the same way).

    Shapes: ``(B, C, H, W)`` → ``(B, C, H, W)``, same dtype and device.
    """
    rng = np.random.default_rng(list(seed))
    offsets = torch.from_numpy(rng.integers(0, 2 * padding + 1, (len(images), 2)))
    flips = torch.from_numpy(rng.random(len(images)) < 0.5)
    return crop_flip(images, offsets, flips, padding)


class MultiPassSampler(EpochSampler):
    """``passes`` independent permutations per epoch, each cut to whole batches, from ``(seed, epoch)``.

    With batches of queries + templates (the kNN protocol) two passes give each image one turn as a query and
    one as a template per epoch on average, the step count of Grover et al.'s zipped loaders, while no batch
    holds an image twice (queries and templates are disjoint).
    """

    def __init__(self, n: int, seed: int, passes: int, batch_size: int) -> None:
        super().__init__(n, seed)
        if passes < 1 or batch_size < 1 or batch_size > n:
            raise ValueError(f"need passes >= 1 and 1 <= batch_size <= n = {n}, got {passes}, {batch_size}")
        self.passes, self.batch_size = int(passes), int(batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch ``epoch``: the passes one after another."""
        rng = np.random.default_rng([self.seed, 2, int(epoch)])
        whole = self.n - self.n % self.batch_size
        return np.concatenate([rng.permutation(self.n)[:whole] for _ in range(self.passes)])

    def __len__(self) -> int:
        return self.passes * (self.n - self.n % self.batch_size)


class ImageDataModule(L.LightningDataModule):
    """A canonical image classification set split train / val / test, in memory.

    Args:
        dataset: ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"`` or ``"cifar100"``.
        data_dir: torchvision root (``paths.data_dir``).
        download: let torchvision fetch missing files (needs the network).
        val_size: images held out of the training files for validation (seeded by ``split_seed``).
        batch_size: training images per step (the kNN protocol: queries + templates, 100 + 100).
        passes_per_epoch: passes over the training split per epoch (:class:`MultiPassSampler`).
        eval_batch_size: validation / test / reference batch size.
        seed: the training order (the run's seed). split_seed: the validation split (fixed by default).
        num_workers: DataLoader workers (0: batches are tensor gathers).
        num_classes / image_shape: optional, checked against the data (the yaml states them for interpolation).
        augment: training batches get a random crop (``crop_padding`` pixels of zero padding) and a horizontal
            flip, drawn from (``seed``, rank, epoch, step); the images then stay uint8 until they reached the
            device, where :meth:`on_after_batch_transfer` augments (training only) and normalises.
        crop_padding: the padding of the random crop (4: torchvision's ``RandomCrop(32, padding=4)``).

    Batches (after :meth:`on_after_batch_transfer`): ``(images (B, C, H, W) float32, normalised per channel,
    labels (B,) int64)``; with ``augment`` the loaders themselves yield uint8 images.

    Raises:
        ValueError: unknown dataset, ``val_size`` outside ``[1, N)``, or num_classes / image_shape that disagree.
        FileNotFoundError: (in ``setup``) files missing offline.
    """

    def __init__(self, dataset: str, data_dir: str = "data", download: bool = False, val_size: int = 5000,
                 batch_size: int = 200, passes_per_epoch: int = 1, eval_batch_size: int = 1000, seed: int = 0,
                 split_seed: int = 0, num_workers: int = 0, num_classes: int | None = None,
                 image_shape: Sequence[int] | None = None, augment: bool = False, crop_padding: int = 4) -> None:
        super().__init__()
        if dataset not in IMAGE_SETS:
            raise ValueError(f"dataset must be one of {sorted(IMAGE_SETS)}, got {dataset!r}")
        spec = IMAGE_SETS[dataset]
        if num_classes is not None and int(num_classes) != spec.num_classes:
            raise ValueError(f"num_classes = {num_classes} does not match {dataset} ({spec.num_classes})")
        if image_shape is not None and tuple(image_shape) != spec.image_shape:
            raise ValueError(f"image_shape = {tuple(image_shape)} does not match {dataset} ({spec.image_shape})")
        self.dataset, self.data_dir, self.download = dataset, str(data_dir), bool(download)
        self.val_size, self.batch_size, self.passes = int(val_size), int(batch_size), int(passes_per_epoch)
        self.eval_batch_size, self.seed, self.split_seed = int(eval_batch_size), int(seed), int(split_seed)
        self.num_workers = int(num_workers)
        if crop_padding < 0:
            raise ValueError(f"crop_padding must be >= 0, got {crop_padding}")
        self.augment, self.crop_padding = bool(augment), int(crop_padding)
        self.num_classes, self.image_shape = spec.num_classes, spec.image_shape
        self.splits: dict[str, TensorDataset] = {}

    def _normalise(self, images: Tensor) -> Tensor:
        spec = IMAGE_SETS[self.dataset]
        mean = torch.tensor(spec.mean, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(spec.std, device=images.device).view(1, -1, 1, 1)
        return (images.float() / 255 - mean) / std

    def on_after_batch_transfer(self, batch: tuple[Tensor, Tensor], dataloader_idx: int) -> tuple[Tensor, Tensor]:
        """With ``augment``: the uint8 batch on the device → random crop + flip (training batches only) →
        float32 normalised per channel. Without: the batch as it is (already normalised in memory)."""
        x, y = batch
        if not self.augment or x.dtype != torch.uint8:
            return batch
        trainer = self.trainer
        if trainer is not None and trainer.training:
            x = random_crop_flip(x, (self.seed, 4, trainer.global_rank, trainer.current_epoch, trainer.global_step),
                                 self.crop_padding)
        return self._normalise(x), y

    def setup(self, stage: str | None = None) -> None:
        """Read the files once; hold out the validation images (a pure function of ``split_seed``)."""
        if self.splits:
            return
        x, y = load_image_arrays(self.dataset, self.data_dir, train=True, download=self.download)
        if not 0 < self.val_size < len(y):
            raise ValueError(f"val_size must be in [1, {len(y)}), got {self.val_size}")
        perm = torch.from_numpy(np.random.default_rng([self.split_seed, 3]).permutation(len(y)))
        val, train = perm[:self.val_size].sort().values, perm[self.val_size:].sort().values
        tx, ty = load_image_arrays(self.dataset, self.data_dir, train=False, download=self.download)
        if not self.augment:  # normalised once in memory; with augment on the device, per batch
            x, tx = self._normalise(x), self._normalise(tx)
        self.splits = {"train": TensorDataset(x[train], y[train]), "val": TensorDataset(x[val], y[val]),
                       "test": TensorDataset(tx, ty)}

    def _eval_loader(self, name: str) -> DataLoader:
        return DataLoader(self.splits[name], batch_size=self.eval_batch_size, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        """Training batches of ``batch_size``, ``passes_per_epoch`` shuffled passes (order from (seed, epoch)).

        Raises:
            ValueError: a training split smaller than one batch (no step would be taken).
        """
        check_one_batch(len(self.splits["train"]), self.batch_size, "the training files minus data.val_size")
        sampler = MultiPassSampler(len(self.splits["train"]), self.seed, self.passes, self.batch_size)
        return DataLoader(self.splits["train"], batch_size=self.batch_size, sampler=sampler, drop_last=True,
                          num_workers=self.num_workers, generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        """Validation batches."""
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        """Test batches."""
        return self._eval_loader("test")

    def reference_dataloader(self) -> DataLoader:
        """The training split in file order: the set a kNN classifier searches."""
        return self._eval_loader("train")


