"""The files of MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 in torchvision's on-disk formats, read as tensors.

:data:`IMAGE_SETS` describes each set (folder, files, shape, normalisation); :func:`load_image_arrays` reads one
canonical split as uint8 images and int64 labels, checking that the files are the official ones (size, md5, not
gzipped, not blank). Offline (``download=false``) a missing file raises :class:`FileNotFoundError` naming it and
where to put it. :func:`write_random_cifar100` writes random pixels in the CIFAR-100 layout (throughput
measurements, tests). :class:`~diffrank.experiments.data.images.ImageDataModule` holds the splits in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor


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
    "cifar100": ImageSet("CIFAR100", "cifar-100-python", ("train", "test", "meta"), (3, 32, 32), 100,
                         (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
                         "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}
_CIFAR = {"cifar10": "CIFAR10", "cifar100": "CIFAR100"}

# size in bytes and md5 of each canonical uncompressed idx file (the official .gz archives, whose md5s torchvision
# lists in MNIST.resources / FashionMNIST.resources, gunzipped): a file of that size under that name claims to be the
# canonical one, so another md5 means it was altered (zeroed pixels, flipped bytes) or is the other data set's
_IDX_SIZES = {"train-images-idx3-ubyte": 47040016, "train-labels-idx1-ubyte": 60008,
              "t10k-images-idx3-ubyte": 7840016, "t10k-labels-idx1-ubyte": 10008}
CANONICAL_MD5 = {
    "mnist": {"train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
              "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
              "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
              "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637"},
    "fashion_mnist": {"train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
                      "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
                      "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
                      "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965"},
}
_GZIP_MAGIC = b"\x1f\x8b"


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
    torchvision, CIFAR-10's / CIFAR-100's pickled batches read directly; CIFAR-100: the 100 ``fine_labels``).

    Args:
        name: ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"`` or ``"cifar100"``.
        data_dir: the root torchvision reads (``paths.data_dir``).
        train: the training file(s) (MNIST 60 000, CIFAR 50 000 images) or the test file (10 000).
        download: let torchvision fetch missing files.

    Returns:
        ``(images (N, C, H, W) uint8, labels (N,) int64)``.

    Raises:
        KeyError: unknown name.
        FileNotFoundError: files missing and ``download`` false; the message names them and the source.
        ValueError: a file that is truncated, gzip-compressed, not in the official format, of the canonical size
            but another md5 (:func:`check_idx_files`), images of another shape or all of one value, or labels
            outside ``0 … num_classes - 1``; the message names the file(s).
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
    folder = Path(data_dir) / spec.folder
    if name in _CIFAR:
        if missing:
            getattr(torchvision.datasets, _CIFAR[name])(root=str(data_dir), train=train, download=True)
        names = ([f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]) if name == "cifar10" \
            else ["train" if train else "test"]
        label_key = b"labels" if name == "cifar10" else b"fine_labels"
        parts = [_read_cifar_batch(folder / n, label_key, spec.url) for n in names]
        images, labels = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        files = [folder / n for n in names]
    else:
        files = [folder / f for f in spec.files if f.startswith("train-" if train else "t10k-")]
        check_idx_files(name, files, spec.url)
        try:
            ds = getattr(torchvision.datasets, spec.torchvision_class)(root=str(data_dir), train=train,
                                                                       download=download)
        except (RuntimeError, ValueError, EOFError) as e:  # torchvision's reshape of a truncated idx file
            raise unreadable(files, "idx (MNIST-format) files", e, spec.url) from None
        images = torch.as_tensor(np.asarray(ds.data)).unsqueeze(1).contiguous()
        labels = torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64)
    check_split(name, images, labels, files)
    return images, labels


def _md5(path: Path) -> str:
    import hashlib

    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def refuse_gzip(path: Path, what: str) -> None:
    """Refuse a gzip archive stored under the uncompressed name (the parsers otherwise fail on its first bytes with
    a bare ``AssertionError`` or an unpickling error).

    Raises:
        ValueError: naming the file and the command that unpacks it.
    """
    with path.open("rb") as f:
        if f.read(2) == _GZIP_MAGIC:
            raise ValueError(f"{path}: is gzip-compressed (a .gz archive under the uncompressed name); the reader "
                             f"needs the uncompressed {what}: mv {path} {path}.gz && gunzip {path}.gz")


def check_idx_files(name: str, files: list[Path], source: str) -> None:
    """What can be checked of MNIST-format files before they are parsed: a gzip archive under the uncompressed name
    (torchvision's parser only asserted on its magic number), and, for a file of the canonical size, its md5
    (:data:`CANONICAL_MD5`; test files in the format have other sizes and are not compared).

    Args:
        name: ``"mnist"`` or ``"fashion_mnist"``.
        files: the idx files of one split.
        source: where the official files come from, for the message.

    Raises:
        ValueError: a gzip-compressed file (the message says how to unpack it), or a file of the canonical size
            whose md5 differs (naming the file, both md5s, and the other data set when it is that one's).
    """
    for path in files:
        if not path.is_file():
            continue  # download=true fetches it
        refuse_gzip(path, "idx file")
        if name not in CANONICAL_MD5 or path.stat().st_size != _IDX_SIZES.get(path.name):
            continue
        digest, expected = _md5(path), CANONICAL_MD5[name][path.name]
        if digest != expected:
            other = [o for o, sums in CANONICAL_MD5.items() if o != name and sums.get(path.name) == digest]
            what = f"it is {other[0]}'s file" if other else "it is corrupt or altered (zeroed pixels, flipped bytes)"
            raise ValueError(f"{path}: has the size of the canonical {name} file but md5 {digest}, not {expected}: "
                             f"{what}; replace it with the official file (source {source})")


def unreadable(files: list[Path], what: str, error: BaseException, source: str) -> ValueError:
    """The error for data files that exist but cannot be parsed: names them, the parser's complaint and where the
    official files come from (truncated downloads and other formats are the usual causes)."""
    reason = (str(error).strip().splitlines() or [""])[0][:200]
    return ValueError(f"{', '.join(str(f) for f in files)}: cannot be read as {what} ({type(error).__name__}: "
                      f"{reason}); the file is truncated or not the official one: replace it (source {source})")


def check_split(name: str, images: Tensor, labels: Tensor, files: list[Path]) -> None:
    """Refuse a split whose images are not ``(N, *image_shape)``, whose labels are not ``N`` values in
    ``0 … num_classes - 1`` of dataset ``name`` (out-of-range labels otherwise fail deep inside a metric), or whose
    images are all one constant value (a zeroed file of the right size trained to chance and was recorded as done).

    Raises:
        ValueError: naming ``files``, the shapes, how many labels are out of range, or the constant pixel value.
    """
    spec = IMAGE_SETS[name]
    where = ", ".join(str(f) for f in files)
    if tuple(images.shape[1:]) != spec.image_shape or len(images) != len(labels):
        raise ValueError(f"{where}: {tuple(images.shape)} images and {len(labels)} labels; expected (N, "
                         f"{', '.join(map(str, spec.image_shape))}) images with one label each")
    bad = (labels < 0) | (labels >= spec.num_classes)
    if bool(bad.any()):
        raise ValueError(f"{where}: {int(bad.sum())} of {len(labels)} labels outside 0..{spec.num_classes - 1} "
                         f"(range [{int(labels.min())}, {int(labels.max())}]); the file is corrupt or of "
                         f"another dataset")
    if len(images) > 1 and bool((images == images.reshape(-1)[0]).all()):
        raise ValueError(f"{where}: every pixel of all {len(images)} images is {int(images.reshape(-1)[0])}: the "
                         "images carry nothing to learn (a zeroed or blank file); replace it with the official file")


def _read_cifar_batch(path: Path, label_key: bytes, source: str) -> tuple[Tensor, Tensor]:
    # the python archive's pickled dicts read directly (b"data" (N, 3072) uint8 CHW rows and the labels):
    # torchvision's reader also demands the official files' MD5 sums, which rules out test files in the format
    import pickle

    refuse_gzip(path, "CIFAR batch")
    try:
        with path.open("rb") as f:
            batch = pickle.load(f, encoding="bytes")
        data, labels = np.asarray(batch[b"data"], dtype=np.uint8), batch[label_key]
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise unreadable([path], f"a CIFAR python-version batch (a pickled dict with b'data' and {label_key!r})",
                         e, source) from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: b'data' has shape {data.shape}, expected (N, 3072) rows of 3 x 32 x 32 pixels "
                         f"(CHW planes); the file is corrupt or not a CIFAR python-version batch (source {source})")
    return torch.from_numpy(data.reshape(-1, 3, 32, 32)), torch.as_tensor(labels, dtype=torch.int64)

def write_random_cifar100(root: str | Path, n_train: int = 300, n_test: int = 60, seed: int = 0) -> Path:
    """Random pixels in the official CIFAR-100 python layout, for throughput measurements and tests without the
    real archive: ``root/cifar-100-python/{train,test,meta}``, pickled dicts of byte keys, ``data`` (N, 3072)
    uint8 in CHW order, ``fine_labels`` 0-99 (cycling) and ``coarse_labels`` 0-19 as lists; ``meta`` with the
    label names. Returns the folder. Raises OSError when ``root`` cannot be written."""
    import pickle

    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        fine = [int(v) for v in np.arange(n) % 100]
        split = {b"filenames": [f"{i}.png".encode() for i in range(n)], b"batch_label": name.encode(),
                 b"fine_labels": fine, b"coarse_labels": [v // 5 for v in fine],
                 b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
        (folder / name).write_bytes(pickle.dumps(split))
    meta = {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]}
    (folder / "meta").write_bytes(pickle.dumps(meta))
    return folder
