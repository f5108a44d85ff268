"""Write a procedurally generated, Warcraft-like shortest-path set in the file format of Vlastelica et al. (2020).

    python scripts/make_warcraft_like.py --out data                     # 12x12: 10 000 / 1 000 / 1 000 maps
    python scripts/make_warcraft_like.py --out data --grid 18 --seed 1
    python scripts/make_warcraft_like.py --out /tmp/wc --n-train 20 --n-val 5 --n-test 5

Files go to ``<out>/warcraft_like_synthetic/<k>x<k>/`` (``--root-name``) under the real file names
(``train_maps.npy``, ``train_vertex_weights.npy``, ``train_shortest_paths.npy``, ... for train / val / test),
with a ``SYNTHETIC.json`` marker (generator, version, seed, tile costs, per-split statistics, MD5 sums) that
labels the set synthetic. Train on it with ``paths.data_dir=<out> data.root_name=warcraft_like_synthetic``.
Terrain, textures and labels: ``diffrank.experiments.data.warcraft`` and docs/warcraft.md ("Data").
"""

from __future__ import annotations

import argparse
import json
import time

from diffrank.experiments.data.warcraft import MARKER, SYNTHETIC_ROOT, write_warcraft_like


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, write the set, print the folder, wall time and the marker's statistics."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
