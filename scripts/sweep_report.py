"""Rebuild a sweep's summary from its job folders (finished or partial): ``sweep_summary.csv``, ``sweep.png``
and ``best.yaml`` in each sweep folder, and the best configuration on the console.

Usage: ``python scripts/sweep_report.py SWEEP_DIR... [--metric val/em5] [--mode max] [--no-write]``

What the Hydra callback writes at the end of every multirun (:mod:`diffrank.experiments.callbacks.hydra_callbacks`),
for a
sweep that was stopped, that had a failed job (Hydra then skips ``on_multirun_end``) or is still running. The
logic is :func:`diffrank.experiments.sweeps.summarize`. Exit status 1 when a folder holds no job.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diffrank.experiments.sweeps import format_report, summarize


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Command line entry point; returns one :func:`diffrank.experiments.sweeps.summarize` result per sweep folder.

    Raises:
        SystemExit: a folder that does not exist or holds no job (status 1), bad arguments (status 2).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dirs", nargs="+", help="Hydra sweep folders (hydra.sweep.dir)")
    ap.add_argument("--metric", default=None, help="metric to optimise (default: the runs' optimized_metric)")
    ap.add_argument("--mode", choices=("max", "min"), default=None, help="default: the runs' optimized_mode")
    ap.add_argument("--no-write", action="store_true", help="print only; write no file")
    a = ap.parse_args(argv)
    out = []
    for d in a.sweep_dirs:
        try:
            summary = summarize(d, a.metric, a.mode, write=not a.no_write)
        except FileNotFoundError as e:
            sys.exit(f"error: {e}")
        if not summary["rows"]:
            sys.exit(f"error: {d} holds no job folder (.hydra/overrides.yaml or results.json)")
        print(format_report(summary))
        out.append(summary)
    return out


if __name__ == "__main__":
    main()
