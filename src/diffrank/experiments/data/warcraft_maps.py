"""The files of the Warcraft shortest-path maps (docs/warcraft.md, "Data"): folder layout, names and checks
(MD5 of the real 12 x 12 files, the ``SYNTHETIC.json`` marker), memory-mapped split reading and the training
maps' per-channel statistics. :class:`~diffrank.experiments.data.warcraft.WarcraftDataModule` serves them;
the layout is described in :mod:`diffrank.experiments.data.warcraft`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

REAL_ROOT = "warcraft_shortest_path_oneskin"
SYNTHETIC_ROOT = "warcraft_like_synthetic"
MARKER = "SYNTHETIC.json"
SPLITS = ("train", "val", "test")
TILE = 8  # pixels per tile side
ARCHIVE = "warcraft_maps.tar"

# MD5 of the real 12 x 12 files (as used by third-party loaders of the Vlastelica et al. distribution)
MD5_12X12 = {
    "train_maps.npy": "c31760c5fbd9d034b6e21a6612895e69",
    "train_vertex_weights.npy": "761cc8098730504335efdefec3b221a6",
    "train_shortest_paths.npy": "1483015985796f3bf9f3e5e00cb8e855",
    "val_maps.npy": "cfe9288a537d46be48c0c287885f8405",
    "val_vertex_weights.npy": "452753f9d8b31ac03bbd532953974072",
    "val_shortest_paths.npy": "95e81a2a3263d6520fa5f07a8701c74a",
    "test_maps.npy": "a5c50ae11e4bd01cb1a2cd76e5849b22",
    "test_vertex_weights.npy": "071dbcf2aa9d98fc255abdcb780151b1",
    "test_shortest_paths.npy": "deae60b10d932e2a37271df4b44e295d",
}


def split_files(split: str) -> tuple[str, str, str]:
    """File names ``(maps, vertex weights, shortest paths)`` of one split, e.g. ``train_maps.npy``."""
    return f"{split}_maps.npy", f"{split}_vertex_weights.npy", f"{split}_shortest_paths.npy"


def warcraft_folder(data_dir: str | Path, grid: int = 12, root_name: str = REAL_ROOT) -> Path:
    """``<data_dir>/<root_name>/<grid>x<grid>``: where the files of one map size live."""
    return Path(data_dir) / root_name / f"{int(grid)}x{int(grid)}"


def check_warcraft_files(data_dir: str | Path, grid: int = 12, root_name: str = REAL_ROOT) -> Path:
    """The folder of the ``grid`` x ``grid`` maps, after checking that its nine files exist.

    Raises:
        FileNotFoundError: naming every missing file, the archive they come from, where to put it, and the
            generator of Warcraft-like maps (``python -m diffrank.experiments.data.warcraft_like``) for offline work.
    """
    folder = warcraft_folder(data_dir, grid, root_name)
    missing = [folder / f for s in SPLITS for f in split_files(s) if not (folder / f).is_file()]
    if not missing:
        return folder
    hint = ""
    other = warcraft_folder(data_dir, grid, SYNTHETIC_ROOT if root_name != SYNTHETIC_ROOT else REAL_ROOT)
    if (other / "train_maps.npy").is_file():
        hint = f" (a set exists at {other}: select it with data.root_name={other.parent.name})"
    raise FileNotFoundError(
        f"Warcraft shortest-path files not found: {', '.join(str(m) for m in missing)}. Get the archive "
        f"{ARCHIVE} of the blackbox-differentiation repository (Vlastelica et al. 2020, "
        "github.com/martius-lab/blackbox-differentiation-combinatorial-solvers), extract its folder "
        f"{REAL_ROOT}/ into paths.data_dir (env DIFFRANK_DATA) so that {folder}/ holds the files; or write "
        "Warcraft-like synthetic maps with `python -m diffrank.experiments.data.warcraft_like --out <data_dir>` and "
        f"run with data.root_name={SYNTHETIC_ROOT}{hint}."
    )


def md5_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex MD5 of a file, read in chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_marker(folder: str | Path) -> dict | None:
    """The content of ``SYNTHETIC.json`` in ``folder`` (a generated set), or None for a real set."""
    path = Path(folder) / MARKER
    return json.loads(path.read_text()) if path.is_file() else None


def load_split(folder: str | Path, split: str, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory-mapped arrays ``(maps (N, 8k, 8k, 3), weights (N, k, k), paths (N, k, k))`` of one split.

    Raises:
        ValueError: a file that is not a whole ``.npy`` array (truncated), shapes other than the ones above for
            ``k = grid``, files of different lengths, or vertex weights that are not finite and non-negative (a
            NaN cost makes every cost ratio NaN); the message names the file.
    """
    names = split_files(split)
    arrays = []
    for n in names:
        try:
            arrays.append(np.load(Path(folder) / n, mmap_mode="r"))
        except (ValueError, OSError, EOFError) as e:  # numpy: "mmap length is greater than file size"
            raise ValueError(f"{Path(folder) / n}: cannot be read as a .npy array ({e}); the file is truncated or "
                             "corrupt: copy it again (or regenerate the set: docs/warcraft.md)") from None
    maps, weights, paths = arrays
    k, px = int(grid), TILE * int(grid)
    want = {names[0]: (px, px, 3), names[1]: (k, k), names[2]: (k, k)}
    for name, arr in zip(names, (maps, weights, paths)):
        if arr.ndim != len(want[name]) + 1 or tuple(arr.shape[1:]) != want[name]:
            raise ValueError(f"{Path(folder) / name}: shape {tuple(arr.shape)}, expected (N, "
                             f"{', '.join(map(str, want[name]))}) for data.grid = {k} ({TILE} pixels per tile); "
                             "is data.grid the size of this folder's maps?")
    if not len(maps) == len(weights) == len(paths):
        raise ValueError(f"{folder}: {split} files hold {len(maps)} maps, {len(weights)} weight grids and "
                         f"{len(paths)} paths; they must match")
    bad = ~(np.isfinite(weights) & (weights >= 0)).reshape(len(weights), -1).all(axis=1)  # 144 floats a map
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{Path(folder) / names[1]}: {int(bad.sum())} of {len(weights)} weight grids hold a "
                         f"NaN, infinite or negative vertex cost (first: map {first}, "
                         f"{np.asarray(weights[first]).ravel()[:6].tolist()}…); shortest paths need finite "
                         "non-negative costs")
    return maps, weights, paths


def channel_stats(maps: np.ndarray, chunk: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and population standard deviation of ``maps (N, H, W, 3)`` over all pixels (float64).

    Raises:
        ValueError: empty maps or a constant channel (std 0 would divide by zero).
    """
    if len(maps) == 0:
        raise ValueError("cannot normalise: the training split has no maps")
    ch = maps.shape[-1]
    total, total_sq = np.zeros(ch), np.zeros(ch)
    for i in range(0, len(maps), chunk):
        x = np.asarray(maps[i : i + chunk])
        if x.dtype == np.uint8:  # exact and fast: a histogram of the 256 levels per channel
            hist = np.bincount((x.reshape(-1, ch) + np.arange(ch, dtype=np.int64) * 256).ravel(),
                               minlength=256 * ch).reshape(ch, 256).astype(np.float64)
            levels = np.arange(256, dtype=np.float64)
            total += hist @ levels
            total_sq += hist @ levels**2
        else:
            x = x.astype(np.float64).reshape(-1, ch)
            total += x.sum(0)
            total_sq += (x * x).sum(0)
    count = len(maps) * maps.shape[1] * maps.shape[2]
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean**2, 0.0))
    if (std == 0).any():
        raise ValueError(f"cannot normalise: a colour channel of the training maps is constant (std {std})")
    return mean, std
