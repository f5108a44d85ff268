"""The P_K × method grid of a top-k benchmark beside the paper's CIFAR-100 grid, and which of the paper's
orderings hold (docs/topk_offline.md).

Rows of ``configs/experiment/topk/<benchmark>/`` run a cell of the paper's grid on another dataset: their ``paper``
key is ``{benchmark: <dataset>, method, operator, pk}`` (older records: ``paper`` null and a config key
``benchmark: {dataset, method, operator, pk}``, read alike by
:attr:`~diffrank.experiments.records.record.RunRecord.benchmark_cell`), with ``operator`` and ``pk`` spelt as the
``operator`` / ``pk`` columns of the reference CSVs (``neuralsort``, ``softsort``, ``dsn``, ``softmax_ce``;
``"[.5,0,0,0,.5]"``). :func:`collect` reads the runs' ``results.json``, :func:`grid` averages the seeds of each
cell, :func:`paper_grid` looks up Petersen et al. (ICML 2022) Table 4 and Table 1 (CIFAR-100, ResNet-18: a
*different dataset*, for orientation only), :func:`check_orderings` evaluates the paper's qualitative claims on
both, :func:`format_report` prints it all.

Command line (:func:`main`; also part of ``python -m diffrank.experiments.analysis.report``)::

    python -m diffrank.experiments.analysis.report_pk RUN_DIR... [--out outputs/report]

reads every ``results.json`` under the folders whose ``paper`` key is a benchmark cell, averages the seeds of
each (method, P_K) cell and prints, per dataset: our top-1 / top-5, runs and wall time per cell, Petersen et al.
(ICML 2022) Table 4 / Table 1 on CIFAR-100 (a different dataset, for orientation) and which of the paper's
orderings hold on each; ``--out`` also writes ``pk_<dataset>.md``.

Accuracies are in % (results.json stores fractions; the reference CSVs store %), wall times in seconds per run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from diffrank import reference
from diffrank.experiments.records.archive import find_records
from diffrank.experiments.records.disk import write_atomic
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.records.table_cells import canonical_pk

PAPER = "petersen_difftopk_icml2022"
PK_ORDER = ("[1,0,0,0,0]", "[0,0,0,0,1]", "[.5,0,0,0,.5]", "[.25,0,0,0,.75]", "[.1,0,0,0,.9]", "[.2,.2,.2,.2,.2]")
METHOD_ORDER = ("softmax_ce", "neuralsort", "softsort", "sinkhorn", "dsn", "lapsum")
METHOD_NAMES = {"softmax_ce": "Softmax", "neuralsort": "NeuralSort", "softsort": "SoftSort",
                "sinkhorn": "SinkhornSort", "dsn": "DiffSortNets", "lapsum": "LapSum",
                "lapsum_alpha1": "LapSum α=-1"}  # LapSum at its ImageNet-21K-P α (the grid's lapsum is α = -1.5)
SOFTMAX = ("softmax_ce", "[1,0,0,0,0]")
TOP5, HALF, QUARTER, TENTH, UNIFORM = PK_ORDER[1:]

Cell = dict[str, Any]  # {"top1": %, "top5": %, "n": runs, "wall_s": s per run or None, "seeds": [...]}
Grid = dict[tuple[str, str], Cell]  # (operator, pk) -> cell


def parse_pk(text: str) -> tuple[float, ...]:
    """``"[.5,0,0,0,.5]"`` → ``(0.5, 0.0, 0.0, 0.0, 0.5)``.

    Raises:
        ValueError: not a bracketed comma-separated list of numbers.
    """
    s = str(text).strip()
    if not (s.startswith("[") and s.endswith("]")):
        raise ValueError(f"P_K must be written like '[.5,0,0,0,.5]', got {text!r}")
    try:
        return tuple(float(v) for v in s[1:-1].split(","))
    except ValueError as e:
        raise ValueError(f"P_K must be written like '[.5,0,0,0,.5]', got {text!r}") from e


@dataclass(frozen=True)
class Run:
    """One finished run of a benchmark row: accuracies in %, wall time in s."""

    dataset: str
    operator: str
    pk: str
    seed: int | None
    top1: float
    top5: float
    wall_s: float | None
    path: str


def run_from_record(record: RunRecord, path: str = "") -> Run | None:
    """The :class:`Run` of a run record, or None when it is not a finished benchmark run (no benchmark cell:
    :attr:`~diffrank.experiments.records.record.RunRecord.benchmark_cell`, status not ``done``, a variant run with
    another operator, or no ``test/top1``).

    Raises:
        ValueError: a benchmark cell without ``dataset`` / ``operator`` / ``pk``, a malformed ``pk``, or a
            ``pk`` that disagrees with the P_K weights the run trained with.
    """
    bench = record.benchmark_cell
    if not bench or record.status != "done" or record.variant_of:
        return None
    missing = [k for k in ("dataset", "operator", "pk") if not bench.get(k)]
    if missing:
        raise ValueError(f"{path or 'record'}: benchmark cell lacks {missing}: {dict(bench)}")
    pk = canonical_pk(parse_pk(bench["pk"]))
    weights = (record.config.get("pk") or {}).get("weights")
    if weights is not None and canonical_pk(weights) != pk:
        raise ValueError(f"{path or 'record'}: benchmark pk {bench['pk']} but the run trained with "
                         f"P_K = {list(weights)}")
    if "test/top1" not in record.metrics:
        return None
    return Run(dataset=str(bench["dataset"]), operator=str(bench["operator"]), pk=pk, seed=record.seed,
               top1=100 * float(record.metrics["test/top1"]),
               top5=100 * float(record.metrics.get("test/top5", float("nan"))), wall_s=record.wall_time_s, path=path)


def collect(paths: Iterable[str | Path], dataset: str | None = None) -> list[Run]:
    """Every finished benchmark run under ``paths`` (``results.json`` files, run archives, or folders searched
    recursively for both: :func:`diffrank.experiments.records.archive.find_records`), optionally only those of
    ``dataset``. A record read twice (the same file, or a run archived and in its folder) counts once.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a malformed benchmark cell (see :func:`run_from_record`) or run archive.
    """
    return benchmark_runs(find_records(paths), dataset)


def benchmark_runs(records: Iterable[tuple[str | Path, RunRecord]], dataset: str | None = None) -> list[Run]:
    """The finished benchmark runs among ``(path, record)`` pairs (:func:`run_from_record`), optionally only those
    of ``dataset``.

    Raises:
        ValueError: a malformed benchmark cell (see :func:`run_from_record`).
    """
    runs = []
    for f, rec in records:
        run = run_from_record(rec, str(f))
        if run and (dataset is None or run.dataset == dataset):
            runs.append(run)
    return runs


def grid(runs: Iterable[Run]) -> Grid:
    """Seed means per (operator, pk): ``{"top1", "top5"}`` in %, ``n`` runs, ``wall_s`` mean s per run (None if
    no run recorded it), ``seeds`` sorted. Two records of the same seed and cell both count (``n`` says so)."""
    by: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by.setdefault((r.operator, r.pk), []).append(r)
    out: Grid = {}
    for key, rs in by.items():
        walls = [r.wall_s for r in rs if r.wall_s is not None]
        out[key] = {"top1": mean(r.top1 for r in rs), "top5": mean(r.top5 for r in rs), "n": len(rs),
                    "wall_s": mean(walls) if walls else None,
                    "seeds": sorted(r.seed for r in rs if r.seed is not None)}
    return out


def paper_grid(rows: list[dict[str, str]] | None = None) -> Grid:
    """Petersen et al. (ICML 2022) CIFAR-100 numbers per (operator, pk) in %: Table 4 (the P_K grid) and
    Table 1 (the Softmax row and the pure top-5 rows [0,0,0,0,1]); a cell both tables print comes from Table 4.

    Args:
        rows: reference rows to use (default: the bundled ``topk_icml2022_table4`` and ``table1``).
    """
    if rows is None:
        rows = reference.load_table("topk_icml2022_table4") + reference.load_table("topk_icml2022_table1")
    out: Grid = {}
    for r in rows:
        if (r["paper"] != PAPER or r["dataset"] != "cifar100" or r["metric"] not in ("top1", "top5")
                or r["operator"] not in METHOD_ORDER):  # the smooth top-k baseline is not part of the P_K grid
            continue
        key = (r["operator"], canonical_pk(parse_pk(r["pk"])))
        cell = out.setdefault(key, {"n": int(r["n_runs"] or 0) or None, "wall_s": None, "seeds": [], "tables": []})
        if r["metric"] not in cell:  # Table 4 is read first: its value wins where both tables print a cell
            cell[r["metric"]] = float(r["value"])
            if r["table"] not in cell["tables"]:
                cell["tables"].append(r["table"])
    return out


@dataclass(frozen=True)
class Claim:
    """A qualitative ordering the paper reports; ``test(grid, operator)`` → True / False, or None when a cell
    it needs is missing. ``per_method``: evaluated for each top-k operator, else once (operator = "")."""

    name: str
    text: str
    test: Callable[[Grid, str], bool | None]
    per_method: bool = True


def _get(g: Grid, op: str, pk: str, metric: str) -> float | None:
    cell = g.get((op, pk))
    return None if cell is None or metric not in cell else float(cell[metric])


def _cmp(a: float | None, b: float | None, f: Callable[[float, float], bool]) -> bool | None:
    return None if a is None or b is None else bool(f(a, b))


def _collapse(g: Grid, op: str, pk: str, drop: float) -> bool | None:
    """top-1 at ``pk`` is more than ``drop`` points below the best of the op's [.5,…,.5] / [.25,…,.75] cells."""
    here = _get(g, op, pk, "top1")
    mixed = [v for v in (_get(g, op, HALF, "top1"), _get(g, op, QUARTER, "top1")) if v is not None]
    return None if here is None or not mixed else max(mixed) - here > drop


COLLAPSE_POINTS = 5.0  # a top-1 drop this large (% points) counts as a collapse: NeuralSort's Table 4 drop is 8.5

CLAIMS = (
    Claim("half_beats_top5_top1", "[.5,0,0,0,.5] beats [0,0,0,0,1] on top-1",
          lambda g, op: _cmp(_get(g, op, HALF, "top1"), _get(g, op, TOP5, "top1"), lambda a, b: a > b)),
    Claim("top5_loses_top1_vs_softmax", "[0,0,0,0,1] loses top-1 against softmax",
          lambda g, op: _cmp(_get(g, op, TOP5, "top1"), _get(g, *SOFTMAX, "top1"), lambda a, b: a < b)),
    Claim("collapse_at_tenth", f"[.1,0,0,0,.9] top-1 > {COLLAPSE_POINTS:g} pts below [.5,..,.5]/[.25,..,.75]",
          lambda g, op: _collapse(g, op, TENTH, COLLAPSE_POINTS)),
    Claim("uniform_ge_softmax_top1", "[.2,.2,.2,.2,.2] >= softmax on top-1",
          lambda g, op: _cmp(_get(g, op, UNIFORM, "top1"), _get(g, *SOFTMAX, "top1"), lambda a, b: a >= b)),
    Claim("best_topk_ge_softmax_top5", "top-k (best mixed P_K) >= softmax on top-5",
          lambda g, op: _cmp(max((v for v in (_get(g, op, p, "top5") for p in (HALF, QUARTER, TENTH, UNIFORM))
                                  if v is not None), default=None), _get(g, *SOFTMAX, "top5"),
                             lambda a, b: a >= b)),
    Claim("neuralsort_collapses_at_tenth", "NeuralSort collapses at [.1,0,0,0,.9], DiffSortNets does not",
          lambda g, op: (None if _collapse(g, "neuralsort", TENTH, COLLAPSE_POINTS) is None
                         or _collapse(g, "dsn", TENTH, COLLAPSE_POINTS) is None
                         else bool(_collapse(g, "neuralsort", TENTH, COLLAPSE_POINTS)
                                   and not _collapse(g, "dsn", TENTH, COLLAPSE_POINTS))),
          per_method=False),
)


def _methods(ours: Grid, paper: Grid) -> list[str]:
    """The operators to show: ours (softmax first, then the paper's order, then others by name); the paper's
    when we have no run."""
    have = {k[0] for k in (ours or paper)}
    return [op for op in METHOD_ORDER if op in have] + sorted(have - set(METHOD_ORDER))


def check_orderings(ours: Grid, paper: Grid, claims: tuple[Claim, ...] = CLAIMS) -> list[dict[str, Any]]:
    """Every claim on the paper's grid and on ours: ``[{"claim", "text", "method", "paper", "ours"}]`` with
    True / False / None (a needed cell missing). Per-method claims are listed for each top-k operator of ours
    (of the paper's grid when ours is empty; softmax excluded)."""
    ops = [op for op in _methods(ours, paper) if op != SOFTMAX[0]]
    out = []
    for c in claims:
        for op in (ops if c.per_method else [""]):
            out.append({"claim": c.name, "text": c.text, "method": METHOD_NAMES.get(op, op),
                        "paper": c.test(paper, op), "ours": c.test(ours, op)})
    return out


def _cell(g: Grid, key: tuple[str, str]) -> str:
    c = g.get(key)
    if not c or "top1" not in c:
        return "—"
    return f"{c['top1']:.2f} / {c.get('top5', float('nan')):.2f}"


def _table(title: str, g: Grid, ops: list[str], pks: list[str]) -> list[str]:
    width = 16
    lines = [title, "P_K".ljust(18) + "".join(METHOD_NAMES.get(op, op).rjust(width) for op in ops)]
    for pk in pks:
        lines.append(pk.ljust(18) + "".join(_cell(g, (op, pk)).rjust(width) for op in ops))
    return lines


def format_report(ours: Grid, paper: Grid | None = None, dataset: str = "") -> str:
    """The report as text: our grid (top-1 / top-5 %, seed means), the per-cell run count and wall time, the
    paper's CIFAR-100 grid (labelled a different dataset) and the orderings."""
    paper = paper_grid() if paper is None else paper
    ops = _methods(ours, paper)
    pks = [pk for pk in PK_ORDER if any(k[1] == pk for k in (*ours, *paper))]
    pks += sorted({k[1] for k in (*ours, *paper)} - set(PK_ORDER))
    name = dataset or "this benchmark"
    lines = _table(f"ours ({name}): test top-1 / top-5 %, mean over seeds", ours, ops, pks)
    lines += ["", f"runs per cell and wall time per run ({name})",
              "P_K".ljust(18) + "".join(METHOD_NAMES.get(op, op).rjust(16) for op in ops)]
    for pk in pks:
        cells = []
        for op in ops:
            c = ours.get((op, pk))
            cells.append("—" if not c else f"{c['n']}x {c['wall_s']:.0f}s" if c.get("wall_s") is not None
                         else f"{c['n']}x")
        lines.append(pk.ljust(18) + "".join(s.rjust(16) for s in cells))
    lines += [""] + _table("paper (DIFFERENT DATASET: CIFAR-100, ResNet-18; Petersen et al. ICML 2022 Table 4, "
                           "Softmax and [0,0,0,0,1] rows from Table 1) top-1 / top-5 %, for orientation only",
                           paper, ops, pks)
    mark = {True: "holds", False: "fails", None: "n/a"}
    lines += ["", "the paper's orderings (paper = its CIFAR-100 numbers; ours = this benchmark)",
              "claim".ljust(70) + "method".ljust(14) + "paper".ljust(8) + "ours"]
    for r in check_orderings(ours, paper):
        lines.append(r["text"][:69].ljust(70) + (r["method"] or "-").ljust(14) + mark[r["paper"]].ljust(8)
                     + mark[r["ours"]])
    return "\n".join(lines)


def reports(records: Iterable[tuple[str | Path, RunRecord]]) -> dict[str, str]:
    """One :func:`format_report` text per benchmark dataset among ``(path, record)`` pairs (``{}`` when there is
    none): the hook for :func:`diffrank.experiments.analysis.report.write_report`, which reads the records once for
    all its sections (:func:`diffrank.experiments.records.archive.find_records`), and :func:`main`.

    Raises:
        ValueError: a malformed benchmark cell (see :func:`run_from_record`).
    """
    runs = benchmark_runs(records)
    return {ds: format_report(grid([r for r in runs if r.dataset == ds]), dataset=ds)
            for ds in sorted({r.dataset for r in runs})}


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Command line (``python -m diffrank.experiments.analysis.report_pk RUN_DIR... [--out DIR]``); returns
    ``{dataset: text}``.

    Raises:
        SystemExit: status 1 with ``error: <why>`` for a missing path, a malformed archive or a file that cannot be
            written; with a message when no benchmark run is under the given paths.
    """
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.analysis.report_pk", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run or sweep folders (searched recursively for results.json)")
    ap.add_argument("--out", default=None, help="also write pk_<dataset>.md into this folder")
    a = ap.parse_args(argv)
    try:
        texts = reports(find_records(a.paths))
    except (OSError, ValueError) as e:  # FileNotFoundError included
        raise SystemExit(f"error: {e}") from None
    if not texts:
        raise SystemExit(f"no finished benchmark run (results.json whose paper key has a 'benchmark' field) "
                         f"under {a.paths}")
    for ds, text in texts.items():
        print(text, end="\n\n")
        if a.out:
            path = Path(a.out) / f"pk_{ds}.md"
            try:
                write_atomic(path, f"# P_K x method: {ds}\n\n```\n{text}\n```\n")
            except OSError as e:
                raise SystemExit(f"error: cannot write {path}: {e.strerror or e}") from None
    return texts


__all__ = ["CLAIMS", "Claim", "Run", "benchmark_runs", "canonical_pk", "check_orderings", "collect", "format_report",
           "grid", "main", "paper_grid", "parse_pk", "reports", "run_from_record"]


if __name__ == "__main__":
    main()
