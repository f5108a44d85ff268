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

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from diffrank.experiments.data.samplers import EpochSampler

INDEX = "index.json"
DTYPES = ("float16", "float32")
HINT = ("run python -m diffrank.experiments.tools.extract_embeddings or "
        "python -m diffrank.experiments.tools.convert_embeddings (docs/topk_imagenet.md)")

# Default folder names under paths.data_dir (configs/data/*_embeddings.yaml; data.folder=<name> picks another).
DEFAULT_FOLDERS = {
    "imagenet1k": "embeddings/imagenet1k_resnext101_32x48d_wsl_320",
    "imagenet21kp": "embeddings/imagenet21kp_resnext101_32x48d_wsl_224",
    "imagenet1k_effnet_l2": "embeddings/imagenet1k_tf_efficientnet_l2_ns_800",
}

# The key schemes of the paper's released pickles (difftopk README): our split name -> (embeddings, labels).
# The 21K-P and EffNet-L2 files call ImageNet's official validation set 'val': it is the test split.
PAPER_KEY_SCHEMES: dict[str, dict[str, tuple[str, str]]] = {
    "resnext_1k": {"train": ("train_embeddings", "train_labels"), "test": ("test_embeddings", "test_labels")},
    "imagenet21kp": {"train": ("imagenet21k_train_embeddings", "imagenet21k_train_labels"),
                     "test": ("imagenet21k_val_embeddings", "imagenet21k_val_labels")},
    "effnet_l2": {"train": ("train_embeddings", "train_labels"), "test": ("val_embeddings", "val_labels")},
}


def split_paths(root: str | Path, split: str) -> tuple[Path, Path]:
    """``(<root>/<split>_embeddings.npy, <root>/<split>_labels.npy)``."""
    root = Path(root)
    return root / f"{split}_embeddings.npy", root / f"{split}_labels.npy"


def paper_key_scheme(keys: Sequence[str]) -> tuple[str, dict[str, tuple[str, str]]]:
    """Recognise which of the paper's key schemes a loaded pickle uses (:data:`PAPER_KEY_SCHEMES`).

    Args:
        keys: the keys of the dict that ``torch.load`` returned.

    Returns:
        ``(scheme name, {our split: (embeddings key, labels key)})``; splits whose keys are absent are left out
        (a file with only a train split converts its train split).

    Raises:
        KeyError: no scheme's keys are present (names the keys found and the schemes known).
    """
    keys = set(keys)
    for name in ("imagenet21kp", "effnet_l2", "resnext_1k"):  # 'train_*' is shared: the val/test key decides
        scheme = PAPER_KEY_SCHEMES[name]
        found = {s: pair for s, pair in scheme.items() if set(pair) <= keys}
        if "test" in found or (name == "imagenet21kp" and found):
            return name, found
    if set(PAPER_KEY_SCHEMES["resnext_1k"]["train"]) <= keys:  # train split only
        return "resnext_1k", {"train": PAPER_KEY_SCHEMES["resnext_1k"]["train"]}
    known = "; ".join(f"{n}: {sorted(k for pair in s.values() for k in pair)}" for n, s in PAPER_KEY_SCHEMES.items())
    raise KeyError(f"no known key scheme among the keys {sorted(keys)} (known: {known})")


def write_index(root: str | Path, index: Mapping[str, Any]) -> None:
    """Write ``<root>/index.json`` atomically: a reader sees the old or the new index, never a partial one.

    Raises:
        OSError: the folder is not writable.
    """
    path = Path(root) / INDEX
    tmp = path.with_name(f".{INDEX}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_index(root: str | Path, splits: Sequence[str] = (), complete: bool = True) -> dict[str, Any]:
    """Read and check the index of a cache folder.

    Args:
        root: the cache folder.
        splits: splits that must be present (their ``.npy`` files too).
        complete: also require ``rows_done == rows`` for those splits.

    Returns:
        The parsed ``index.json``.

    Raises:
        FileNotFoundError: the folder, ``index.json`` or a split's files are missing (names them, and says to
            run the extraction or conversion script).
        ValueError: a required split is absent from the index or incomplete (``rows_done < rows``: an interrupted
            extraction; rerun the same command to resume it).
    """
    root = Path(root)
    path = root / INDEX
    if not path.is_file():
        missing = [path] + [p for s in splits for p in split_paths(root, s) if not p.is_file()]
        raise FileNotFoundError(f"embedding cache missing: {', '.join(str(p) for p in missing)}. Create it: {HINT}; "
                                f"or point paths.data_dir / data.folder at an existing cache")
    index = json.loads(path.read_text())
    missing = [p for s in splits for p in split_paths(root, s) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"embedding cache {root} lacks {', '.join(str(p) for p in missing)}: {HINT}")
    for s in splits:
        info = index.get("splits", {}).get(s)
        if info is None:
            raise ValueError(f"{path} has no split {s!r} (splits: {sorted(index.get('splits', {}))})")
        if complete and int(info["rows_done"]) != int(info["rows"]):
            raise ValueError(f"{root}: split {s!r} is incomplete ({info['rows_done']} of {info['rows']} rows written): "
                             "rerun the extraction command with the same arguments to resume it")
    return index


def open_split(root: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """One split of a cache: ``(embeddings (N, D) float16/float32 read-only memmap, labels (N,) int64 memmap)``.

    Raises:
        FileNotFoundError / ValueError: as :func:`read_index` (missing or incomplete split), or when the arrays'
            shapes disagree with the index.
    """
    index = read_index(root, [split])
    emb_path, lab_path = split_paths(root, split)
    emb, lab = np.load(emb_path, mmap_mode="r"), np.load(lab_path, mmap_mode="r")
    rows, dim = int(index["splits"][split]["rows"]), int(index["dim"])
    if emb.shape != (rows, dim) or lab.shape != (rows,):
        raise ValueError(f"{root}: split {split!r} has embeddings {emb.shape} and labels {lab.shape}, the index "
                         f"says ({rows}, {dim})")
    if emb.dtype.name not in DTYPES or lab.dtype != np.int64:
        raise ValueError(f"{root}: split {split!r} has dtypes {emb.dtype} / {lab.dtype}, need float16|float32 / int64")
    return emb, lab


class EmbeddingCacheWriter:
    """Writes a cache folder chunk by chunk, resumable after a kill.

    The ``.npy`` files are preallocated at their full size (``np.lib.format.open_memmap``, sparse where the file
    system allows), rows are written at their final positions, and ``rows_done`` advances in ``index.json`` only
    after the rows are flushed. A restarted writer with the same metadata opens the files in place and the
    caller continues at :meth:`rows_done`: rows are neither duplicated nor skipped, provided the caller produces
    rows in a deterministic order.

    Args:
        root: the cache folder (created).
        meta: ``model``, ``dim``, ``img_size``, ``dtype`` (``"float16"`` | ``"float32"``), ``source``, ``weights``, …:
            stored in the index; on resume they must equal the stored ones.
        rows: rows per split, e.g. ``{"train": 1_281_167, "test": 50_000}``.
        overwrite: start afresh even when the folder holds another (or the same) cache.

    Raises:
        ValueError: bad dtype / dim / rows, or the folder holds a different cache (names the differing field)
            and ``overwrite`` is false.
    """

    def __init__(self, root: str | Path, meta: Mapping[str, Any], rows: Mapping[str, int],
                 overwrite: bool = False) -> None:
        self.root = Path(root)
        self.meta = dict(meta)
        if self.meta.get("dtype") not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.meta.get('dtype')!r}")
        if int(self.meta.get("dim", 0)) < 1 or any(int(n) < 1 for n in rows.values()) or not rows:
            raise ValueError(f"need dim >= 1 and >= 1 row per split, got dim={self.meta.get('dim')}, rows={dict(rows)}")
        self.rows = {s: int(n) for s, n in rows.items()}
        self.root.mkdir(parents=True, exist_ok=True)
        old = None if overwrite or not (self.root / INDEX).is_file() else json.loads((self.root / INDEX).read_text())
        if old is not None:
            for key, value in self.meta.items():
                if old.get(key) != value:
                    raise ValueError(f"{self.root} holds another cache ({key}: {old.get(key)!r}, now {value!r}): "
                                     "choose another output folder or pass --overwrite")
            for s, n in self.rows.items():
                held = old["splits"].get(s)
                if held is not None and int(held["rows"]) != n:
                    raise ValueError(f"{self.root}: split {s!r} holds {held['rows']} rows, now {n}: pass --overwrite")
            self.index = old
        else:
            self.index = {**self.meta, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          "splits": {}}
        self.arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for s, n in self.rows.items():
            emb_path, lab_path = split_paths(self.root, s)
            fresh = s not in self.index["splits"] or not (emb_path.is_file() and lab_path.is_file())
            if fresh:
                self.index["splits"][s] = {"rows": n, "rows_done": 0}
            if fresh or self.index["splits"][s]["rows_done"] < n:
                mode = "w+" if fresh else "r+"
                shape = (n, int(self.meta["dim"]))
                self.arrays[s] = (np.lib.format.open_memmap(emb_path, mode=mode, dtype=self.meta["dtype"], shape=shape),
                                  np.lib.format.open_memmap(lab_path, mode=mode, dtype=np.int64, shape=(n,)))
        write_index(self.root, self.index)

    def rows_done(self, split: str) -> int:
        """Rows of ``split`` written and flushed (where a restarted writer continues)."""
        return int(self.index["splits"][split]["rows_done"])

    def write(self, split: str, embeddings: np.ndarray | Tensor, labels: np.ndarray | Tensor) -> int:
        """Append a chunk at ``rows_done``, flush it, then advance ``rows_done`` in the index atomically.

        Args:
            split: a split given at construction.
            embeddings: ``(b, dim)`` floats (cast to the cache's dtype). labels: ``(b,)`` integers.

        Returns:
            The new ``rows_done``.

        Raises:
            ValueError: wrong shapes, more rows than the split holds, or non-finite embeddings (after the cast:
                float16 overflows above 65 504).
        """
        if isinstance(embeddings, Tensor):
            embeddings = embeddings.detach().cpu()
            if embeddings.dtype not in (torch.float16, torch.float32):  # bfloat16 has no numpy dtype
                embeddings = embeddings.float()
            embeddings = embeddings.numpy()
        if isinstance(labels, Tensor):
            labels = labels.detach().cpu().numpy()
        emb, lab = self.arrays[split]
        start = self.rows_done(split)
        b = len(labels)
        if embeddings.shape != (b, emb.shape[1]) or labels.ndim != 1:
            raise ValueError(f"chunk of embeddings {embeddings.shape} and labels {labels.shape}: "
                             f"need (b, {emb.shape[1]}) and (b,)")
        if start + b > len(lab):
            raise ValueError(f"split {split!r}: {start} + {b} rows exceed its {len(lab)} rows")
        with np.errstate(over="ignore"):  # an overflow becomes inf and is reported just below
            chunk = np.asarray(embeddings).astype(emb.dtype, copy=False)
        if not np.isfinite(chunk).all():
            raise ValueError(f"split {split!r}, rows {start}..{start + b}: non-finite embeddings (after the cast to "
                             f"{emb.dtype}); store float32 (--dtype float32) if the values exceed float16's range")
        emb[start:start + b] = chunk
        lab[start:start + b] = labels.astype(np.int64, copy=False)
        emb.flush()
        lab.flush()
        self.index["splits"][split]["rows_done"] = start + b
        write_index(self.root, self.index)
        return start + b


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
