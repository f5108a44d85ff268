"""Tiny Warcraft shortest-path sets in the official on-disk format (Vlastelica et al. 2020), for tests."""

from __future__ import annotations

from pathlib import Path

from diffrank.experiments.data.warcraft_like import write_warcraft_like
from diffrank.experiments.data.warcraft_maps import REAL_ROOT, SYNTHETIC_ROOT


def write_warcraft(root: Path, grid: int = 12, sizes: tuple[int, int, int] = (20, 5, 5), seed: int = 0,
                   synthetic: bool = True) -> Path:
    """A generated set under ``root`` (use as ``paths.data_dir``); returns the folder with the nine files.

    ``synthetic=True`` writes ``root/warcraft_like_synthetic/<k>x<k>/`` (select with
    ``data.root_name=warcraft_like_synthetic``); ``synthetic=False`` writes the same maps under the real folder
    name ``root/warcraft_shortest_path_oneskin/<k>x<k>/`` without the ``SYNTHETIC.json`` marker, so the
    datamodule's defaults read them as if they were the real set.
    """
    folder = write_warcraft_like(root, grid, sizes, seed, SYNTHETIC_ROOT if synthetic else REAL_ROOT,
                                 checksums=False)
    if not synthetic:
        (folder / "SYNTHETIC.json").unlink()
    return folder
