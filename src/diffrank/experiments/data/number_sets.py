"""The pieces of the multi-digit sorting sets (:mod:`diffrank.experiments.data.mnist_sort`): MNIST's files and
splits, the digit pool that composes numbers, and the datasets of training sets (drawn afresh per batch, on the
host or on the device) and of fixed evaluation collections.

A number is ``digits`` digit images of one split's pool side by side along the width; its value is the decimal
number they spell (Σ_d 10^{digits-1-d} · label_d). Training sets are a pure function of
``(seed, epoch, batch index)``; evaluation collections are digit indices drawn once per ``split_seed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from diffrank.experiments.data.image_readers import load_image_arrays

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte")


def mnist_raw_folder(data_dir: str | Path) -> Path:
    """Where torchvision keeps MNIST under ``data_dir``: ``<data_dir>/MNIST/raw``."""
    return Path(data_dir) / "MNIST" / "raw"


def check_mnist_files(data_dir: str | Path) -> None:
    """Raise unless ``<data_dir>/MNIST/raw/`` holds the four uncompressed idx files.

    Raises:
        FileNotFoundError: the message lists every missing path and how to provide it.
    """
    raw = mnist_raw_folder(data_dir)
    missing = [raw / f for f in MNIST_FILES if not (raw / f).is_file()]
    if missing:
        raise FileNotFoundError(
            "MNIST files not found: " + ", ".join(str(m) for m in missing) + ". Put the uncompressed idx files "
            f"in {raw}/ (torchvision layout), or set data.download=true to fetch them, or point "
            "paths.data_dir (env DIFFRANK_DATA) at a folder that has MNIST/raw/."
        )


def load_mnist(data_dir: str | Path, download: bool = False) -> dict[str, tuple[Tensor, Tensor]]:
    """MNIST as uint8 tensors: ``{"train": (images (60000, 28, 28), labels (60000,)), "test": (…10000…)}``.

    Args:
        data_dir: root holding ``MNIST/raw/`` (torchvision layout, uncompressed idx files).
        download: fetch the files with torchvision when they are missing (needs internet).

    Raises:
        FileNotFoundError: files missing and ``download`` false; the message lists the missing paths and
            how to provide them.
        ValueError: a truncated or corrupt file, or labels outside 0..9 (:func:`~diffrank.experiments.data.
            image_readers.load_image_arrays` names the file).
    """
    from torchvision.datasets import MNIST

    raw = mnist_raw_folder(data_dir)
    if download and not all((raw / f).is_file() for f in MNIST_FILES):
        MNIST(str(data_dir), train=True, download=True)
        MNIST(str(data_dir), train=False, download=True)
    check_mnist_files(data_dir)
    out = {}
    for split, train in (("train", True), ("test", False)):
        images, labels = load_image_arrays("mnist", data_dir, train=train)  # checks the files' contents
        out[split] = (images.squeeze(1), labels)
    return out


def number_values(labels: Tensor) -> Tensor:
    """Decimal values of numbers from their digit labels.

    Args:
        labels: ``(..., digits)`` int64 digit labels in 0..9, most significant first.

    Returns:
        ``(...)`` int64, Σ_d 10^{digits-1-d} · labels[..., d].
    """
    d = labels.shape[-1]
    place = 10 ** torch.arange(d - 1, -1, -1, dtype=torch.int64, device=labels.device)
    return (labels * place).sum(-1)


class DigitPool:
    """The digit images and labels of one split, and how numbers are composed from them.

    Args:
        images: ``(N, H, W)`` uint8 (0..255) or float in [0, 1].
        labels: ``(N,)`` int64 in 0..9.
        source_indices: ``(N,)`` indices of these images in the source dataset (for leak checks).

    Raises:
        ValueError: empty pool or mismatched lengths.
    """

    def __init__(self, images: Tensor, labels: Tensor, source_indices: Tensor | None = None) -> None:
        if len(images) == 0 or len(images) != len(labels):
            raise ValueError(f"a digit pool needs as many labels as images (> 0), got {len(images)} / {len(labels)}")
        self.images = images if images.dtype == torch.uint8 else images.float()
        self.labels = labels.long()
        self.source_indices = source_indices if source_indices is not None else torch.arange(len(images))

    def __len__(self) -> int:
        return len(self.images)

    def draw(self, rng: np.random.Generator, sets: int, n: int, digits: int) -> np.ndarray:
        """Digit indices ``(sets, n, digits)`` drawn uniformly with replacement."""
        return rng.integers(0, len(self), size=(sets, n, digits), dtype=np.int64)

    def compose(self, idx: np.ndarray | Tensor) -> tuple[Tensor, Tensor]:
        """Images and values of the numbers spelled by digit indices.

        Args:
            idx: ``(S, n, digits)`` indices into the pool.

        Returns:
            ``images (S, n, 1, H, digits·W)`` float32 in [0, 1], ``values (S, n)`` int64.
        """
        idx = torch.as_tensor(idx, dtype=torch.int64)
        s, n, d = idx.shape
        img = self.images[idx]  # (S, n, d, H, W)
        h, w = img.shape[-2:]
        img = img.permute(0, 1, 3, 2, 4).reshape(s, n, 1, h, d * w)
        img = img.float() / 255.0 if img.dtype == torch.uint8 else img.float()
        return img, number_values(self.labels[idx])

    def to(self, device: torch.device | str) -> DigitPool:
        """The same pool with images and labels on ``device`` (``self`` when they are there already)."""
        device = torch.device(device)
        if self.images.device == device:
            return self
        return DigitPool(self.images.to(device), self.labels.to(device), self.source_indices)

    def draw_tensor(self, generator: torch.Generator, sets: int, n: int, digits: int) -> Tensor:
        """Digit indices ``(sets, n, digits)`` int64, uniform with replacement, drawn by ``generator`` on its
        device (the pool's images must be on that device for :meth:`compose`)."""
        return torch.randint(0, len(self), (sets, n, digits), generator=generator, device=generator.device)


class SetKey(NamedTuple):
    """What the device-resident training loader yields per step: the batch's ``(epoch, index)``, host ints."""

    epoch: int
    index: int


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit generator seed for one training batch, a pure function of ``(seed, epoch, index)``.

    Mixed by numpy's ``SeedSequence`` (stream tag 2, apart from the host path's numpy streams), on the host.
    """
    state = np.random.SeedSequence([int(seed), 2, int(epoch), int(index)]).generate_state(2, np.uint32)
    return (int(state[0]) << 31 ^ int(state[1])) & (2**63 - 1)


class ResidentSetBatches(Dataset):
    """Device-resident training batches: item ``(epoch, i)`` is the :class:`SetKey`; :meth:`compose` builds
    the batch on a device.

    Args:
        pool: the training split's digits (host tensors; copied to a device once, on first use there).
        n, digits, batch_size, batches, seed: as :class:`RandomSetBatches`.

    ``compose(key, device)`` returns ``(images (B, n, 1, H, digits·W) float32 in [0, 1], values (B, n)
    int64)`` on ``device``, a pure function of ``(seed, key.epoch, key.index)`` and the device type (CPU and
    CUDA generators differ).
    """

    def __init__(self, pool: DigitPool, n: int, digits: int, batch_size: int, batches: int, seed: int) -> None:
        self.pool, self.n, self.digits, self.batch_size = pool, n, digits, batch_size
        self.batches, self.seed = batches, seed
        self._resident: dict[torch.device, tuple[DigitPool, torch.Generator]] = {}

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, key: tuple[int, int] | int) -> SetKey:
        epoch, i = key if isinstance(key, tuple) else (0, int(key))
        return SetKey(int(epoch), int(i))

    def compose(self, key: SetKey, device: torch.device | str) -> tuple[Tensor, Tensor]:
        """The batch of ``key`` composed on ``device`` (see the class docstring)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._resident:
            self._resident[device] = (self.pool.to(device), torch.Generator(device=device))
        pool, gen = self._resident[device]
        gen.manual_seed(batch_seed(self.seed, key.epoch, key.index))
        return pool.compose(pool.draw_tensor(gen, self.batch_size, self.n, self.digits))


class RandomSetBatches(Dataset):
    """Training batches drawn afresh: item ``(epoch, i)`` = one batch ``(images (B, n, 1, H, W'), values (B, n))``.

    The batch is a pure function of ``(seed, epoch, i)``, so workers and DDP ranks never duplicate
    batches and a resumed run draws the same sets.
    """

    def __init__(self, pool: DigitPool, n: int, digits: int, batch_size: int, batches: int, seed: int) -> None:
        self.pool, self.n, self.digits, self.batch_size = pool, n, digits, batch_size
        self.batches, self.seed = batches, seed

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, key: tuple[int, int] | int) -> tuple[Tensor, Tensor]:
        epoch, i = key if isinstance(key, tuple) else (0, int(key))
        rng = np.random.default_rng([self.seed, 0, int(epoch), int(i)])
        return self.pool.compose(self.pool.draw(rng, self.batch_size, self.n, self.digits))


class FixedSets(Dataset):
    """A materialised evaluation collection: item i = ``(images, values[, images5, values5])`` of set i.

    Args:
        pool: the split's digits.
        idx: ``(S, n, digits)`` digit indices of the n-sets.
        idx5: ``(S, 5, digits)`` digit indices of the dedicated 5-sets, or None.
    """

    def __init__(self, pool: DigitPool, idx: np.ndarray, idx5: np.ndarray | None) -> None:
        self.pool, self.idx, self.idx5 = pool, torch.from_numpy(idx), None if idx5 is None else torch.from_numpy(idx5)

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int) -> tuple[Tensor, ...]:
        x, v = self.pool.compose(self.idx[i : i + 1])
        if self.idx5 is None:
            return x[0], v[0]
        x5, v5 = self.pool.compose(self.idx5[i : i + 1])
        return x[0], v[0], x5[0], v5[0]


def parse_device_resident(value: bool | str) -> bool | str:
    """``"auto"``, ``True`` or ``False`` from a config value (bools, or the strings auto / true / false).

    Raises:
        ValueError: any other value.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("auto", "true", "false"):
        return {"auto": "auto", "true": True, "false": False}[text]
    raise ValueError(f"device_resident must be auto, true or false, got {value!r}")
