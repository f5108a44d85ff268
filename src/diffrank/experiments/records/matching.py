"""The match of run records to the papers' tables: which reference row (:mod:`diffrank.reference`) a record
belongs to (:attr:`~diffrank.experiments.records.record.RunRecord.table_row`), which runs pool as seeds of one row,
paper / ours / Δ per row, and Welch's test against a Regular row. The rows as printed cells are
:mod:`diffrank.experiments.records.table_cells`.

It sits with the records (below both the run and the analysis): a run logs its own row of the comparison at its end
(:func:`diffrank.experiments.callbacks.loggers.paper_comparison`), and :mod:`diffrank.experiments.analysis.report`
renders every row of every table afterwards.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diffrank import reference
from diffrank.experiments.records.archive import find_records
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.records.significance import significance
from diffrank.experiments.records.table_cells import LABEL_COLUMNS

# statuses of runs that did not finish: never pooled with finished ones (nor is any other status but "done": a
# record's status edited by hand, misspelt or missing is no result either)
NOT_RESULTS = ("diverged", "interrupted", "failed")


def _key(paper: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), reference._norm(v)) for k, v in paper.items()))


def is_fraction(row: dict[str, str]) -> bool:
    """Whether a reference row is printed as a fraction (its ``note`` says ``fraction`` and not ``x100``): our
    value is then shown as a fraction too, else in %."""
    note = row.get("note", "").lower()
    return "fraction" in note and "x100" not in note and "×100" not in note


def collect(paths: Iterable[str | Path], metric_prefix: str = "test/") -> dict[str, Any]:
    """Match every run record under ``paths`` (``results.json`` files, folders searched recursively, and run
    archives: :func:`diffrank.experiments.records.archive.find_records`) to the reference rows (:func:`collect_runs` on
    the records, copied baselines included).

    Returns:
        ``{"tables": {(paper, table): [line, ...]}, "unmatched": [(path, paper_key)], "skipped": int,
        "runs": int}``; a line is a dict with the reference row, ``ours`` (list of values in the row's
        unit), ``mean``, ``std`` (None for one run), ``delta``, ``runs``, ``budget`` and ``run_dirs``.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a malformed run archive.
    """
    return collect_runs(find_records(paths), metric_prefix, copies=True)


def collect_runs(records: Iterable[tuple[str | Path, RunRecord]], metric_prefix: str = "test/",
                 copies: bool = False) -> dict[str, Any]:
    """Match run records to the reference rows (what :func:`collect` does after reading the files; a finishing
    run calls it on its own record to log the comparison to W&B).

    Only finished runs (``status`` ``"done"``) count: diverged, interrupted and failed runs (:data:`NOT_RESULTS`),
    and any other status (``"incomplete"``, a status missing or misspelt), are listed under ``not_done``. A run
    that cannot be told apart from its line's others is left out, named under ``left_out`` (and on stderr): a
    record without its ``config`` among records with one (its β, config hash and seed cannot be checked), and a
    run without ``operator.beta`` among runs with one (:func:`select_beta` would count it as another β).
    Runs are pooled (as seeds) when they share the reference row (:attr:`RunRecord.table_row`), the command-line
    changes to the row's config (:attr:`~RunRecord.variant`: a run with another learning rate is a variant of the
    row, never the row), the data (:attr:`~RunRecord.data_kind`: generated or swapped-in data never pools with the
    row's), the budget (:attr:`~RunRecord.budget`: a short check of a row is not one of its seeds), the Newton loss's λ
    (:attr:`~RunRecord.tikhonov`) and the kind of device (:attr:`~RunRecord.device_kind`: a seed run on two devices
    is one seed twice, same initialisation and data order); and each (config, seed) once
    (:attr:`~RunRecord.pool_key`: of two runs of the same config and seed, the later is kept, the other counted
    under ``duplicates``). A line whose runs ran different code versions lists them (``codes``).

    Args:
        records: ``(path of the results.json, record)`` pairs.
        metric_prefix: our metric for a reference metric ``M`` is ``<prefix><m>``, m = M lower-cased.
        copies: also show the tables that reprint a matched row (:func:`copy_lines`; the report does, a run's own
            W&B comparison does not).

    Returns:
        The same dict as :func:`collect`, with ``not_done`` (``[(path, status)]``) and ``left_out``
        (``[(path, reason)]``); a line also has ``variant``,
        ``codes`` (the code versions of its runs) and ``duplicates``; a copied row's line has ``copy_of``
        (``"<paper> Table <table>"``).
    """
    groups, not_done, skipped = _pool(records)
    runs = sum(len(members) for members in groups.values())
    tables: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    unmatched, left_out = [], []
    for (key, data, budget, tikhonov, device, variant), members in groups.items():
        members, unknown = _without_unknowns(members)
        left_out += unknown
        members, duplicates = _one_per_config(members)
        try:
            rows = reference.match(dict(key))
        except KeyError:
            rows = []
        if not rows:
            unmatched.append((str(members[0][0]), dict(key)))
            continue
        members, selected = select_beta(members)
        for row in rows:
            tables[(row["paper"], row["table"])].append({
                **_line(row, members, metric_prefix), "budget": budget, "tikhonov": tikhonov, "device": device,
                "run_dirs": [str(p.parent) for p, _ in members], "selected": selected,
                "data": data, "variant": variant, "duplicates": duplicates,
                "codes": sorted({r.code for _, r in members}),
            })
    _complete(tables, copies)
    for path, why in left_out:
        print(f"warning: {path}: {why}; left out of its line", file=sys.stderr)
    return {"tables": dict(sorted(tables.items())), "unmatched": unmatched, "skipped": skipped,
            "runs": runs - len(left_out), "not_done": not_done, "left_out": left_out}


def _complete(tables: dict[tuple[str, str], list[dict[str, Any]]], copies: bool) -> None:
    """Add to ``tables`` (in place) the copied rows (when ``copies``) and the reference rows no run matched, sort
    each table's lines by their label columns and compare them with Regular (:func:`significance`)."""
    if copies:
        for key, lines in copy_lines(tables).items():
            tables[key].extend(lines)
    for (paper, table), lines in tables.items():
        lines.extend(_reference_only(paper, table, lines))
    for lines in tables.values():
        lines.sort(key=lambda ln: tuple(_sort_value(ln["row"].get(c, "")) for c in (*LABEL_COLUMNS, "metric")))
        significance(lines)


def _pool(records: Iterable[tuple[str | Path, RunRecord]]) -> tuple[dict[tuple, list[tuple[Path, RunRecord]]],
                                                                    list[tuple[str, str]], int]:
    """The finished runs of a paper row grouped by what may pool as seeds (row, data, budget, λ, device, variant);
    returns ``(groups, not_done, skipped)``: the runs that did not finish (``[(path, status)]``) and the number of
    records of no paper row."""
    groups: dict[tuple, list[tuple[Path, RunRecord]]] = defaultdict(list)
    not_done, skipped = [], 0
    for path, rec in records:
        row = rec.table_row
        if row is None:  # no paper key, an older variant run, or a benchmark cell (report_pk's)
            skipped += 1
            continue
        if rec.status != "done":  # a diverged, interrupted or failed run is no result; nor is an unknown status
            not_done.append((str(path), str(rec.status)))
            continue
        groups[(_key(row), rec.data_kind, rec.budget, rec.tikhonov, rec.device_kind, rec.variant)].append(
            (Path(path), rec))
    return groups, not_done, skipped


def _line(row: dict[str, str], members: list[tuple[Path, RunRecord]], metric_prefix: str) -> dict[str, Any]:
    """Paper / ours / Δ of one reference ``row`` over the pooled runs ``members`` (ours in the row's unit)."""
    name = metric_prefix + row["metric"].lower()
    scale = 1.0 if is_fraction(row) else 100.0
    ours = [scale * v for v in (_metric(path, r, name) for path, r in members) if v is not None]
    try:
        paper_value = float(row["value"])
    except ValueError:
        paper_value = math.nan
    mean = statistics.fmean(ours) if ours else math.nan
    return {"row": row, "metric": row["metric"], "paper": paper_value, "ours": ours, "mean": mean,
            "std": statistics.stdev(ours) if len(ours) > 1 else None,
            "delta": mean - paper_value if ours else math.nan, "runs": len(ours)}


def _without_unknowns(members: list[tuple[Path, RunRecord]]) -> tuple[list[tuple[Path, RunRecord]],
                                                                      list[tuple[str, str]]]:
    """The runs of one line that can be told apart, and ``(path, reason)`` for those left out: a record without
    its ``config`` when another has one (nothing says its β, config hash or seed: it would be pooled as another
    run, or counted as another β), then a run without ``operator.beta`` when another has one."""
    left: list[tuple[str, str]] = []
    if any(r.config for _, r in members) and not all(r.config for _, r in members):
        left += [(str(p), "no config recorded (its β, settings and seed cannot be checked against its line's "
                          "other runs)") for p, r in members if not r.config]
        members = [(p, r) for p, r in members if r.config]
    if any(r.beta is not None for _, r in members) and any(r.beta is None for _, r in members):
        left += [(str(p), "no numeric operator.beta in its config (its line's other runs have one)")
                 for p, r in members if r.beta is None]
        members = [(p, r) for p, r in members if r.beta is not None]
    return members, left


def _one_per_config(members: list[tuple[Path, RunRecord]]) -> tuple[list[tuple[Path, RunRecord]], int]:
    """One run per (config, seed) (:attr:`RunRecord.pool_key`): the latest by ``finished_at``; and how many were
    left out (a re-run of the same seed is not a second seed)."""
    latest: dict[Any, tuple[Path, RunRecord]] = {}
    for path, rec in members:
        key = rec.pool_key or ("path", str(path))
        if key not in latest or (rec.finished_at or "") >= (latest[key][1].finished_at or ""):
            latest[key] = (path, rec)
    return list(latest.values()), len(members) - len(latest)


def _metric(path: str | Path, rec: RunRecord, name: str) -> float | None:
    """``rec``'s metric ``name`` as a float; None when absent, or (with a warning naming the file) not a number."""
    value = rec.metrics.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        print(f"warning: {path}: metric {name} = {value!r} is not a number; left out", file=sys.stderr)
        return None
    return float(value)


def select_beta(members: list[tuple[Path, RunRecord]]) -> tuple[list[tuple[Path, RunRecord]], str | None]:
    """The runs of one paper key at the selected temperature when they span several ``operator.beta``
    (:attr:`RunRecord.beta`): the β whose runs have the best mean validation score (:attr:`RunRecord.val_score`;
    NaN-free runs only; on ties the smaller β). One β (or none): all runs, no selection.

    Returns:
        ``(runs kept, "β=<value> (best val of <k> β)" or None)``.
    """
    betas = {r.beta for _, r in members}
    if len(betas) < 2:
        return members, None
    scores = {}
    for beta in betas:
        vals = [r.val_score for _, r in members if r.beta == beta]
        vals = [v for v in vals if not math.isnan(v)]
        scores[beta] = statistics.fmean(vals) if vals else -math.inf
    best = max(sorted(betas, key=lambda b: (b is None, b or 0.0)), key=lambda b: scores[b])
    return [(p, r) for p, r in members if r.beta == best], f"β={best:g} (best val of {len(betas)} β)"


def _ident(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(row.get(c, "") for c in reference.COLUMNS)


def copy_lines(tables: dict[tuple[str, str], list[dict[str, Any]]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Lines for the copied reference rows (``copy_of=`` in ``setting``) of every table that has lines already or
    whose originals have: each copy gets its original's runs (one line per group of the original: budget,
    data), Δ against the copy's printed value, and ``copy_of``; a copy whose original has no runs, and the
    table's own rows without runs, are shown with ours empty (the whole published table, ours beside it).

    Args:
        tables: :func:`collect_runs`' lines so far, ``{(paper, table): [line, ...]}`` (not modified).

    Returns:
        ``{(paper, table): [new line, ...]}`` for the copying tables to show.
    """
    originals: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for lines in tables.values():
        for ln in lines:
            if ln["runs"] and not ln.get("copy_of"):
                originals[_ident(ln["row"])].append(ln)
    pairs: dict[tuple[str, str], list[tuple[dict[str, str], dict[str, str] | None]]] = defaultdict(list)
    for row in reference.all_rows():
        pairs[(row["paper"], row["table"])].append((row, reference.copy_source(row)))
    pairs = {key: members for key, members in pairs.items() if any(src for _, src in members)}
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, members in pairs.items():
        if key not in tables and not any(originals.get(_ident(src)) for _, src in members if src):
            continue  # nothing of this table was run
        shown = {_ident(ln["row"]) for ln in tables.get(key, [])}
        new = []
        for row, src in members:
            if src is None:  # the table's own row: shown (ours empty) when no run of it is
                if _ident(row) not in shown:
                    new += _reference_only_line(row)
                continue
            try:
                value = float(row["value"])
            except ValueError:  # a cell lost in the text: shown as —
                value = math.nan
            label = f"{src['paper']} Table {src['table']}"
            for orig in originals.get(_ident(src)) or [None]:
                ours = list(orig["ours"]) if orig else []
                mean = statistics.fmean(ours) if ours else math.nan
                new.append({"row": row, "metric": row["metric"], "paper": value, "ours": ours, "mean": mean,
                            "std": orig["std"] if orig else None, "delta": mean - value if ours else math.nan,
                            "runs": len(ours), "budget": orig["budget"] if orig else "",
                            "run_dirs": list(orig["run_dirs"]) if orig else [],
                            "selected": orig["selected"] if orig else None,
                            "data": orig.get("data", "") if orig else "", "copy_of": label,
                            "device": orig.get("device", "") if orig else ""})
        out[key] = new
    return out


def _reference_only_line(row: dict[str, str]) -> list[dict[str, Any]]:
    try:
        value = float(row["value"])
    except ValueError:
        value = math.nan
    return [{"row": row, "metric": row["metric"], "paper": value, "ours": [], "mean": math.nan, "std": None,
             "delta": math.nan, "runs": 0, "budget": "", "run_dirs": [], "selected": None}]


def _reference_only(paper: str, table: str, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lines for the published rows of (paper, table) that no run can have (``method`` ``literature``)."""
    shown = {tuple(ln["row"].get(c) for c in reference.COLUMNS) for ln in lines}
    out = []
    for row in reference.all_rows():
        if row["paper"] == paper and row["table"] == table and row["method"] == "literature" \
                and tuple(row.get(c) for c in reference.COLUMNS) not in shown:
            try:
                value = float(row["value"])
            except ValueError:
                value = math.nan
            out.append({"row": row, "metric": row["metric"], "paper": value, "ours": [], "mean": math.nan,
                        "std": None, "delta": math.nan, "runs": 0, "budget": "", "run_dirs": [], "selected": None})
    return out


def _sort_value(v: str) -> tuple[int, float, str]:
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)
