"""Sets of SVHN house-number images for the ranking-supervision benchmark (thesis §3.5 "SVHN", Tables 3.4, 3.6, 3.7).

Data (thesis §3.5 "SVHN"; official ``diffsort`` ``datasets/svhn_multi.py``): Format-1 SVHN
preprocessed as in Goodfellow et al. 2013 (bounding box of the whole number enlarged by 30 %, resized to
64 x 64 RGB), distributed as three files ``svhn-multi-digit-3x64x64_{train,val,test}.p``, each a
``torch.save``'d tuple ``(images uint8 (N, 3, 64, 64), labels (N,) = the house number)``;
train = 230 755, val = 5 000, test = 13 068 images. We expect them in ``<data_dir>/SVHNMultiDigit/``.

Preprocessing as the official code, on *every* split: a random 54 x 54 crop, pixels /255, then
normalisation with mean 0.5 and std 0.5 per channel (values in [-1, 1]). Numbers are used as they are
(1-5 digits, no concatenation). A set = n consecutive images of the loader: shuffled anew every epoch for
training, in file order for validation / test (whose crops we fix per ``split_seed``, like the MNIST collections).
EM5 for n < 5: dedicated 5-sets, consecutive 5-image chunks of a seeded permutation of the split; for
n >= 5 the model uses the disjoint 5-chunks of the n-sets (the official code: the first 5 of each set).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from diffrank.experiments.data.samplers import EpochSampler

SVHN_FILES = {split: f"svhn-multi-digit-3x64x64_{split}.p" for split in ("train", "val", "test")}
# md5 of the official files (``diffsort``'s dataset class), checked with ``check_md5=true``
SVHN_MD5 = {"train": "25df8732e1f16fef945c3d9a47c99c1a", "val": "fe5a3b450ce09481b68d7505d00715b3",
            "test": "332977317a21e9f1f5afe7ef47729c5c"}
SVHN_URL = "https://nyc3.digitaloceanspaces.com/publicdata1/"


def svhn_folder(data_dir: str | Path) -> Path:
    """``<data_dir>/SVHNMultiDigit``."""
    return Path(data_dir) / "SVHNMultiDigit"


def check_svhn_files(data_dir: str | Path) -> None:
    """Raise unless ``<data_dir>/SVHNMultiDigit/`` holds the three split files.

    Raises:
        FileNotFoundError: the message lists every missing path and how to provide it.
    """
    missing = [svhn_folder(data_dir) / f for f in SVHN_FILES.values() if not (svhn_folder(data_dir) / f).is_file()]
    if missing:
        raise FileNotFoundError(
            "SVHN multi-digit files not found: " + ", ".join(str(m) for m in missing) + ". Put the preprocessed "
            f"files (official diffsort SVHN release) in {svhn_folder(data_dir)}/, or set data.download=true, or "
            "point paths.data_dir at a folder holding SVHNMultiDigit/.")


def load_svhn_split(data_dir: str | Path, split: str, download: bool = False,
                    check_md5: bool = False) -> tuple[Tensor, Tensor]:
    """One split as ``(images uint8 (N, 3, 64, 64), labels int64 (N,))``.

    Raises:
        FileNotFoundError: the file is missing (and ``download`` false); the message names the path.
        ValueError: an unknown split, a wrong checksum, or a file that is not the expected tuple.
    """
    if split not in SVHN_FILES:
        raise ValueError(f"split must be one of {sorted(SVHN_FILES)}, got {split!r}")
    path = svhn_folder(data_dir) / SVHN_FILES[split]
    if not path.is_file() and download:
        from torchvision.datasets.utils import download_url

        download_url(SVHN_URL + SVHN_FILES[split], str(path.parent), path.name, SVHN_MD5[split])
    if not path.is_file():
        raise FileNotFoundError(
            f"SVHN multi-digit file not found: {path}. Put the preprocessed files "
            f"{', '.join(SVHN_FILES.values())} (official diffsort SVHN release) in {path.parent}/, or set "
            "data.download=true, or point paths.data_dir at a folder holding SVHNMultiDigit/.")
    if check_md5:
        digest = hashlib.md5(path.read_bytes()).hexdigest()
        if digest != SVHN_MD5[split]:
            raise ValueError(f"{path}: md5 {digest} differs from the official {SVHN_MD5[split]}")
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise ValueError(f"{path} must hold a tuple (images, labels), got {type(data).__name__}")
    images, labels = torch.as_tensor(data[0]), torch.as_tensor(data[1]).long().reshape(-1)
    if images.dim() != 4 or images.shape[1] != 3 or len(images) != len(labels):
        raise ValueError(f"{path}: expected images (N, 3, H, W) and N labels, got {tuple(images.shape)} and "
                         f"{tuple(labels.shape)}")
    return images.to(torch.uint8), labels


def crop_normalize(images: Tensor, top: Tensor, left: Tensor, size: int) -> Tensor:
    """Crops ``(S, 3, size, size)`` at the given offsets, scaled to [-1, 1] ((x/255 - 0.5) / 0.5).

    Args:
        images: ``(S, 3, H, W)`` uint8. top / left: ``(S,)`` int64 offsets. size: crop side.
    """
    s = images.shape[0]
    rows = (top.view(s, 1) + torch.arange(size)).view(s, 1, size, 1)
    cols = (left.view(s, 1) + torch.arange(size)).view(s, 1, 1, size)
    ch = torch.arange(images.shape[1]).view(1, -1, 1, 1)
    out = images[torch.arange(s).view(s, 1, 1, 1), ch, rows, cols]
    return out.float().div(255.0).sub(0.5).div(0.5)


class _SVHNSets(Dataset):
    """Sets given by image indices ``(S, n)`` and crop offsets ``(S, n, 2)``; training draws them per (epoch, i)."""

    def __init__(self, images: Tensor, labels: Tensor, n: int, crop: int, seed: int, *, batch_size: int = 0,
                 train: bool = False, with5: bool = False) -> None:
        self.images, self.labels, self.n, self.crop, self.seed = images, labels, n, crop, seed
        self.batch_size, self.train = batch_size, train
        self.span = images.shape[-1] - crop + 1
        if train:
            self.length = len(images) // (n * batch_size)
            return
        count = len(images) // n
        rng = np.random.default_rng([seed, 3])
        self.idx = torch.arange(count * n).view(count, n)
        self.offsets = torch.from_numpy(rng.integers(0, self.span, size=(count, n, 2)))
        self.idx5 = self.offsets5 = None
        if with5:
            perms = np.concatenate([rng.permutation(len(images)) for _ in range(-(-5 * count // len(images)))])
            self.idx5 = torch.from_numpy(perms[: 5 * count]).view(count, 5)
            self.offsets5 = torch.from_numpy(rng.integers(0, self.span, size=(count, 5, 2)))
        self.length = count

    def __len__(self) -> int:
        return self.length

    def _sets(self, idx: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
        s, n = idx.shape
        x = crop_normalize(self.images[idx.reshape(-1)], offsets[..., 0].reshape(-1), offsets[..., 1].reshape(-1),
                           self.crop)
        return x.view(s, n, *x.shape[1:]), self.labels[idx]

    def __getitem__(self, key):
        if self.train:
            epoch, i = key if isinstance(key, tuple) else (0, int(key))
            # one permutation per epoch, cut into sets of n: the official shuffled loader reshaped to (B, n)
            perm = torch.from_numpy(np.random.default_rng([self.seed, 0, int(epoch)]).permutation(len(self.images)))
            chunk = perm[i * self.batch_size * self.n:(i + 1) * self.batch_size * self.n].view(self.batch_size, self.n)
            off = torch.from_numpy(np.random.default_rng([self.seed, 1, int(epoch), int(i)]).integers(
                0, self.span, size=(self.batch_size, self.n, 2)))
            return self._sets(chunk, off)
        i = int(key)
        x, v = self._sets(self.idx[i : i + 1], self.offsets[i : i + 1])
        if self.idx5 is None:
            return x[0], v[0]
        x5, v5 = self._sets(self.idx5[i : i + 1], self.offsets5[i : i + 1])
        return x[0], v[0], x5[0], v5[0]


class SVHNSortDataModule(L.LightningDataModule):
    """Sets of n SVHN house numbers (3 x 54 x 54 crops) for ranking supervision.

    Args:
        n: set size (>= 2).
        data_dir: root holding ``SVHNMultiDigit/svhn-multi-digit-3x64x64_{train,val,test}.p``.
        download: fetch missing files from the official release (needs internet).
        check_md5: verify the official checksums (reads the files twice).
        batch_size: sets per batch (100). eval_batch_size: sets per evaluation batch.
        crop: crop side (54).
        em5: add dedicated 5-sets to validation / test batches when n < 5.
        seed: seeds the training shuffles and crops (``seed`` of the run).
        split_seed: seeds the evaluation crops and 5-sets (fixed by default).
        num_workers: DataLoader workers.
        image_shape: optional, checked against ``(3, crop, crop)``.

    Batches: train ``(images (B, n, 3, 54, 54) float32 in [-1, 1], values (B, n) int64)``; val / test add
    ``(images5 (B, 5, …), values5 (B, 5))`` when ``em5`` and n < 5.

    Raises:
        ValueError: bad sizes; FileNotFoundError: missing files and ``download`` false, at construction
            (see :func:`check_svhn_files`).
    """

    def __init__(self, n: int = 5, data_dir: str | Path = "data", download: bool = False, check_md5: bool = False,
                 batch_size: int = 100, eval_batch_size: int | None = None, crop: int = 54, em5: bool = True,
                 seed: int = 0, num_workers: int = 0, image_shape: tuple[int, ...] | None = None,
                 split_seed: int = 0) -> None:
        super().__init__()
        if int(n) < 2:
            raise ValueError(f"a set needs at least n = 2 numbers, got n = {n}")
        self.n, self.data_dir, self.download, self.check_md5 = int(n), Path(data_dir), bool(download), bool(check_md5)
        self.batch_size, self.crop, self.em5 = int(batch_size), int(crop), bool(em5)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.seed, self.num_workers = int(seed), int(num_workers)
        self.split_seed = int(split_seed)
        self.image_shape = (3, self.crop, self.crop)
        if image_shape is not None and tuple(int(v) for v in image_shape) != self.image_shape:
            raise ValueError(f"image_shape = {tuple(image_shape)} does not match the data ({self.image_shape})")
        if not self.download:
            check_svhn_files(self.data_dir)  # now, naming the files, rather than at the first fit
        self.datasets: dict[str, _SVHNSets] = {}

    def setup(self, stage: str | None = None) -> None:
        """Load the three files and fix the evaluation sets and crops."""
        if self.datasets:
            return
        for split in ("train", "val", "test"):
            images, labels = load_svhn_split(self.data_dir, split, self.download, self.check_md5)
            if images.shape[-1] < self.crop or images.shape[-2] < self.crop:
                raise ValueError(f"SVHN {split} images {tuple(images.shape[-2:])} are smaller than the crop "
                                 f"{self.crop}")
            train = split == "train"
            seed = self.seed if train else self.split_seed + 7 * (split == "test")
            ds = _SVHNSets(images, labels, self.n, self.crop, seed,
                           batch_size=self.batch_size, train=train, with5=self.em5 and self.n < 5)
            if len(ds) == 0:
                raise ValueError(f"SVHN {split} has {len(images)} images: too few for one batch of sets")
            self.datasets[split] = ds

    def train_dataloader(self) -> DataLoader:
        """One batch of sets per step, a new shuffle per epoch."""
        ds = self.datasets["train"]
        return DataLoader(ds, batch_size=None, sampler=EpochSampler(len(ds), keys=True), num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        """Validation sets (file order, fixed crops)."""
        return DataLoader(self.datasets["val"], batch_size=self.eval_batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        """Test sets (file order, fixed crops)."""
        return DataLoader(self.datasets["test"], batch_size=self.eval_batch_size, num_workers=self.num_workers)
