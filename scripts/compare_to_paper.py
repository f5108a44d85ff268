"""Compare our runs with the papers' tables: Markdown report + PNG plot + console table.

Usage: ``python scripts/compare_to_paper.py RUN_DIR... [--out outputs/report] [--metric-prefix test/]``

Every ``results.json`` under the given folders (recursively) whose ``paper`` field is a dict is matched to
the bundled reference rows (:mod:`diffrank.reference`) whose columns equal every field of that dict. Each
matched row (one per metric) becomes a line of the report: the published value, our mean ± sample std
over the runs (seeds) sharing the same ``paper`` key, Δ = ours − paper, and the number of runs. One Markdown
table per (paper, table). Runs whose key matches no reference row are listed at the end, so typos in a
``paper:`` key do not vanish silently. The matching and the tables live in :mod:`diffrank.experiments.report` (training
runs log the same rows to W&B).

Runs of the offline P_K benchmark (``benchmark:`` key instead of ``paper:``, :mod:`diffrank.experiments.report_pk`)
get their
P_K x method grid beside the paper's CIFAR-100 one, in ``pk_<dataset>.md``.

Later experiments add their tables by giving their configs a ``paper:`` key over the same columns and
shipping the reference CSV in ``src/diffrank/reference/``; nothing here needs to change.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from diffrank.experiments.report import (  # noqa: F401  (re-exported: the script's former functions)
    LABEL_COLUMNS,
    _budget,
    _is_fraction,
    collect,
    collect_runs,
    find_results,
    fmt,
    markdown,
    plot,
    print_console,
    table_rows,
)
from diffrank.experiments.report_pk import reports


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line entry point; returns the collected result (:func:`diffrank.experiments.report.collect`)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run folders (searched recursively for results.json)")
    ap.add_argument("--out", default="outputs/report", help="folder for report.md and report.png")
    ap.add_argument("--metric-prefix", default="test/", help="our metrics are <prefix><metric> (default test/)")
    ap.add_argument("--quiet", action="store_true", help="do not print the tables")
    a = ap.parse_args(argv)
    result = collect(a.paths, a.metric_prefix)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(result))
    png = plot(result, out / "report.png")
    if not a.quiet:
        print_console(result)
    # benchmarks on other datasets than the paper's (no paper key): our P_K x method grid beside the paper's
    for dataset, text in reports(a.paths).items():
        (out / f"pk_{dataset}.md").write_text(f"```\n{text}\n```\n")
        if not a.quiet:
            print(text)
    print(f"report: {out / 'report.md'}" + (f", plot: {png}" if png else ""))
    return result


if __name__ == "__main__":
    main()
