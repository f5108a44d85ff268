"""Warcraft-like procedurally generated shortest-path maps in the file format of Vlastelica et al. (2020)
(docs/warcraft.md, "Data"): the generator; :mod:`diffrank.experiments.data.warcraft` reads them like the real set.

Command line (:func:`main`)::

    python -m diffrank.experiments.data.warcraft_like --out data                  # 12x12: 10 000 / 1 000 / 1 000 maps
    python -m diffrank.experiments.data.warcraft_like --out data --grid 18 --seed 1
    python -m diffrank.experiments.data.warcraft_like --out DIR --n-train 20 --n-val 5 --n-test 5

Files go to ``<out>/warcraft_like_synthetic/<k>x<k>/`` (``--root-name``) under the real file names
(``train_maps.npy``, ``train_vertex_weights.npy``, ``train_shortest_paths.npy``, ... for train / val / test),
with a ``SYNTHETIC.json`` marker (generator, version, seed, tile costs, per-split statistics, MD5 sums) that
labels the set synthetic. Train on it with ``paths.data_dir=<out> data.root_name=warcraft_like_synthetic``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from diffrank.experiments.data.warcraft_maps import (
    MARKER,
    SPLITS,
    SYNTHETIC_ROOT,
    TILE,
    md5_file,
    split_files,
    warcraft_folder,
)

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
        "generator": "diffrank.experiments.data.warcraft_like.write_warcraft_like",
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


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, write the set, print the folder, wall time and the marker's statistics."""
    p = argparse.ArgumentParser(prog="python -m diffrank.experiments.data.warcraft_like", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="data root (paths.data_dir)")
    p.add_argument("--grid", type=int, default=12, help="tiles per side k (images are 8k x 8k)")
    p.add_argument("--n-train", type=int, default=10000)
    p.add_argument("--n-val", type=int, default=1000)
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--root-name", default=SYNTHETIC_ROOT, help="folder under --out (default: %(default)s)")
    p.add_argument("--jitter", type=float, default=0.1,
                   help="relative per-tile cost jitter, drawn as brightness; 0 = five exact costs "
                   "(default: %(default)s)")
    p.add_argument("--no-md5", action="store_true", help="do not record MD5 sums in the marker")
    args = p.parse_args(argv)
    start = time.perf_counter()
    folder = write_warcraft_like(args.out, args.grid, (args.n_train, args.n_val, args.n_test), args.seed,
                                 args.root_name, args.jitter, checksums=not args.no_md5)
    elapsed = time.perf_counter() - start
    marker = json.loads((folder / MARKER).read_text())
    print(f"wrote {folder} in {elapsed:.1f} s")
    print("tile costs:", marker["tile_costs"])
    for split, stats in marker["splits"].items():
        print(f"{split}: {stats}")


if __name__ == "__main__":
    main()
