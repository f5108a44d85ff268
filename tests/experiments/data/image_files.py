"""Tiny MNIST / Fashion-MNIST (idx), CIFAR-10 and CIFAR-100 (pickle) files in the official on-disk formats (the
CIFAR-100 writer is the framework's own, :func:`diffrank.experiments.data.image_readers.write_random_cifar100`)."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

from diffrank.experiments.data.image_readers import write_random_cifar100 as write_cifar100  # noqa: F401  (one writer)


def write_idx(path: Path, array: np.ndarray) -> None:
    """An idx file as on yann.lecun.com: magic (0, 0, 0x08 = uint8, ndim), big-endian sizes, the bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str, n_train: int = 300, n_test: int = 60, seed: int = 0) -> None:
    """``root/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` with random images, labels 0-9."""
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)


def write_cifar10(root: Path, per_batch: int = 60, n_test: int = 60, seed: int = 0) -> None:
    """``root/cifar-10-batches-py/`` as in the official python archive: pickled dicts of byte keys,
    ``data`` (N, 3072) uint8 in CHW order, ``labels`` a list; ``batches.meta`` with the label names."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", n_test)]:
        batch = {b"batch_label": name.encode(), b"labels": [int(v) for v in np.arange(n) % 10],
                 b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"filenames": [f"{i}.png".encode() for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(batch))
    meta = {b"label_names": [f"class{i}".encode() for i in range(10)], b"num_cases_per_batch": per_batch,
            b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
