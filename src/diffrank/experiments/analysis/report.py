"""Our runs against the papers' tables: match ``results.json`` records to the bundled reference rows
(:mod:`diffrank.reference`), tabulate paper / ours / Δ, and render them as Markdown, a PNG or a console table.

The report over run folders is this module's command line (:func:`main`; :func:`write_report` in Python)::

    python -m diffrank.experiments.analysis.report RUN_DIR... [--out outputs/report] [--metric-prefix test/] [--quiet]

(also ``diffrank-report`` and ``scripts/compare_to_paper.py``; ``RUN_DIR`` may also be, or hold, run archives:
:mod:`diffrank.experiments.records.archive`): ``report.md`` and ``report.png`` in ``--out``,
the tables on the console, and, for runs of the offline P_K benchmark (a ``paper:`` key with a ``benchmark`` field,
:mod:`diffrank.experiments.analysis.report_pk`), their P_K x method grid beside the paper's CIFAR-100 one in
``pk_<dataset>.md``. Training runs with a W&B logger log their own row of the comparison (:func:`collect_runs` on
the run's record). Later experiments add their tables by giving their configs a ``paper:`` key over the
reference columns and shipping the reference CSV in ``src/diffrank/reference/``; nothing here needs to change.

Every record whose ``paper`` field names a reference row (a dict without a ``benchmark`` field:
:attr:`~diffrank.experiments.records.record.RunRecord.table_row`) is matched to the reference rows whose columns equal
every field of that dict. Each matched row (one per metric) becomes a line: the published value, our mean ± sample std
over the runs (seeds) sharing the same ``paper`` key, Δ = ours − paper, and the number of runs. Our metric for a
reference metric ``M`` is ``<prefix><m>`` with m = M lower-cased (``EM`` → ``test/em``, ``top1`` → ``test/top1``); our
fractions are shown in % unless the reference row's note says it is printed as a fraction. Older records of a table row
run with another operator (``paper`` null, ``variant_of`` the row; such runs are refused now) are skipped, never shown
as the row's method. Only finished runs (``status: done``) are pooled, one per (config, seed); a run whose
command line changed the row's config (anything but the seed, where it ran, and what has a column of its own) is
a variant of the row, on a line of its own; a line pooling runs of several code versions lists them. The budget
column is the optimizer steps actually taken × the global batch (``results.json`` fields
``optimizer_steps`` / ``global_batch``, summed over DDP ranks; older records:
:meth:`~diffrank.experiments.records.record.RunRecord.from_dict`).

Temperature sweeps: when the runs of one ``paper`` key differ in ``operator.beta`` (a row whose temperature is
not published, swept with ``hparams_search=beta_grid``: SinkhornSort in Petersen et al. 2022), only the runs of
the β with the best seed-mean validation accuracy (``val/top1_best``, else the run's ``optimized_metric``) are
reported, and the line says which β (``selected``). Our values are printed with the paper's decimals, at least
two (ImageNet-1K top-5 has three). Reference rows of a table that are not runs (Petersen et al. 2022 Table 5's
published numbers of other models, ``method`` ``literature``) are shown with the table's lines, ours empty.

Copied baselines: a table that reprints another paper's numbers (``copy_of=<paper>:<table>`` in the reference row's
``setting``, :func:`diffrank.reference.copy_source`; LapSum Tables 1-3 reprint Petersen et al. 2022 Tables 1-2 and
Xie et al. 2020 Table 1) gets a section as soon as one of its own rows or one of the originals has runs; each
copied row is shown with the runs of its original (Δ against the number as this table prints it), which no config
runs a second time: ``runs`` in the result counts each record once, and the plot shows a run in its original's
panel only.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diffrank.experiments.records.archive import find_records
from diffrank.experiments.records.paper_rows import (  # noqa: F401 - report.<name> as before
    LABEL_COLUMNS,
    SIGNIFICANCE,
    collect,
    collect_runs,
    copy_lines,
    decimals,
    fmt,
    is_fraction,
    select_beta,
    significance,
    table_rows,
)


def markdown(result: dict[str, Any]) -> str:
    """The whole report as Markdown."""
    out = ["# Our runs vs the papers", "",
           f"{result['runs']} runs with a `paper` key; {result['skipped']} results.json without one were skipped. "
           "Values in % (ours: mean ± sample std over runs); Δ = ours − paper; steps×batch = our training budget.",
           ""]
    for (paper, table), lines in result["tables"].items():
        header, cells = table_rows(lines)
        out += [f"## {paper}, Table {table}", "", "| " + " | ".join(header) + " |",
                "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        sources = sorted({ln["copy_of"] for ln in lines if ln.get("copy_of")})
        if sources:
            out += ["", f"Rows with `copy_of=` in `setting` reprint {', '.join(sources)}: ours there are the runs of "
                    "that table's row (also in its own section, counted once); Δ is against the number as printed "
                    "here."]
        out.append("")
    if result.get("not_done"):
        out += ["## Runs left out: not finished (diverged, interrupted or failed)", ""]
        out += [f"- `{path}`: {status}" for path, status in result["not_done"]]
        out.append("")
    if result["unmatched"]:
        out += ["## Runs whose `paper` key matches no reference row", ""]
        out += [f"- `{path}`: `{json.dumps(key)}`" for path, key in result["unmatched"]]
        out.append("")
    return "\n".join(out)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Ours vs paper, one panel per table (error bars = std over runs); None when nothing to plot."""
    tables = {k: [ln for ln in v if ln["runs"] and not math.isnan(ln["paper"]) and not ln.get("copy_of")]
              for k, v in result["tables"].items()}
    tables = {k: v for k, v in tables.items() if v}
    if not tables:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(4.5 * len(tables), 4.2), squeeze=False)
    for ax, ((paper, table), lines) in zip(axes[0], tables.items()):
        for metric in sorted({ln["metric"] for ln in lines}):
            sel = [ln for ln in lines if ln["metric"] == metric]
            ax.errorbar([ln["paper"] for ln in sel], [ln["mean"] for ln in sel],
                        yerr=[ln["std"] or 0.0 for ln in sel], fmt="o", capsize=3, label=metric)
        lo = min(min(ln["paper"], ln["mean"]) for ln in lines)
        hi = max(max(ln["paper"], ln["mean"]) for ln in lines)
        pad = 0.05 * (hi - lo or 1.0)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=0.8)
        ax.set_xlabel("paper")
        ax.set_ylabel("ours")
        ax.set_title(f"{paper}\nTable {table}", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_console(result: dict[str, Any]) -> None:
    """The report's tables in the console (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for (paper, table), lines in result["tables"].items():
        header, cells = table_rows(lines)
        t = Table(title=f"{paper}, Table {table}")
        for h in header:
            t.add_column(h, justify="right" if h in ("paper", "ours", "Δ", "runs", "n") else "left")
        for row in cells:
            t.add_row(*row)
        console.print(t)
    for path, key in result["unmatched"]:
        console.print(f"[yellow]no reference row for[/yellow] {path}: {key}")
    for path, status in result.get("not_done", []):
        console.print(f"[yellow]left out ({status}):[/yellow] {path}")


def write_report(paths: Iterable[str | Path], out: str | Path = "outputs/report", metric_prefix: str = "test/",
                 quiet: bool = False) -> dict[str, Any]:
    """The report over run folders: ``report.md`` and ``report.png`` (when there is something to plot) in ``out``,
    the tables on the console (unless ``quiet``), and ``pk_<dataset>.md`` per offline P_K benchmark dataset
    (:func:`diffrank.experiments.analysis.report_pk.reports`); the last line printed names the files. Every
    record is read once (:func:`~diffrank.experiments.records.archive.find_records`) for all the sections.

    Args:
        paths: run folders (searched recursively for ``results.json`` and run archives) or such files.
        out: the folder written (created).
        metric_prefix: our metrics are ``<prefix><metric>``.
        quiet: print only the line naming the files.

    Returns:
        The collected result (:func:`collect`).

    Raises:
        FileNotFoundError / ValueError: see :func:`collect`.
    """
    from diffrank.experiments.analysis.report_pk import reports

    records = find_records(paths)
    result = collect_runs(records, metric_prefix, copies=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(result))
    png = plot(result, out / "report.png")
    if not quiet:
        print_console(result)
    # benchmarks on other datasets than the paper's (no paper key): our P_K x method grid beside the paper's
    for dataset, text in reports(records).items():
        (out / f"pk_{dataset}.md").write_text(f"```\n{text}\n```\n")
        if not quiet:
            print(text)
    print(f"report: {out / 'report.md'}" + (f", plot: {png}" if png else ""))
    return result


def main(argv: list[str] | None = None) -> None:
    """Command line of :func:`write_report`
    (``python -m diffrank.experiments.analysis.report RUN_DIR... [--out DIR]``)."""
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.analysis.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+",
                    help="run folders (searched recursively for results.json and *.jsonl.gz run archives) or files")
    ap.add_argument("--out", default="outputs/report", help="folder for report.md and report.png")
    ap.add_argument("--metric-prefix", default="test/", help="our metrics are <prefix><metric> (default test/)")
    ap.add_argument("--quiet", action="store_true", help="do not print the tables")
    a = ap.parse_args(argv)
    write_report(a.paths, a.out, a.metric_prefix, a.quiet)


if __name__ == "__main__":
    main()
