"""Our runs against the papers' tables: match ``results.json`` records to the bundled reference rows
(:mod:`diffrank.reference`), tabulate paper / ours / Δ, and render them as Markdown, a PNG or a console table.

The report over run folders is this module's command line (:func:`main`; :func:`write_report` in Python)::

    python -m diffrank.experiments.analysis.report RUN_DIR... [--out outputs/report] [--metric-prefix test/] [--quiet]

(also ``diffrank-report``; ``RUN_DIR`` may also be, or hold, run archives:
:mod:`diffrank.experiments.records.archive`): ``report.md`` and ``report.png`` in ``--out``,
the tables on the console, and, for runs of the offline P_K benchmark (a ``paper:`` key with a ``benchmark`` field,
:mod:`diffrank.experiments.analysis.report_pk`), their P_K x method grid beside the paper's CIFAR-100 one in
``pk_<dataset>.md``. Training runs with a W&B logger log their own row of the comparison (:func:`collect_runs` on
the run's record). Later experiments add their tables by giving their configs a ``paper:`` key over the
reference columns and shipping the reference CSV in ``src/diffrank/reference/``; nothing here needs to change.

Runs of no paper row (no ``paper`` key: the default ``python train.py``, the digits100 runs) are not skipped: they have
a section of their own (:func:`other_runs`), one line per command, machine, budget and metric with each run's value,
their mean ± std, the date, the machine and the archive (or ``results.json``) read; a record no table can take (an
older ``variant_of`` run, a benchmark cell its P_K grid leaves out) is listed there with the reason. On a terminal
the console tables fit its width; piped or redirected they are printed whole, as wide as they are (:func:`_console`).

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
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diffrank.experiments.analysis.report_others import other_runs
from diffrank.experiments.analysis.report_render import _named, markdown, plot, print_console, write_text
from diffrank.experiments.records.archive import SUFFIX, find_records_with_files
from diffrank.experiments.records.matching import collect_runs

# our metric for a reference metric M is <prefix><m>: the test metrics unless --metric-prefix says otherwise
DEFAULT_PREFIX = "test/"


def write_report(paths: Iterable[str | Path], out: str | Path = "outputs/report", metric_prefix: str = DEFAULT_PREFIX,
                 quiet: bool = False) -> dict[str, Any]:
    """The report over run folders: ``report.md`` and ``report.png`` (when there is something to plot) in ``out``,
    the tables on the console (unless ``quiet``), and ``pk_<dataset>.md`` per offline P_K benchmark dataset
    (:func:`diffrank.experiments.analysis.report_pk.reports`); the last line printed names the files. Every
    record is read once (:func:`~diffrank.experiments.records.archive.find_records_with_files`) for all the
    sections.

    Args:
        paths: run folders (searched recursively for ``results.json`` and run archives) or such files.
        out: the folder written (created).
        metric_prefix: our metrics are ``<prefix><metric>``.
        quiet: print only the line naming the files.

    Returns:
        The collected result (:func:`~diffrank.experiments.records.matching.collect`), with ``others``: the runs
        of no paper row (:func:`other_runs`), a section of their own in ``report.md`` and on the console.

    Raises:
        FileNotFoundError / ValueError: see :func:`~diffrank.experiments.records.matching.collect`; ValueError
            also when no record has a metric starting with ``metric_prefix`` (a misspelt prefix: the message lists
            those the records have; for the default ``test/``, runs that were not tested, a warning).
        OSError: a file of ``out`` cannot be written (the message names it; no partial file is left).
    """
    from diffrank.experiments.analysis.report_pk import reports

    paths = list(paths)
    found = find_records_with_files(paths)
    if not found:
        print(f"warning: no run record (results.json or *{SUFFIX} archive) under {' '.join(map(str, paths))}",
              file=sys.stderr)
    names = {k for _, rec, _ in found for k in rec.metrics}
    if names and not any(k.startswith(metric_prefix) for k in names):
        prefixes = sorted({k.split("/", 1)[0] + "/" for k in names if "/" in k})
        why = (f"no record has a metric starting with --metric-prefix {metric_prefix!r}; theirs start with "
               f"{', '.join(prefixes) or '(no prefix)'} (e.g. {min(names)})")
        if metric_prefix != DEFAULT_PREFIX:  # a misspelt prefix: every line of every table would be empty
            raise ValueError(why)
        # runs that were not tested: said, and their own section shows every metric they have
        print(f"warning: {why}: the paper tables have no values", file=sys.stderr)
    records = [(path, rec) for path, rec, _ in found]
    result = collect_runs(records, metric_prefix, copies=True)
    result["others"] = other_runs(found, metric_prefix)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _named(e, out) from e
    write_text(out / "report.md", markdown(result))
    png = plot(result, out / "report.png")
    if not quiet:
        print_console(result)
    # benchmarks on other datasets than the paper's (no paper key): our P_K x method grid beside the paper's
    for dataset, text in reports(records).items():
        write_text(out / f"pk_{dataset}.md", f"```\n{text}\n```\n")
        if not quiet:
            print(text)
    print(f"report: {out / 'report.md'}" + (f", plot: {png}" if png else ""))
    return result


def main(argv: list[str] | None = None) -> None:
    """Command line of :func:`write_report`
    (``python -m diffrank.experiments.analysis.report RUN_DIR... [--out DIR]``).

    Raises:
        SystemExit: status 1 with ``error: <why>`` for a missing path, a malformed archive, a metric prefix no
            record has or a file that cannot be written (status 2: bad arguments).
    """
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.analysis.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+",
                    help="run folders (searched recursively for results.json and *.jsonl.gz run archives) or files")
    ap.add_argument("--out", default="outputs/report", help="folder for report.md and report.png")
    ap.add_argument("--metric-prefix", default=DEFAULT_PREFIX,
                    help=f"our metrics are <prefix><metric> (default {DEFAULT_PREFIX})")
    ap.add_argument("--quiet", action="store_true", help="do not print the tables")
    a = ap.parse_args(argv)
    try:
        write_report(a.paths, a.out, a.metric_prefix, a.quiet)
    except (OSError, ValueError) as e:  # FileNotFoundError included: say what is wrong, no traceback
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
