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
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diffrank.experiments.records.archive import SUFFIX, find_records_with_files
from diffrank.experiments.records.disk import write_atomic
from diffrank.experiments.records.matching import collect_runs
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.records.table_cells import table_rows

# the config groups a run of no paper row is described by (its record's ``choices``), in this order
CONFIG_CHOICES = ("experiment", "data", "net", "loss", "operator", "pk", "newton")
# metrics recorded as fractions (accuracies, exact matches): shown in % like the papers' tables
PERCENT_METRICS = ("top", "em", "ew", "acc")
# our metric for a reference metric M is <prefix><m>: the test metrics unless --metric-prefix says otherwise
DEFAULT_PREFIX = "test/"


def _command(rec: RunRecord) -> str:
    """The command a run of no paper row was started with, its seed left out (``seeds`` says it)."""
    overrides = [o for o in rec.overrides if o.lstrip("+~").split("=", 1)[0] != "seed"]
    return " ".join(["python train.py", *overrides])


def _config(rec: RunRecord) -> str:
    """The config groups a run composed (:data:`CONFIG_CHOICES` of its ``choices``; groups left unused or
    ``none`` are not named)."""
    return " ".join(f"{k}={rec.choices[k]}" for k in CONFIG_CHOICES if rec.choices.get(k) not in (None, "none"))


def _why_not_shown(rec: RunRecord) -> str:
    """Why a record of no paper row is not in a table of the report (its line's note); ``""`` for a plain run of no
    published row."""
    from diffrank.experiments.analysis.report_pk import run_from_record

    bench = rec.benchmark_cell
    if bench is not None:
        if run_from_record(rec) is not None:
            return ""  # in its P_K grid
        if rec.variant_of:
            why = "an older run with another method (variant_of)"
        elif rec.status != "done":
            why = f"status {rec.status}"
        else:
            why = "no test/top1"
        cell = f"{bench.get('dataset')} {bench.get('operator')} {bench.get('pk')}"
        return f"benchmark cell {cell}, not in its P_K grid: {why}"
    if rec.variant_of:
        row = rec.variant_of.get("experiment") or json.dumps(rec.variant_of, sort_keys=True, default=str)
        return f"an older run of {row} with another method (variant_of): never shown as the row"
    return ""


def _in_percent(name: str, values: list[float]) -> bool:
    """Whether metric ``name`` is shown in %: an accuracy-like metric (:data:`PERCENT_METRICS`) whose values are
    fractions."""
    short = name.rsplit("/", 1)[-1]
    return short.startswith(PERCENT_METRICS) and all(0.0 <= v <= 1.0 for v in values)


def other_runs(found: Iterable[tuple[str | Path, RunRecord, str | Path]], metric_prefix: str = "test/"
               ) -> dict[str, Any]:
    """The records that reproduce no paper row (no ``paper`` key: the default ``python train.py``, the digits100
    runs; older ``variant_of`` runs; benchmark cells the P_K grid leaves out), for the report's section of their
    own: nothing is left out unsaid.

    Runs are grouped by command (:func:`_command`: the overrides but the seed), composed config, status, machine
    (:attr:`~diffrank.experiments.records.record.RunRecord.device`, thread count included), budget and note; a
    group has one line per metric of ``metric_prefix`` (every metric when none has it; one line ``—`` for runs
    with no metric), the runs in seed order. Finished benchmark cells with a ``test/top1`` are in their P_K grid
    (:mod:`diffrank.experiments.analysis.report_pk`) and only counted here.

    Args:
        found: ``(path of the results.json, record, file read)`` triples
            (:func:`~diffrank.experiments.records.archive.find_records_with_files`).
        metric_prefix: the metrics shown (``test/``).

    Returns:
        ``{"lines": [line, ...], "runs": int, "benchmark": {dataset: runs in its grid}}``; a line has ``command``,
        ``config``, ``status``, ``device``, ``budget``, ``note``, ``seeds``, ``metric``, ``unit`` (``"%"`` or
        ``""``), ``values`` (one per run, None where a run lacks the metric), ``mean``, ``std``, ``wall``
        (mean ``wall_time_s``), ``dates``, ``records`` (the files read) and ``codes``.
    """
    groups: dict[tuple, list[tuple[RunRecord, str]]] = defaultdict(list)
    benchmark: dict[str, int] = defaultdict(int)
    for _, rec, source in found:
        if rec.table_row is not None:
            continue
        note = _why_not_shown(rec)
        if rec.benchmark_cell is not None and not note:
            benchmark[str(rec.benchmark_cell.get("dataset"))] += 1
            continue
        key = (_command(rec), _config(rec), rec.status, rec.device or "", rec.budget, note)
        groups[key].append((rec, str(source)))
    lines = []
    for (command, config, status, device, budget, note), members in sorted(groups.items()):
        members.sort(key=lambda m: (m[0].seed is None, m[0].seed or 0, m[0].finished_at or ""))
        recs = [r for r, _ in members]
        names = sorted({k for r in recs for k in r.metrics if k.startswith(metric_prefix)}) \
            or sorted({k for r in recs for k in r.metrics})
        walls = [float(r.wall_time_s) for r in recs if isinstance(r.wall_time_s, (int, float))]
        common = {"command": command, "config": config, "status": status, "device": device, "budget": budget,
                  "note": note, "seeds": [r.seed for r in recs], "runs": len(recs),
                  "wall": statistics.fmean(walls) if walls else None,
                  "dates": sorted({r.finished_at[:10] for r in recs if r.finished_at}),
                  "records": sorted({src for _, src in members}), "codes": sorted({r.code for r in recs})}
        if not names:
            lines.append({**common, "metric": "—", "unit": "", "values": [None] * len(recs), "mean": math.nan,
                          "std": None})
        for name in names:
            raw = [r.metrics.get(name) for r in recs]
            raw = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in raw]
            present = [v for v in raw if v is not None]
            scale = 100.0 if _in_percent(name, present) else 1.0
            values = [None if v is None else scale * v for v in raw]
            present = [scale * v for v in present]
            lines.append({**common, "metric": name, "unit": "%" if scale == 100.0 else "", "values": values,
                          "mean": statistics.fmean(present) if present else math.nan,
                          "std": statistics.stdev(present) if len(present) > 1 else None})
    return {"lines": lines, "runs": sum(len(m) for m in groups.values()), "benchmark": dict(sorted(benchmark.items()))}


def other_rows(lines: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the section of runs of no paper row (:func:`other_runs`' lines)."""
    header = ["command", "config", "seeds", "metric", "per run", "mean ± std", "runs", "steps×batch", "wall s",
              "date", "machine", "records"]
    status = any(ln["status"] != "done" for ln in lines)
    codes = any(len(ln["codes"]) > 1 for ln in lines)
    notes = any(ln["note"] for ln in lines)
    header += [*(["status"] if status else []), *(["code versions"] if codes else []), *(["note"] if notes else [])]

    def number(v: float | None, unit: str) -> str:
        """A value as printed: 2 decimals in %, else 4 significant digits."""
        if v is None or math.isnan(v):
            return "—"
        return f"{v:.2f}" if unit else f"{v:.4g}"

    cells = []
    for ln in lines:
        unit = ln["unit"]
        mean = number(ln["mean"], unit) + ("" if ln["std"] is None else f" ± {number(ln['std'], unit)}")
        cells.append([ln["command"], ln["config"],
                      ", ".join("?" if s is None else str(s) for s in ln["seeds"]),
                      ln["metric"] + (f" ({unit})" if unit else ""),
                      ", ".join(number(v, unit) for v in ln["values"]), mean, str(ln["runs"]), ln["budget"],
                      "—" if ln["wall"] is None else f"{ln['wall']:.0f}",
                      " … ".join(dict.fromkeys([ln["dates"][0], ln["dates"][-1]])) if ln["dates"] else "—",
                      ln["device"] or "?", ", ".join(ln["records"]),
                      *([ln["status"]] if status else []),
                      *([", ".join(ln["codes"]) if len(ln["codes"]) > 1 else ""] if codes else []),
                      *([ln["note"]] if notes else [])])
    return header, cells


def markdown(result: dict[str, Any]) -> str:
    """The whole report as Markdown."""
    others = result.get("others")
    if others is None:  # the paper rows only (collect's result)
        counts = (f"{result['runs']} runs with a `paper` key; {result['skipped']} results.json without one were "
                  "skipped. ")
    else:  # every record is in a section: nothing skipped
        parts = [f"{result['runs']} runs with a `paper` key beside the papers' tables"]
        if others["runs"]:
            parts.append(f"{others['runs']} runs of no paper row in [their own section](#runs-of-no-paper-row)")
        parts += [f"{n} benchmark runs in the P_K grid `pk_{ds}.md`" for ds, n in others["benchmark"].items()]
        counts = "; ".join(parts) + ". "
    out = ["# Our runs vs the papers", "",
           counts + "Values in % (ours: mean ± sample std over runs); Δ = ours − paper; steps×batch = our training "
           "budget.", ""]
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
    if others and others["lines"]:
        header, cells = other_rows(others["lines"])
        out += ["## Runs of no paper row", "",
                "Runs whose config has no `paper` key (the default `python train.py`, the digits100 runs, …): no "
                "published number to set them beside. One line per command (its overrides but the seed), machine, "
                "budget and metric: the value of each run in the order of `seeds`, their mean ± sample std; "
                "accuracies in %. `records`: the archive (or results.json) they were read from.", "",
                "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        out.append("")
    if result.get("not_done"):
        out += ["## Runs left out: not finished (status diverged, interrupted, failed, or anything but done)", ""]
        out += [f"- `{path}`: {status}" for path, status in result["not_done"]]
        out.append("")
    if result.get("left_out"):
        out += ["## Runs left out: not comparable with their line's other runs", ""]
        out += [f"- `{path}`: {why}" for path, why in result["left_out"]]
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
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
    return path


def _named(e: OSError, path: Path) -> OSError:
    """``e`` (a failed write) as an OSError naming ``path`` (a full disk's ENOSPC names no file)."""
    return OSError(e.errno, f"cannot write {path}: {e.strerror or e}")


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as the PNG ``path`` through a temporary file renamed over it, so that a failed
    write (a full disk) leaves no empty or partial PNG. Folders are created. Returns the path.

    Raises:
        OSError: the file cannot be written (the message names ``path``; the temporary file is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, path)
    except OSError as e:
        raise _named(e, path) from e
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write or the rename failed
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`~diffrank.experiments.records.disk.write_atomic`: a
    failed write leaves no partial file). Returns the path.

    Raises:
        OSError: the file cannot be written (the message names ``path``).
    """
    try:
        return write_atomic(path, text)
    except OSError as e:
        raise _named(e, path) from e


def _console(renderables: list[Any]) -> Any:
    """A rich console for ``renderables``: the terminal's when stdout is one (rich fits the tables to it); else
    (piped, redirected, captured) one as wide as the widest of them, so that no table is cut or wrapped at rich's
    default of 80 columns."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console()
    if console.is_terminal or not renderables:
        return console
    wide = Console(width=1 << 20)
    width = max(Measurement.get(wide, wide.options, r).maximum for r in renderables)
    return Console(width=max(80, width))


def print_console(result: dict[str, Any]) -> None:
    """The report's tables in the console (rich), the runs of no paper row included (``result["others"]``:
    :func:`other_runs`); piped, at their full width (:func:`_console`)."""
    from rich.table import Table
    from rich.text import Text

    def table(title: str, header: list[str], cells: list[list[str]], right: tuple[str, ...]) -> Table:
        """A rich table of ``cells`` (rows of strings) under ``header``; the columns named in ``right`` are
        right-aligned (numbers)."""
        t = Table(title=title)
        for h in header:
            t.add_column(h, justify="right" if h in right else "left")
        for row in cells:
            t.add_row(*row)
        return t

    shown: list[Any] = []
    for (paper, table_name), lines in result["tables"].items():
        header, cells = table_rows(lines)
        shown.append(table(f"{paper}, Table {table_name}", header, cells, ("paper", "ours", "Δ", "runs", "n")))
    others = result.get("others")
    if others and others["lines"]:
        header, cells = other_rows(others["lines"])
        shown.append(table("Runs of no paper row", header, cells, ("runs", "wall s")))
    for path, key in result["unmatched"]:
        shown.append(Text.assemble(("no reference row for", "yellow"), f" {path}: {key}"))
    for path, status in result.get("not_done", []):
        shown.append(Text.assemble((f"left out ({status}):", "yellow"), f" {path}"))
    for path, why in result.get("left_out", []):
        shown.append(Text.assemble(("left out:", "yellow"), f" {path}: {why}"))
    console = _console(shown)
    for r in shown:
        console.print(r)


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
