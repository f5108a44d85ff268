"""The on-disk format of cached backbone embeddings (ImageNet-1K, ImageNet-21K-P): ``index.json`` and the
``<split>_{embeddings,labels}.npy`` files, read memory-mapped and written chunk by chunk, resumable.

:mod:`diffrank.experiments.tools.extract_embeddings` and :mod:`diffrank.experiments.tools.convert_embeddings` write
it through :class:`EmbeddingCacheWriter`; :class:`~diffrank.experiments.data.embeddings.EmbeddingDataModule` reads
it. The format itself is described in :mod:`diffrank.experiments.data.embeddings` and docs/topk_imagenet.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

INDEX = "index.json"
DTYPES = ("float16", "float32")
HINT = ("run python -m diffrank.experiments.tools.extract_embeddings or "
        "python -m diffrank.experiments.tools.convert_embeddings (docs/topk_imagenet.md)")

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
