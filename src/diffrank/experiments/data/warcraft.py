"""Warcraft shortest-path maps (Vlastelica et al., ICLR 2020, §5.1; Petersen's thesis §2.4): the reader
(docs/warcraft.md, "Data"). The generator of Warcraft-like maps in the same format is
:mod:`diffrank.experiments.data.warcraft_like`.

Files (the standard distribution, archive ``warcraft_maps.tar`` of the blackbox-differentiation repository):
``<data_dir>/<root_name>/<k>x<k>/`` with, per split s in {train, val, test},

- ``s_maps.npy``: ``(N, 8k, 8k, 3)`` uint8 RGB terrain images, channels last, 8 x 8 pixels per tile;
- ``s_vertex_weights.npy``: ``(N, k, k)`` float true vertex costs (one cost per terrain type);
- ``s_shortest_paths.npy``: ``(N, k, k)`` 0/1 indicator of the minimum-cost path from the top-left to the
  bottom-right cell, 8-neighbourhood, both end cells included.

``root_name`` is ``warcraft_shortest_path_oneskin`` for the real maps (k in {12, 18, 24, 30}; 10 000 / 1 000
/ 1 000 maps) and ``warcraft_like_synthetic`` for the generated ones
(:func:`diffrank.experiments.data.warcraft_like.write_warcraft_like`, ``python -m
diffrank.experiments.data.warcraft_like``), which also carry a ``SYNTHETIC.json`` marker: a folder with the marker
is reported as synthetic (:attr:`WarcraftDataModule.synthetic`) whatever its name.

Preprocessing as the reference code: float32, channels first, per-channel mean / standard deviation of the
training maps (population std over all pixels of the whole training file) applied to every split; no
augmentation.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from diffrank.experiments.data.number_sets import parse_device_resident
from diffrank.experiments.data.samplers import EpochSampler
from diffrank.experiments.data.warcraft_maps import (
    MD5_12X12,
    REAL_ROOT,
    SPLITS,
    TILE,
    channel_stats,
    check_warcraft_files,
    load_split,
    md5_file,
    read_marker,
)


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
            (generated by ``python -m diffrank.experiments.data.warcraft_like``).
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
        # shuffled from (seed, epoch); the last batch may be smaller (the reference's loader: no drop_last)
        sampler = EpochSampler(len(ds), self.seed if shuffle else None, stream=3, batch_size=batch_size)
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
