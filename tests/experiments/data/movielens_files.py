"""A tiny MovieLens-style ``.inter`` file inside a zip named and laid out as RecBole's wheel
(``<root>/recbole/recbole-1.2.1-py3-none-any.whl`` holding ``recbole/dataset_example/ml-100k/ml-100k.inter``)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from diffrank.experiments.data.movielens import MEMBER, wheel_path

HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
COUNTS = (12, 10, 15, 20, 11, 3, 2, 1, 9, 25, 14, 13)


def write_ml100k(root: Path, counts: tuple[int, ...] = COUNTS, num_items: int = 30, seed: int = 0) -> Path:
    """The zip with one line per rating: user ``u + 1`` (tokens 1 …) rates ``counts[u]`` distinct items among
    tokens ``1 … num_items`` (every item rated by someone), random ratings and timestamps. Returns the zip's path."""
    rng = np.random.default_rng(seed)
    rows = []
    for u, c in enumerate(counts):
        for i in rng.choice(num_items, size=c, replace=False):
            rows.append(f"{u + 1}\t{i + 1}\t{rng.integers(1, 6)}\t{rng.integers(8e8, 9e8)}")
    seen = {int(r.split("\t")[1]) for r in rows}
    rows += [f"{len(counts)}\t{i}\t3\t880000000" for i in range(1, num_items + 1) if i not in seen]
    path = wheel_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(MEMBER, "\n".join([HEADER, *rng.permutation(rows).tolist()]) + "\n")
    return path
