"""The report's section of runs of no paper row (:mod:`diffrank.experiments.analysis.report`): one line per
command, machine, budget and metric with each run's value, their mean ± std, the date, the machine and the record
read; a record no table can take is listed with the reason (:func:`other_runs` collects, :func:`other_rows`
tabulates).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diffrank.experiments.records.record import RunRecord

# the config groups a run of no paper row is described by (its record's ``choices``), in this order
CONFIG_CHOICES = ("experiment", "data", "net", "loss", "operator", "pk", "newton")
# metrics recorded as fractions (accuracies, exact matches): shown in % like the papers' tables
PERCENT_METRICS = ("top", "em", "ew", "acc")
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
