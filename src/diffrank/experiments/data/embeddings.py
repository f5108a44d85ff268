"""Cached backbone embeddings (ImageNet-1K, ImageNet-21K-P) on disk, memory-mapped, for linear top-k heads.

Petersen et al. (ICML 2022, §5.1) fine-tune only a linear head on the frozen penultimate embeddings of a
large pre-trained backbone (ResNeXt-101 32x48d WSL: 2 048-d; Noisy-Student EfficientNet-L2: 5 504-d), which
their code reads from pre-computed files (difftopk README, "(code)"). This module holds the one on-disk
format that :mod:`diffrank.experiments.tools.extract_embeddings` (a timm backbone over an image folder or a Hugging
Face dataset) and :mod:`diffrank.experiments.tools.convert_embeddings` (the paper's released pickles) write, and the
LightningDataModule that trains on it. See docs/topk_imagenet.md.

Format of a cache folder (``paths.data_dir/<folder>``)::

    index.json                  {"model", "dim", "img_size", "dtype", "source", "created", "weights",
                                 "splits": {"train": {"rows", "rows_done"}, "test": {...}}}
    train_embeddings.npy        (N_train, dim) float16 (or float32), a plain .npy (np.lib.format.open_memmap)
    train_labels.npy            (N_train,) int64
    test_embeddings.npy, test_labels.npy

``rows_done`` counts the rows written and flushed so far; a split is usable once ``rows_done == rows``.
``index.json`` is replaced atomically (temporary file + ``os.replace``) after every flushed chunk, so a killed
writer leaves a consistent index and restarts at ``rows_done``. Nothing here reads a whole embedding file
into memory (ImageNet-21K-P's train split is ≈ 45 GB in float16): rows are read through ``np.load(mmap_mode=
"r")``; only the labels (8 bytes a row) are held in memory.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from diffrank.experiments.data.embedding_cache import open_split, read_index, split_paths
from diffrank.experiments.data.samplers import EpochSampler

# Default folder names under paths.data_dir (configs/data/*_embeddings.yaml; data.folder=<name> picks another).
DEFAULT_FOLDERS = {
    "imagenet1k": "embeddings/imagenet1k_resnext101_32x48d_wsl_320",
    "imagenet21kp": "embeddings/imagenet21kp_resnext101_32x48d_wsl_224",
    "imagenet1k_effnet_l2": "embeddings/imagenet1k_tf_efficientnet_l2_ns_800",
}


def _pass_through(batch):
    return batch


class EmbeddingRows(Dataset):
    """Rows of one memory-mapped embedding file, fetched a batch at a time.

    The memmap is opened lazily in each process (a DataLoader worker re-opens it rather than pickling the
    array). ``__getitems__`` reads a whole batch with one fancy index: callers pass sorted row positions so that
    the reads walk the file forward (:class:`SortedBatchSampler`).

    Args:
        path: the ``<split>_embeddings.npy`` file.
        rows: ``(M,)`` int64 file rows this dataset exposes (sorted; a validation subset, or all rows).
        labels: ``(M,)`` int64 labels of those rows.

    Items: ``(embedding (D,) float32, label () int64)``; batches via ``__getitems__``:
    ``(embeddings (B, D) float32, labels (B,) int64)``, cast from the file's float16 on the fly.
    """

    def __init__(self, path: str | Path, rows: np.ndarray, labels: np.ndarray) -> None:
        self.path, self.rows, self.labels = str(path), np.asarray(rows, dtype=np.int64), torch.as_tensor(labels)
        self._emb: np.ndarray | None = None

    def __getstate__(self):
        return {**self.__dict__, "_emb": None}

    def _array(self) -> np.ndarray:
        if self._emb is None:
            self._emb = np.load(self.path, mmap_mode="r")
        return self._emb

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return torch.from_numpy(self._array()[self.rows[i]].astype(np.float32)), self.labels[i]

    def __getitems__(self, positions: Sequence[int]) -> tuple[Tensor, Tensor]:
        pos = np.asarray(positions, dtype=np.int64)
        x = torch.from_numpy(self._array()[self.rows[pos]].astype(np.float32))
        # checked per batch as it is read (a whole-file scan of a 45 GB cache would cost a pass over it)
        finite = torch.isfinite(x).all(dim=1)
        if not bool(finite.all()):
            rows = self.rows[pos[~finite.numpy()]]
            raise ValueError(f"{self.path}: rows {rows[:5].tolist()}{'…' if len(rows) > 5 else ''} hold NaN or "
                             f"infinite embeddings ({len(rows)} in this batch); the cache is corrupt: rebuild it with "
                             "python -m diffrank.experiments.tools.extract_embeddings (or convert_embeddings) "
                             "--overwrite")
        return x, self.labels[torch.from_numpy(pos)]


class SortedBatchSampler(EpochSampler):
    """A seeded permutation per epoch, cut into whole batches, each batch's positions sorted.

    Sorting within a batch changes no loss (a batch is a set) but turns a batch of random memmap reads into one
    forward pass over the file. The order is a pure function of ``(seed, epoch)``; ``set_start`` (exact resume)
    skips items of the next pass, as :class:`~diffrank.experiments.data.samplers.EpochSampler`.

    Raises:
        ValueError: ``batch_size`` outside ``[1, n]``.
    """

    def __init__(self, n: int, seed: int, batch_size: int) -> None:
        super().__init__(n, seed)
        if not 1 <= batch_size <= n:
            raise ValueError(f"need 1 <= batch_size <= n = {n}, got {batch_size}")
        self.batch_size = int(batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch ``epoch``: ``n // batch_size`` batches of sorted positions, concatenated."""
        whole = self.n - self.n % self.batch_size
        perm = np.random.default_rng([self.seed, 5, int(epoch)]).permutation(self.n)[:whole]
        return np.sort(perm.reshape(-1, self.batch_size), axis=1).reshape(-1)

    def __len__(self) -> int:
        return self.n - self.n % self.batch_size


class EmbeddingDataModule(L.LightningDataModule):
    """Train / validation / test batches of cached embeddings (Petersen et al. 2022, §5.1; difftopk "(code)").

    Validation is ``val_size`` training rows drawn by a permutation seeded with ``split_seed`` (the reference code
    holds out 50 000 random train embeddings for ImageNet-1K, 100 000 for ImageNet-21K-P); the test split is the
    official validation set. Training batches come from :class:`SortedBatchSampler` (order from ``(seed, epoch)``,
    whole batches only); evaluation batches walk their rows in file order.

    Args:
        data_dir: ``paths.data_dir``. folder: the cache folder under it (:data:`DEFAULT_FOLDERS`).
        num_classes: label count (1 000; 10 450 for ImageNet-21K-P): labels outside ``[0, num_classes)`` raise.
        dim: embedding width stated in the yaml for the model's ``nn.Linear`` (2 048; 5 504 for EffNet-L2); must
            equal ``dim`` in ``index.json``.
        val_size: training rows held out for validation.
        batch_size: training rows per step (the global batch; 500 in the paper).
        eval_batch_size: validation / test rows per batch.
        seed: the run's seed (training order). split_seed: the validation split (fixed by default).
        num_workers: DataLoader workers (0 is enough: a batch is one memmap read).

    Batches: ``(embeddings (B, dim) float32, labels (B,) int64)``.

    Raises:
        FileNotFoundError: (``setup``) the cache or one of its files is missing; the message names them and says
            "run python -m diffrank.experiments.tools.extract_embeddings or ... convert_embeddings".
        ValueError: (``setup``) an incomplete split, ``dim`` unlike the index, labels out of range, ``val_size``
            outside ``[1, N_train)``, or fewer training rows than one batch.
    """

    def __init__(self, data_dir: str, folder: str, num_classes: int, dim: int, val_size: int = 50000,
                 batch_size: int = 500, eval_batch_size: int = 500, seed: int = 0, split_seed: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__()
        self.root = Path(data_dir) / folder
        self.num_classes, self.dim, self.val_size = int(num_classes), int(dim), int(val_size)
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.seed, self.split_seed, self.num_workers = int(seed), int(split_seed), int(num_workers)
        self.splits: dict[str, EmbeddingRows] = {}
        self.index: dict[str, Any] = {}

    def _labels(self, split: str) -> np.ndarray:
        labels = np.load(split_paths(self.root, split)[1])  # 8 bytes a row: held in memory
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"{self.root}: {split} labels span [{labels.min()}, {labels.max()}], outside "
                             f"[0, {self.num_classes}) (data.num_classes)")
        return labels

    def setup(self, stage: str | None = None) -> None:
        """Check the cache, read the labels, draw the validation rows (a pure function of ``split_seed``)."""
        if self.splits:
            return
        self.index = read_index(self.root, ["train", "test"])
        for s in ("train", "test"):
            open_split(self.root, s)  # shape / dtype checks against the index
        if int(self.index["dim"]) != self.dim:
            raise ValueError(f"{self.root} holds {self.index['dim']}-d embeddings ({self.index.get('model')}), the "
                             f"config says data.dim={self.dim}: pick the matching data config or set data.dim")
        labels = self._labels("train")
        n = len(labels)
        if not 0 < self.val_size < n:
            raise ValueError(f"val_size must be in [1, {n}) (the training rows), got {self.val_size}")
        if n - self.val_size < self.batch_size:
            raise ValueError(f"{n - self.val_size} training rows after the validation split: fewer than one batch "
                             f"of {self.batch_size}")
        perm = np.random.default_rng([self.split_seed, 4]).permutation(n)
        val, train = np.sort(perm[:self.val_size]), np.sort(perm[self.val_size:])
        emb_train = split_paths(self.root, "train")[0]
        test_labels = self._labels("test")
        if len(test_labels) % self.eval_batch_size:
            warnings.warn(f"{len(test_labels)} test rows are not a multiple of eval_batch_size={self.eval_batch_size}"
                          " (the reference script asserts it); the last batch is smaller, the accuracy is still over "
                          "every row", stacklevel=2)
        self.splits = {"train": EmbeddingRows(emb_train, train, labels[train]),
                       "val": EmbeddingRows(emb_train, val, labels[val]),
                       "test": EmbeddingRows(split_paths(self.root, "test")[0], np.arange(len(test_labels)),
                                             test_labels)}

    def _loader(self, name: str, **kw) -> DataLoader:
        return DataLoader(self.splits[name], collate_fn=_pass_through, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, **kw)

    def train_dataloader(self) -> DataLoader:
        """Training batches of ``batch_size`` (:class:`SortedBatchSampler`, order from ``(seed, epoch)``)."""
        sampler = SortedBatchSampler(len(self.splits["train"]), self.seed, self.batch_size)
        return self._loader("train", batch_size=self.batch_size, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        """Validation batches (file order)."""
        return self._loader("val", batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        """Test batches (file order)."""
        return self._loader("test", batch_size=self.eval_batch_size)
