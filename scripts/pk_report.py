"""The P_K × method grid of a top-k benchmark run offline, beside the paper's CIFAR-100 grid (docs/topk_offline.md).

Usage: ``python scripts/pk_report.py RUN_DIR... [--out outputs/report]``

Reads every ``results.json`` under the folders whose config carries a ``benchmark`` key (the rows of
``configs/experiment/topk/<benchmark>/``), averages the seeds of each (method, P_K) cell and prints, per dataset:
our top-1 / top-5, runs and wall time per cell, Petersen et al. (ICML 2022) Table 4 / Table 1 on CIFAR-100
(a different dataset, for orientation) and which of the paper's orderings hold on each. The logic is
:mod:`diffrank.experiments.report_pk`; ``--out`` also writes ``pk_<dataset>.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from diffrank.experiments.report_pk import reports


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Command line entry point; returns ``{dataset: report text}``.

    Raises:
        SystemExit: no benchmark run under the given paths.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run or sweep folders (searched recursively for results.json)")
    ap.add_argument("--out", default=None, help="also write pk_<dataset>.md into this folder")
    a = ap.parse_args(argv)
    texts = reports(a.paths)
    if not texts:
        raise SystemExit(f"no finished benchmark run (results.json with a 'benchmark' key) under {a.paths}")
    for ds, text in texts.items():
        print(text, end="\n\n")
        if a.out:
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"pk_{ds}.md").write_text(f"# P_K x method: {ds}\n\n```\n{text}\n```\n", encoding="utf-8")
    return texts


if __name__ == "__main__":
    main()
