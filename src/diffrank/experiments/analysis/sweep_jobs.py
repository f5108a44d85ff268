"""The jobs of a Hydra sweep folder read for its summary (:mod:`diffrank.experiments.analysis.sweep_summary`): one
row per job (status, overrides, final metrics from ``results.json``), the swept keys, and the best configuration by
the seed-mean of the optimised metric.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from diffrank.experiments.records.record import RECORD_FILE, RunRecord

# keys averaged over (the band of the plot, the mean of the best configuration), never a line or an answer
SEED_KEYS = ("seed",)


def parse_value(text: str) -> Any:
    """An override value as Hydra's command line writes it: int, float, bool, None, or the string itself."""
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (int, float, bool, str)) or v is None else text


def split_override(line: str) -> tuple[str, str] | None:
    """``"+a.b=3"`` → ``("a.b", "3")``; None for a deletion without value (``~a.b``)."""
    if "=" not in line:
        return None
    key, value = line.split("=", 1)
    return key.lstrip("+~"), value


def _natural(path: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def job_dirs(sweep_dir: str | Path) -> list[Path]:
    """The job folders of a sweep: folders holding ``.hydra/overrides.yaml`` or ``results.json`` (not the sweep
    folder itself), in natural order (``2`` before ``10``).

    Raises:
        FileNotFoundError: ``sweep_dir`` is not a folder.
    """
    root = Path(sweep_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no such sweep folder: {root}")
    found = {p.parent.parent for p in root.rglob(".hydra/overrides.yaml")}
    found |= {p.parent for p in root.rglob(RECORD_FILE)}
    found.discard(root)
    # a folder inside another job (e.g. wandb/, csv/) is never a job of its own
    jobs = sorted(found, key=lambda p: _natural(p.relative_to(root).as_posix()))
    return [j for j in jobs if not any(o != j and o in j.parents for o in jobs)]


def job_row(job: Path) -> dict[str, Any]:
    """One job as a row: ``job`` (folder), ``status``, ``overrides`` (list), ``metrics`` (dict), ``wall_time_s``,
    ``optimizer_steps``, ``world_size``, ``global_batch``, ``optimized_metric`` / ``optimized_mode`` (from the
    run's config) and ``error`` (a failed run's message).

    Status: ``done`` (a complete ``results.json``), ``failed`` (the run wrote a failure record) or ``incomplete``
    (no ``results.json``: killed, still running, or failed before writing).
    """
    rec = RunRecord.read(job / RECORD_FILE)
    overrides: list[str] = []
    ov_file = job / ".hydra" / "overrides.yaml"
    if ov_file.is_file():
        overrides = [str(o) for o in (yaml.safe_load(ov_file.read_text()) or [])]
    row: dict[str, Any] = {"job": job, "status": "incomplete", "overrides": overrides, "metrics": {},
                           "wall_time_s": None, "optimizer_steps": None, "world_size": None, "global_batch": None,
                           "optimized_metric": None, "optimized_mode": None, "error": None}
    if rec is None:
        return row
    if rec.overrides:
        row["overrides"] = rec.overrides
    row.update(
        status=rec.status,
        metrics={k: v for k, v in rec.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
        wall_time_s=rec.wall_time_s, optimizer_steps=rec.optimizer_steps, world_size=rec.world_size,
        global_batch=rec.global_batch, optimized_metric=rec.optimized_metric,
        optimized_mode=rec.optimized_mode, error=rec.error,
    )
    return row


def swept_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Override keys whose value differs between jobs (or that only some jobs set), in first-seen order."""
    values: dict[str, set[str]] = defaultdict(set)
    order: list[str] = []
    for r in rows:
        for o in r["overrides"]:
            kv = split_override(o)
            if kv is None:
                continue
            if kv[0] not in values:
                order.append(kv[0])
            values[kv[0]].add(kv[1])
    return [k for k in order if len(values[k]) > 1 or any(k not in _overrides(r) for r in rows)]


def _overrides(row: dict[str, Any]) -> dict[str, Any]:
    return {kv[0]: parse_value(kv[1]) for o in row["overrides"] if (kv := split_override(o))}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _resolve_metric(rows: list[dict[str, Any]], metric: str | None, mode: str | None) -> tuple[str | None, str]:
    if metric is None:
        metric = next((r["optimized_metric"] for r in rows if r["optimized_metric"]), None)
    if mode is None:
        mode = next((r["optimized_mode"] for r in rows if r["optimized_mode"]), None) or "max"
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    return metric, mode


def best_configs(rows: list[dict[str, Any]], keys: list[str], metric: str, mode: str) -> dict[str, Any] | None:
    """The best configuration by the mean of ``metric`` over the seeds (:data:`SEED_KEYS`) of each configuration.

    Args:
        rows: :func:`job_row` rows; only ``done`` jobs that logged ``metric`` count.
        keys: the swept keys (:func:`swept_keys`).
        metric: e.g. ``val/em5``; mode: ``max`` or ``min``.

    Returns:
        None when no job counts; else ``{"metric", "mode", "best": config, "by": {key: {value: config}}}``, a
        config being ``{"overrides": {key: value}, "mean", "std" (None for one seed), "n", "jobs"}``; ``by`` holds
        the best configuration per value of the first categorical swept key (e.g. the best β per operator).
    """
    config_keys = [k for k in keys if k not in SEED_KEYS]
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["status"] == "done" and _is_number(r["metrics"].get(metric)):
            ov = _overrides(r)
            groups[tuple((k, ov.get(k)) for k in config_keys)].append(r)
    if not groups:
        return None

    def summary(key: tuple, members: list[dict[str, Any]]) -> dict[str, Any]:
        """Mean, spread and count of ``metric`` over the seeds of one configuration."""
        vals = [float(m["metrics"][metric]) for m in members]
        return {"overrides": dict(key), "mean": statistics.fmean(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else None, "n": len(vals),
                "jobs": [m["job"].name for m in members]}

    configs = [summary(k, v) for k, v in groups.items()]
    pick = max if mode == "max" else min
    out: dict[str, Any] = {"metric": metric, "mode": mode, "best": pick(configs, key=lambda c: c["mean"]), "by": {}}
    categorical = [k for k in config_keys if not all(_is_number(c["overrides"].get(k)) for c in configs)]
    if categorical:
        cat = categorical[0]
        per: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for c in configs:
            per[c["overrides"].get(cat)].append(c)
        out["by"] = {cat: {str(v): pick(cs, key=lambda c: c["mean"]) for v, cs in per.items()}}
    return out
