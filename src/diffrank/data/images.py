"""MNIST, Fashion-MNIST and CIFAR-10 in torchvision's on-disk formats, held in memory as normalised tensors.

``data=mnist`` / ``fashion_mnist`` / ``cifar10``: the canonical train / test files under ``paths.data_dir``
(torchvision's layout: ``MNIST/raw/``, ``FashionMNIST/raw/``, ``cifar-10-batches-py/``), a seeded validation
split held out of the training set (Grover et al. 2019 hold out 5 000 MNIST images), no augmentation (Xie et
al. 2020, App. I). The sets are small enough to keep in memory as tensors (MNIST 190 MB, CIFAR-10 600 MB in
float32), so a batch is an index gather: no per-image transforms, no workers.

Offline (``download=false``, the default) a missing file raises :class:`FileNotFoundError` naming it and where
to put it; ``download=true`` lets torchvision fetch the files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from diffrank.data.digits import EpochShuffleSampler


@dataclass(frozen=True)
class ImageSet:
    """How one dataset is stored: torchvision class, folder and files under ``data_dir``, normalisation."""

    torchvision_class: str
    folder: str
    files: tuple[str, ...]
    image_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    url: str


_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte")
IMAGE_SETS = {
    "mnist": ImageSet("MNIST", "MNIST/raw", _MNIST_FILES, (1, 28, 28), 10, (0.1307,), (0.3081,),
                      "https://ossci-datasets.s3.amazonaws.com/mnist/"),
    "fashion_mnist": ImageSet("FashionMNIST", "FashionMNIST/raw", _MNIST_FILES, (1, 28, 28), 10, (0.2860,),
                              (0.3530,), "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"),
    "cifar10": ImageSet("CIFAR10", "cifar-10-batches-py",
                        (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"), (3, 32, 32), 10,
                        (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
                        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
}


def missing_files(name: str, data_dir: str | Path) -> list[Path]:
    """Files of dataset ``name`` that are absent under ``data_dir`` (MNIST idx files must be extracted).

    Raises:
        KeyError: unknown dataset name.
    """
    spec = IMAGE_SETS[name]
    folder = Path(data_dir) / spec.folder
    return [folder / f for f in spec.files if not (folder / f).is_file()]


def load_image_arrays(name: str, data_dir: str | Path, train: bool, download: bool = False) -> tuple[Tensor, Tensor]:
    """One canonical split of a dataset as uint8 images and int64 labels (MNIST-format files through
    torchvision, CIFAR-10's pickled batches read directly).

    Args:
        name: ``"mnist"``, ``"fashion_mnist"`` or ``"cifar10"``.
        data_dir: the root torchvision reads (``paths.data_dir``).
        train: the training file(s) (MNIST 60 000, CIFAR-10 50 000 images) or the test file (10 000).
        download: let torchvision fetch missing files.

    Returns:
        ``(images (N, C, H, W) uint8, labels (N,) int64)``.

    Raises:
        KeyError: unknown name.
        FileNotFoundError: files missing and ``download`` false; the message names them and the source.
    """
    import torchvision

    spec = IMAGE_SETS[name]
    missing = missing_files(name, data_dir)
    if missing and not download:
        packed = [p for p in missing if p.with_name(p.name + ".gz").is_file()]
        hint = f" ({', '.join(p.name for p in packed)}: gunzip the .gz beside it)" if packed else ""
        raise FileNotFoundError(
            f"{name}: missing {', '.join(str(p) for p in missing)}{hint}. Put the official files there "
            f"(torchvision layout under paths.data_dir={data_dir}; source {spec.url}) or run with data.download=true")
    if name == "cifar10":
        if missing:
            torchvision.datasets.CIFAR10(root=str(data_dir), train=train, download=True)
        return _read_cifar10(Path(data_dir) / spec.folder, train)
    ds = getattr(torchvision.datasets, spec.torchvision_class)(root=str(data_dir), train=train, download=download)
    return torch.as_tensor(np.asarray(ds.data)).unsqueeze(1).contiguous(), torch.as_tensor(np.asarray(ds.targets))


def _read_cifar10(folder: Path, train: bool) -> tuple[Tensor, Tensor]:
    # the python archive's pickled batches read directly: torchvision's reader also demands the official
    # files' MD5 sums, which rules out test files in the same format
    import pickle

    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    images, labels = [], []
    for name in names:
        with (folder / name).open("rb") as f:
            batch = pickle.load(f, encoding="bytes")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))  # rows are CHW planes
        labels.extend(batch[b"labels"])
    return torch.from_numpy(np.concatenate(images)), torch.as_tensor(labels, dtype=torch.int64)


class MultiPassSampler(EpochShuffleSampler):
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
        dataset: ``"mnist"``, ``"fashion_mnist"`` or ``"cifar10"``.
        data_dir: torchvision root (``paths.data_dir``).
        download: let torchvision fetch missing files (needs the network).
        val_size: images held out of the training files for validation (seeded by ``split_seed``).
        batch_size: training images per step (the kNN protocol: queries + templates, 100 + 100).
        passes_per_epoch: passes over the training split per epoch (:class:`MultiPassSampler`).
        eval_batch_size: validation / test / reference batch size.
        seed: the training order (the run's seed). split_seed: the validation split (fixed by default).
        num_workers: DataLoader workers (0: batches are tensor gathers).
        num_classes / image_shape: optional, checked against the data (the yaml states them for interpolation).

    Batches: ``(images (B, C, H, W) float32, normalised per channel, labels (B,) int64)``.

    Raises:
        ValueError: unknown dataset, ``val_size`` outside ``[1, N)``, or num_classes / image_shape that disagree.
        FileNotFoundError: (in ``setup``) files missing offline.
    """

    def __init__(self, dataset: str, data_dir: str = "data", download: bool = False, val_size: int = 5000,
                 batch_size: int = 200, passes_per_epoch: int = 1, eval_batch_size: int = 1000, seed: int = 0,
                 split_seed: int = 0, num_workers: int = 0, num_classes: int | None = None,
                 image_shape: Sequence[int] | None = None) -> None:
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
        self.num_classes, self.image_shape = spec.num_classes, spec.image_shape
        self.splits: dict[str, TensorDataset] = {}

    def _normalise(self, images: Tensor) -> Tensor:
        spec = IMAGE_SETS[self.dataset]
        mean = torch.tensor(spec.mean).view(1, -1, 1, 1)
        std = torch.tensor(spec.std).view(1, -1, 1, 1)
        return (images.float() / 255 - mean) / std

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
        x = self._normalise(x)
        self.splits = {"train": TensorDataset(x[train], y[train]), "val": TensorDataset(x[val], y[val]),
                       "test": TensorDataset(self._normalise(tx), ty)}

    def _eval_loader(self, name: str) -> DataLoader:
        return DataLoader(self.splits[name], batch_size=self.eval_batch_size, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        """Training batches of ``batch_size``, ``passes_per_epoch`` shuffled passes (order from (seed, epoch))."""
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
