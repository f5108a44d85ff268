"""Warcraft shortest-path maps (Vlastelica et al., ICLR 2020, §5.1; Petersen's thesis §2.4) and a generator of
Warcraft-like maps in the same format (docs/warcraft.md, "Data").

Files (the standard distribution, archive ``warcraft_maps.tar`` of the blackbox-differentiation repository):
``<data_dir>/<root_name>/<k>x<k>/`` with, per split s in {train, val, test},

- ``s_maps.npy``: ``(N, 8k, 8k, 3)`` uint8 RGB terrain images, channels last, 8 x 8 pixels per tile;
- ``s_vertex_weights.npy``: ``(N, k, k)`` float true vertex costs (one cost per terrain type);
- ``s_shortest_paths.npy``: ``(N, k, k)`` 0/1 indicator of the minimum-cost path from the top-left to the
  bottom-right cell, 8-neighbourhood, both end cells included.

``root_name`` is ``warcraft_shortest_path_oneskin`` for the real maps (k in {12, 18, 24, 30}; 10 000 / 1 000
/ 1 000 maps) and ``warcraft_like_synthetic`` for the generated ones (:func:`write_warcraft_like`,
``scripts/make_warcraft_like.py``), which also carry a ``SYNTHETIC.json`` marker: a folder with the marker is
reported as synthetic (:attr:`WarcraftDataModule.synthetic`) whatever its name.

Preprocessing as the reference code: float32, channels first, per-channel mean / standard deviation of the
training maps (population std over all pixels of the whole training file) applied to every split; no
augmentation.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from diffrank.experiments.data.mnist_sort import parse_device_resident

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
            generator of Warcraft-like maps (``scripts/make_warcraft_like.py``) for offline work.
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
        f"Warcraft-like synthetic maps with `python scripts/make_warcraft_like.py --out <data_dir>` and run with "
        f"data.root_name={SYNTHETIC_ROOT}{hint}."
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
        ValueError: shapes other than the ones above for ``k = grid``, or files of different lengths.
    """
    names = split_files(split)
    maps, weights, paths = (np.load(Path(folder) / n, mmap_mode="r") for n in names)
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


class MapBatch(NamedTuple):
    """What a device-resident loader yields per step: the split and the map indices, composed on the device."""

    split: str
    index: Tensor


class WarcraftSplit(Dataset):
    """The maps of one split, read batch-wise from memory-mapped files.

    Item ``idx`` (a 1-D int64 array or tensor of map indices) is the batch ``(maps (B, 3, 8k, 8k) float32
    normalised, weights (B, k, k) float32, paths (B, k, k) float32 0/1)``; ``MapBatch`` items are used by the
    device-resident loaders instead.

    Args:
        maps, weights, paths: arrays as :func:`load_split` returns them (first ``len`` maps used).
        mean, std: ``(3,)`` per-channel statistics in pixel units (0..255).
        length: how many maps (the first ones) this split exposes.
    """

    def __init__(self, maps: np.ndarray, weights: np.ndarray, paths: np.ndarray, mean: np.ndarray,
                 std: np.ndarray, length: int) -> None:
        self.maps, self.weights, self.paths, self.length = maps, weights, paths, int(length)
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx) -> tuple[Tensor, Tensor, Tensor]:
        idx = np.sort(np.asarray(idx, dtype=np.int64).reshape(-1))  # sorted: sequential reads from the mmap
        return compose(torch.from_numpy(np.ascontiguousarray(self.maps[idx])),
                       torch.from_numpy(np.asarray(self.weights[idx], dtype=np.float32)),
                       torch.from_numpy(np.asarray(self.paths[idx], dtype=np.float32)), self.mean, self.std)

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        """All exposed maps as host tensors ``(maps uint8 (N, 8k, 8k, 3), weights float32, paths float32)``."""
        n = self.length
        # copies: the memory maps are read-only
        return (torch.from_numpy(np.array(self.maps[:n])), torch.from_numpy(np.array(self.weights[:n], np.float32)),
                torch.from_numpy(np.array(self.paths[:n], np.float32)))


def compose(maps: Tensor, weights: Tensor, paths: Tensor, mean: Tensor, std: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The batch format of ``data=warcraft`` from raw maps.

    Args:
        maps: ``(B, 8k, 8k, 3)`` uint8 (or float in pixel units), channels last.
        weights, paths: ``(B, k, k)``.
        mean, std: ``(1, 3, 1, 1)`` float32 per-channel statistics in pixel units, on the device of ``maps``.

    Returns:
        ``(maps (B, 3, 8k, 8k) float32 (x - mean) / std, weights (B, k, k) float32, paths (B, k, k) float32)``.
    """
    x = maps.permute(0, 3, 1, 2).float()
    return (x - mean) / std, weights.float(), paths.float()


class ShuffledBatches(Sampler):
    """Index batches of a shuffled split: the permutation is a pure function of ``(seed, epoch)``.

    Lightning calls :meth:`set_epoch` before every epoch, so a resumed run sees the same order; the last
    batch may be smaller (as the reference's loader, no ``drop_last``).
    """

    def __init__(self, length: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        self.length, self.batch_size, self.seed, self.shuffle = int(length), int(batch_size), int(seed), shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the next pass's order from ``(seed, epoch)``."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[np.ndarray]:
        order = (np.random.default_rng([self.seed, 3, self.epoch]).permutation(self.length) if self.shuffle
                 else np.arange(self.length))
        for i in range(0, self.length, self.batch_size):
            yield order[i : i + self.batch_size]

    def __len__(self) -> int:
        return math.ceil(self.length / self.batch_size)


class _ResidentKeys(Dataset):
    def __init__(self, split: str, length: int) -> None:
        self.split, self.length = split, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx) -> MapBatch:
        return MapBatch(self.split, torch.as_tensor(np.asarray(idx, dtype=np.int64)))


class WarcraftDataModule(L.LightningDataModule):
    """Warcraft terrain maps with their true vertex costs and shortest-path labels.

    Args:
        data_dir: root holding ``<root_name>/<grid>x<grid>/`` (``paths.data_dir``).
        grid: k, tiles per side (12; 18 / 24 / 30 where present). Checked against the files on load.
        root_name: ``warcraft_shortest_path_oneskin`` (the real distribution) or ``warcraft_like_synthetic``
            (generated by ``scripts/make_warcraft_like.py``).
        batch_size: maps per training step (70 in Vlastelica et al. 2020 and the thesis §2.4).
        eval_batch_size: maps per evaluation step (default ``batch_size``).
        num_workers: DataLoader workers.
        seed: the training order (a permutation per epoch, from ``(seed, epoch)``).
        limit_train / limit_eval: use only the first so many maps of train / of val and test (quick runs);
            None = all. Normalisation statistics always come from the whole training file.
        device_resident: ``"auto"`` (on CUDA), ``True`` or ``False`` (default): keep the uint8 maps on the
            trainer's device and compose batches there (loaders then yield :class:`MapBatch`).
        verify_md5: check the real 12 x 12 files against their published MD5 sums at setup (reads ~400 MB).

    Attributes (after construction): ``grid``, ``num_cells`` (k²), ``image_shape`` ``(3, 8k, 8k)``, ``folder``,
    ``synthetic`` (True when the folder holds the generator's ``SYNTHETIC.json``; ``synthetic_info`` is its
    content, else None). After :meth:`setup`: ``mean``, ``std`` (``(3,)`` float64, pixel units) and
    ``datasets``.

    Batches: ``(maps (B, 3, 8k, 8k) float32 normalised, weights (B, k, k) float32 true vertex costs,
    paths (B, k, k) float32 0/1)``.

    Raises:
        FileNotFoundError: at construction, naming each missing file (:func:`check_warcraft_files`).
        ValueError: bad sizes; at setup, files whose shapes do not fit ``grid``; MD5 mismatch with
            ``verify_md5``.
    """

    def __init__(self, data_dir: str | Path = "data", grid: int = 12, root_name: str = REAL_ROOT,
                 batch_size: int = 70, eval_batch_size: int | None = None, num_workers: int = 0, seed: int = 0,
                 limit_train: int | None = None, limit_eval: int | None = None,
                 device_resident: bool | str = False, verify_md5: bool = False) -> None:
        super().__init__()
        if int(grid) < 1 or int(batch_size) < 1 or (eval_batch_size is not None and int(eval_batch_size) < 1):
            raise ValueError(f"grid, batch_size and eval_batch_size must be positive, got {grid}, {batch_size}, "
                             f"{eval_batch_size}")
        for name, limit in (("limit_train", limit_train), ("limit_eval", limit_eval)):
            if limit is not None and int(limit) < 1:
                raise ValueError(f"{name} must be positive or null, got {limit}")
        self.data_dir, self.grid, self.root_name = Path(data_dir), int(grid), str(root_name)
        self.num_cells = self.grid**2
        self.image_shape = (3, TILE * self.grid, TILE * self.grid)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.num_workers, self.seed = int(num_workers), int(seed)
        self.limit_train = None if limit_train is None else int(limit_train)
        self.limit_eval = None if limit_eval is None else int(limit_eval)
        self.device_resident = parse_device_resident(device_resident)
        self.verify_md5 = bool(verify_md5)
        self.folder = check_warcraft_files(self.data_dir, self.grid, self.root_name)
        self.synthetic_info = read_marker(self.folder)
        self.synthetic = self.synthetic_info is not None
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None
        self.datasets: dict[str, WarcraftSplit] = {}
        self._resident: dict[tuple[torch.device, str], tuple[Tensor, Tensor, Tensor, Tensor, Tensor]] = {}

    def setup(self, stage: str | None = None) -> None:
        """Memory-map the files, check their shapes, compute the training maps' channel statistics (once)."""
        if self.datasets:
            return
        if self.verify_md5:
            self._check_md5()
        arrays = {s: load_split(self.folder, s, self.grid) for s in SPLITS}
        self.mean, self.std = channel_stats(arrays["train"][0])
        for s, (maps, weights, paths) in arrays.items():
            limit = self.limit_train if s == "train" else self.limit_eval
            length = len(maps) if limit is None else min(limit, len(maps))
            if length == 0:
                raise ValueError(f"{self.folder}: the {s} split has no maps")
            self.datasets[s] = WarcraftSplit(maps, weights, paths, self.mean, self.std, length)

    def _check_md5(self) -> None:
        if self.synthetic or self.grid != 12:
            return  # published sums exist for the real 12 x 12 files only
        bad = [f"{name} ({md5_file(self.folder / name)} != {want})" for name, want in MD5_12X12.items()
               if md5_file(self.folder / name) != want]
        if bad:
            raise ValueError(f"MD5 mismatch in {self.folder}: {', '.join(bad)}")

    def resident(self) -> bool:
        """Whether batches are composed on the trainer's device (``device_resident``; ``"auto"`` = on CUDA)."""
        if self.device_resident != "auto":
            return self.device_resident
        trainer = getattr(self, "trainer", None)
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def _loader(self, split: str, batch_size: int, shuffle: bool) -> DataLoader:
        ds = self.datasets[split]
        sampler = ShuffledBatches(len(ds), batch_size, self.seed, shuffle)
        source = _ResidentKeys(split, len(ds)) if self.resident() else ds
        return DataLoader(source, batch_size=None, sampler=sampler, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0 and shuffle)

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (a new order per epoch, from ``(seed, epoch)``)."""
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Validation maps in file order."""
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """Test maps in file order."""
        return self._loader("test", self.eval_batch_size, shuffle=False)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """Lightning's hook: a :class:`MapBatch` becomes its batch gathered and normalised on ``device``."""
        if isinstance(batch, MapBatch):
            maps, weights, paths, mean, std = self._on_device(batch.split, device)
            idx = batch.index.to(device)
            return compose(maps[idx], weights[idx], paths[idx], mean, std)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def _on_device(self, split: str, device: torch.device):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = (device, split)
        if key not in self._resident:
            ds = self.datasets[split]
            self._resident[key] = (*(t.to(device) for t in ds.tensors()), ds.mean.to(device), ds.std.to(device))
        return self._resident[key]


# --------------------------------------------------------------------------------------------------------------
# Warcraft-like generated maps (docs/warcraft.md, "Data")
# --------------------------------------------------------------------------------------------------------------

GENERATOR_VERSION = 1

TERRAIN = (
    # name, vertex cost, base RGB, texture: (stripe orientation (dr, dc), frequency, amplitude, speckle)
    ("grass", 0.8, (84, 142, 58), ((0, 1), 0.0, 0.0, 18.0)),
    ("dirt", 1.2, (150, 116, 72), ((1, 0), 1.5, 14.0, 10.0)),
    ("forest", 5.3, (40, 92, 40), ((1, 1), 2.0, 26.0, 14.0)),
    ("mountain", 7.7, (128, 120, 112), ((1, -1), 1.0, 30.0, 8.0)),
    ("water", 9.2, (48, 84, 160), ((0, 1), 2.5, 16.0, 4.0)),
)
"""The generator's terrain types: name, vertex cost (costs of the order of the Warcraft set's), base colour
and texture parameters. Types are laid out by elevation in this order: water lowest, then grass, dirt, forest,
mountain (:func:`terrain_types`)."""

_ELEVATION_ORDER = (4, 0, 1, 2, 3)  # water, grass, dirt, forest, mountain from low to high
_VARIANTS = 4  # tile variants per type, as a tile set draws each terrain in a few versions


def tile_costs() -> dict[str, float]:
    """Terrain name -> vertex cost of the generator's tile set."""
    return {name: cost for name, cost, _, _ in TERRAIN}


def tile_textures(seed: int = 0) -> np.ndarray:
    """The generator's tile set: ``(types, variants, 8, 8, 3)`` float32 RGB in pixel units (0..255).

    Each type has a base colour, an oriented stripe pattern and a speckle pattern fixed per variant; grass and
    forest share their hue, so a network must read texture as well as colour. Deterministic in ``seed``.
    """
    rng = np.random.default_rng([int(seed), 17])
    r, c = np.meshgrid(np.arange(TILE), np.arange(TILE), indexing="ij")
    tiles = np.empty((len(TERRAIN), _VARIANTS, TILE, TILE, 3), dtype=np.float32)
    for t, (_, _, rgb, ((dr, dc), freq, amp, speck)) in enumerate(TERRAIN):
        for v in range(_VARIANTS):
            phase = rng.uniform(0, 2 * np.pi)
            stripes = amp * np.sin(2 * np.pi * freq * (dr * r + dc * c) / TILE + phase)
            speckle = speck * rng.standard_normal((TILE, TILE))
            shade = (stripes + speckle)[..., None] * np.array([1.0, 1.0, 1.0])
            tiles[t, v] = np.clip(np.asarray(rgb, dtype=np.float32) + shade, 0, 255)
    return tiles


def _interp_matrix(k: int, m: int) -> np.ndarray:
    """``(k, m)`` linear interpolation of m control points at k evenly spaced cell centres."""
    pos = (np.arange(k) + 0.5) / k * (m - 1)
    lo = np.minimum(np.floor(pos).astype(int), m - 2)
    frac = pos - lo
    u = np.zeros((k, m))
    u[np.arange(k), lo] = 1 - frac
    u[np.arange(k), lo + 1] = frac
    return u


def terrain_types(n: int, grid: int, rng: np.random.Generator) -> np.ndarray:
    """Spatially coherent terrain: ``(n, grid, grid)`` int64 type indices into :data:`TERRAIN`.

    A smooth random elevation field (two octaves of bilinearly interpolated Gaussian noise) is cut into the
    types in elevation order, at per-map quantiles with Dirichlet(2) proportions (so maps differ in how much of
    each type they hold).
    """
    k = int(grid)
    field = np.zeros((n, k, k))
    for m, weight in ((max(3, k // 4 + 1), 1.0), (max(3, k // 2 + 1), 0.45)):
        u = _interp_matrix(k, m)
        field += weight * (u @ rng.standard_normal((n, m, m)) @ u.T)
    field += 0.15 * rng.standard_normal((n, k, k))  # small-scale breaks in the blobs
    shares = rng.dirichlet(np.full(len(TERRAIN), 2.0), size=n)
    cuts = np.cumsum(shares, axis=1)[:, :-1] * k * k  # number of cells below each cut
    rank = field.reshape(n, -1).argsort(1).argsort(1)  # elevation rank of each cell within its map
    level = (rank[:, :, None] >= cuts[:, None, :]).sum(-1)  # which elevation band
    return np.asarray(_ELEVATION_ORDER)[level].reshape(n, k, k)


def render_maps(types: np.ndarray, rng: np.random.Generator, tiles: np.ndarray, brightness: np.ndarray,
                noise: float = 10.0) -> np.ndarray:
    """RGB images of terrain grids: ``(n, 8k, 8k, 3)`` uint8 from ``types (n, k, k)``.

    Every tile is a random variant of its type's texture times its ``brightness (n, k, k)`` factor, plus
    per-pixel Gaussian noise of standard deviation ``noise`` (pixel units).
    """
    n, k, _ = types.shape
    variants = rng.integers(0, tiles.shape[1], size=types.shape)
    img = tiles[types, variants]  # (n, k, k, 8, 8, 3)
    img = img * brightness.astype(np.float32)[..., None, None, None]
    img = img.transpose(0, 1, 3, 2, 4, 5).reshape(n, TILE * k, TILE * k, 3)
    img += noise * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def generate_warcraft_like(n: int, grid: int = 12, seed: int = 0, split: str = "train", jitter: float = 0.1,
                           chunk: int = 500) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Warcraft-like maps of one split, chunk by chunk: ``(maps (c, 8k, 8k, 3) uint8, weights (c, k, k)
    float32, paths (c, k, k) uint8)``.

    A tile's cost is its type's cost (:data:`TERRAIN`) times a factor f drawn uniformly in
    ``[1 - jitter, 1 + jitter]``, and the tile is drawn with brightness f, so the cost stays readable from
    the image. With five exact costs (``jitter = 0``) most maps have several optimal paths (ties between
    routes through the same numbers of each type), which makes an exact-match metric ill-posed; the
    jitter makes the optimum unique almost surely. With ``jitter = 0`` the brightness is still drawn
    (±8 %) as a nuisance.

    Labels are the exact shortest paths of the weights (:func:`diffrank.experiments.algorithms.dijkstra.shortest_paths`,
    its documented tie-breaking). Deterministic in ``(seed, split, chunk)``; splits draw independent streams.

    Raises:
        ValueError: unknown split, n < 0 or grid < 2.
    """
    from diffrank.experiments.algorithms.dijkstra import shortest_paths_numpy

    if split not in SPLITS or int(n) < 0 or int(grid) < 2 or not 0 <= float(jitter) < 0.2:
        raise ValueError(f"need split in {SPLITS}, n >= 0, grid >= 2, 0 <= jitter < 0.2 (types must keep "
                         f"disjoint cost ranges); got {split!r}, {n}, {grid}, {jitter}")
    tiles = tile_textures(seed)
    costs = np.array([c for _, c, _, _ in TERRAIN], dtype=np.float32)
    for j, start in enumerate(range(0, int(n), int(chunk))):
        rng = np.random.default_rng([int(seed), SPLITS.index(split), j])
        count = min(int(chunk), int(n) - start)
        types = terrain_types(count, grid, rng)
        factor = rng.uniform(1 - jitter, 1 + jitter, size=types.shape) if jitter else None
        weights = (costs[types] * factor).astype(np.float32) if jitter else costs[types]
        brightness = factor if jitter else rng.uniform(0.92, 1.08, size=types.shape)
        yield render_maps(types, rng, tiles, brightness), weights, shortest_paths_numpy(weights)


def write_warcraft_like(out: str | Path, grid: int = 12, sizes: tuple[int, int, int] = (10000, 1000, 1000),
                        seed: int = 0, root_name: str = SYNTHETIC_ROOT, jitter: float = 0.1,
                        checksums: bool = True) -> Path:
    """Write a generated set in the real layout and file names, plus the ``SYNTHETIC.json`` marker.

    Args:
        out: the data root (``paths.data_dir``); files go to ``<out>/<root_name>/<grid>x<grid>/``.
        grid: tiles per side.
        sizes: maps in (train, val, test).
        seed: the generator's seed (same seed, same files).
        root_name: folder under ``out`` (default ``warcraft_like_synthetic``; the marker labels the set
            synthetic whatever the name).
        jitter: relative per-tile cost jitter, shown as brightness (:func:`generate_warcraft_like`).
        checksums: record the MD5 of every file in the marker.

    Returns:
        The folder written.

    Raises:
        ValueError: as :func:`generate_warcraft_like`.
    """
    from diffrank.experiments.algorithms.dijkstra import count_optimal_paths

    folder = warcraft_folder(out, grid, root_name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).unlink(missing_ok=True)  # a half-written folder must not look complete
    px = TILE * int(grid)
    stats = {}
    for split, n in zip(SPLITS, sizes):
        n = int(n)
        names = split_files(split)
        maps = np.lib.format.open_memmap(folder / names[0], mode="w+", dtype=np.uint8, shape=(n, px, px, 3))
        weights = np.lib.format.open_memmap(folder / names[1], mode="w+", dtype=np.float32, shape=(n, grid, grid))
        paths = np.lib.format.open_memmap(folder / names[2], mode="w+", dtype=np.uint8, shape=(n, grid, grid))
        at = 0
        for m, w, p in generate_warcraft_like(n, grid, seed, split, jitter):
            maps[at : at + len(m)], weights[at : at + len(m)], paths[at : at + len(m)] = m, w, p
            at += len(m)
        for arr in (maps, weights, paths):
            arr.flush()
        lengths = np.asarray(paths).reshape(n, -1).sum(1)
        counts = count_optimal_paths(np.asarray(weights)) if n else np.zeros(0)
        stats[split] = {"maps": n, "mean_path_cells": float(lengths.mean()) if n else None,
                        "max_path_cells": int(lengths.max()) if n else None,
                        "non_unique_optimum_fraction": float((counts > 1).mean()) if n else None}
        del maps, weights, paths
    marker = {
        "synthetic": True,
        "generator": "scripts/make_warcraft_like.py (diffrank.experiments.data.warcraft.write_warcraft_like)",
        "version": GENERATOR_VERSION, "seed": int(seed), "grid": int(grid),
        "tile_costs": tile_costs(), "cost_jitter": float(jitter),
        "cost_rule": "vertex cost = tile cost x f, f ~ U[1 - jitter, 1 + jitter], tile brightness x f",
        "note": "Warcraft-like procedurally generated maps, not the Vlastelica et al. (2020) Warcraft set",
        "splits": stats,
    }
    if checksums:
        marker["md5"] = {f: md5_file(folder / f) for s in SPLITS for f in split_files(s)}
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return folder
