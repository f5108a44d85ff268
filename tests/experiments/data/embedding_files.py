"""Tiny embedding caches and released-style pickles for tests, written without diffrank's own writer.

``write_embedding_cache`` writes the cache format of ``diffrank.experiments.data.embeddings`` (``index.json`` +
``<split>_{embeddings,labels}.npy``) with plain ``np.save`` / ``json``, so that reader tests check the format
itself. ``write_paper_pickle`` writes a dict with one of the key schemes of Petersen et al.'s released files
(difftopk README) with ``torch.save``. ``FOLDERS`` are the default cache folders of the data configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

FOLDERS = {
    "imagenet1k": "embeddings/imagenet1k_resnext101_32x48d_wsl_320",
    "imagenet21kp": "embeddings/imagenet21kp_resnext101_32x48d_wsl_224",
    "imagenet1k_effnet_l2": "embeddings/imagenet1k_tf_efficientnet_l2_ns_800",
}
PAPER_KEYS = {
    "resnext_1k": {"train": ("train_embeddings", "train_labels"), "test": ("test_embeddings", "test_labels")},
    "imagenet21kp": {"train": ("imagenet21k_train_embeddings", "imagenet21k_train_labels"),
                     "test": ("imagenet21k_val_embeddings", "imagenet21k_val_labels")},
    "effnet_l2": {"train": ("train_embeddings", "train_labels"), "test": ("val_embeddings", "val_labels")},
}


def make_split(n: int, dim: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(embeddings (n, dim) float16, labels (n,) int64)``: class means plus noise, so a linear head can learn."""
    rng = np.random.default_rng(seed)
    means = np.random.default_rng(12345).normal(size=(num_classes, dim))
    labels = rng.integers(0, num_classes, size=n)
    emb = means[labels] + 0.5 * rng.normal(size=(n, dim))
    return emb.astype(np.float16), labels.astype(np.int64)


def write_embedding_cache(root: str | Path, n_train: int = 600, n_test: int = 500, dim: int = 16,
                          num_classes: int = 10, seed: int = 0, rows_done: dict | None = None,
                          model: str = "tiny") -> Path:
    """A complete cache under ``root``; ``rows_done`` (split -> rows) fakes an interrupted writer."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    splits = {}
    for i, (name, n) in enumerate((("train", n_train), ("test", n_test))):
        emb, lab = make_split(n, dim, num_classes, seed + i)
        np.save(root / f"{name}_embeddings.npy", emb)
        np.save(root / f"{name}_labels.npy", lab)
        splits[name] = {"rows": n, "rows_done": (rows_done or {}).get(name, n)}
    index = {"model": model, "dim": dim, "img_size": 32, "dtype": "float16", "source": "tests", "weights": "random",
             "created": "2026-01-01T00:00:00+00:00", "splits": splits}
    (root / "index.json").write_text(json.dumps(index))
    return root


def write_paper_pickle(path: str | Path, scheme: str = "resnext_1k", n_train: int = 40, n_test: int = 20,
                       dim: int = 8, num_classes: int = 5, seed: int = 0, dtype: torch.dtype = torch.float32,
                       zip_format: bool = True) -> dict[str, torch.Tensor]:
    """``torch.save`` a dict in one of the released key schemes; returns the dict written."""
    data = {}
    for i, (split, n) in enumerate((("train", n_train), ("test", n_test))):
        emb, lab = make_split(n, dim, num_classes, seed + i)
        e_key, l_key = PAPER_KEYS[scheme][split]
        data[e_key] = torch.from_numpy(emb.astype(np.float32)).to(dtype)
        data[l_key] = torch.from_numpy(lab)
    torch.save(data, path, _use_new_zipfile_serialization=zip_format)
    return data
