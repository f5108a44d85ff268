"""Benchmark every operator against its reference implementation; prints one table per suite.

    python scripts/benchmark_operators.py                  # every suite, default sizes
    python scripts/benchmark_operators.py --suite basic --quick
    python scripts/benchmark_operators.py --device cuda    # on a GPU

Suites live in ``scripts/benchmarks/<suite>.py`` and expose ``run(args) -> list[tuple[title, rows]]``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SUITES = ["basic", "networks", "others"]


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and print the tables of the chosen suites."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="append", choices=SUITES, help="suite(s) to run (default: all)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="time budget per cell")
    args = p.parse_args(argv)
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and argv is None:
        # glibc then maps every block >= 64 KiB separately and unmaps it on free, so the resident set
        # follows live tensors and the CPU peak-memory column means something (see harness.py)
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    from benchmarks.harness import print_table

    for suite in args.suite or SUITES:
        try:
            mod = importlib.import_module(f"benchmarks.{suite}")
        except ModuleNotFoundError as e:
            print(f"[suite {suite} not available: {e}]")
            continue
        for title, rows in mod.run(args):
            setting = f"device={args.device}, B={args.batch}, k={args.k}, threads={torch.get_num_threads()}"
            print_table(f"{title} ({setting})", rows)


if __name__ == "__main__":
    main()
