"""Loggers: Lightning's CSV logger with a header that survives several processes writing one file, and W&B
runs that sit beside the paper's tables (offline by default, grouped by paper table or sweep, the paper row /
ours / Δ as summary values and a table).

Under ``strategy=ddp_spawn`` fit and test run in different spawned processes, each with a fresh copy of
the writer that does not know the columns the other one wrote; Lightning's writer then rewrites the file
with only its own columns and fails ("dict contains fields not in fieldnames"). This writer first takes
the columns already in the file.
"""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as _CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter as _ExperimentWriter
from lightning.pytorch.loggers.wandb import WandbLogger as _WandbLogger

log = logging.getLogger(__name__)


class _MergingExperimentWriter(_ExperimentWriter):
    def _record_new_keys(self) -> set[str]:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                header = next(csv.reader(f), [])
            missing = [k for k in header if k not in self.metrics_keys]
            self.metrics_keys.extend(missing)
        return super()._record_new_keys()


class CSVLogger(_CSVLogger):
    """:class:`lightning.pytorch.loggers.CSVLogger` whose ``metrics.csv`` keeps every column across processes.

    Same arguments as Lightning's ``CSVLogger`` (``save_dir``, ``name``, ``version``, ``prefix``, …).
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> _ExperimentWriter:
        """The writer (created on first use, rank zero only)."""
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _MergingExperimentWriter(log_dir=self.log_dir)
        return self._experiment


# --------------------------------------------------------------------------------------------------------------
# W&B: offline unless an API key is configured; group = the paper table or the sweep; the paper comparison as
# summary values and a table.


def wandb_api_key_configured() -> bool:
    """Whether W&B can authenticate without asking: ``WANDB_API_KEY`` set, or a ``~/.netrc`` (``$NETRC``) entry
    for ``api.wandb.ai``. Reads no network."""
    import netrc
    import os
    from pathlib import Path

    if os.environ.get("WANDB_API_KEY"):
        return True
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return netrc.netrc(str(path)).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_offline_default(offline: bool | None) -> bool:
    """``offline`` as given; when None (the config's default): offline unless ``WANDB_MODE`` is set (then
    W&B follows it) or an API key is configured (:func:`wandb_api_key_configured`)."""
    import os

    if offline is not None:
        return bool(offline)
    if os.environ.get("WANDB_MODE"):
        return False
    return not wandb_api_key_configured()


class WandbLogger(_WandbLogger):
    """Lightning's :class:`~lightning.pytorch.loggers.WandbLogger`, offline by default without an API key.

    Args:
        offline: True / False, or None (default): :func:`wandb_offline_default`.
        *args, **kwargs: Lightning's ``WandbLogger`` arguments (``project``, ``group``, ``tags``, ``save_dir``,
            …; extra keywords go to ``wandb.init``).
    """

    def __init__(self, *args: Any, offline: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, offline=wandb_offline_default(offline), **kwargs)


def wandb_group(paper: Any, sweep_name: str | None, task_name: str | None) -> str:
    """The W&B group of a run: its paper table (``"<paper> Table <table>"``) when it reproduces a table row,
    else the sweep (``"<task_name>/<sweep folder>"``) for a multirun job, else ``task_name``."""
    if isinstance(paper, dict) and paper.get("paper") and paper.get("table") is not None:
        return f"{paper['paper']} Table {paper['table']}"
    if sweep_name:
        return f"{task_name or 'train'}/{sweep_name}"
    return str(task_name or "train")


def wandb_tags(cfg: Any, choices: dict[str, Any], extra: list[str] | None = None) -> list[str]:
    """Tags ``operator:<name>``, ``pk:<name>``, ``m:<m>``, ``beta:<β>``, ``dataset:<data>`` (those that apply),
    then ``extra`` (the config's ``tags``, the sweep). ``cfg`` is the composed run config (dict-like)."""
    def get(path: str) -> Any:
        """The config value at a dotted ``path`` (None where a part is missing)."""
        node = cfg
        for part in path.split("."):
            node = node.get(part) if hasattr(node, "get") else None
            if node is None:
                return None
        return node

    tags = []
    for name, value in (("operator", choices.get("operator")), ("pk", choices.get("pk")), ("m", get("loss.m")),
                        ("beta", get("operator.beta")), ("dataset", choices.get("data"))):
        if value is not None:
            tags.append(f"{name}:{value}")
    tags += [str(t) for t in (extra or [])]
    return [t[:64] for t in dict.fromkeys(tags)]  # W&B limits tags to 64 characters


def paper_comparison(record: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[list[str]]]:
    """The run's rows of the paper comparison (:func:`diffrank.experiments.records.matching.collect_runs` on its own
    record).

    Returns:
        ``(summary, header, cells)``: ``summary`` maps ``paper/<metric>``, ``ours/<metric>``, ``delta/<metric>``
        (in the reference table's unit, % for accuracies; Δ = ours − paper) and ``paper/row`` (the row's key);
        ``header`` / ``cells`` are the table that ``compare_to_paper`` prints. All empty for a run without a
        ``paper`` key (or one that matches no reference row).
    """
    from diffrank.experiments.records.matching import collect_runs
    from diffrank.experiments.records.record import RECORD_FILE, RunRecord
    from diffrank.experiments.records.table_cells import table_rows

    rec = RunRecord.from_dict(record)
    result = collect_runs([(Path(rec.run_dir or ".") / RECORD_FILE, rec)])
    summary: dict[str, Any] = {}
    header: list[str] = []
    cells: list[list[str]] = []
    for (paper, table), lines in result["tables"].items():
        h, c = table_rows(lines)
        if not header:
            header = ["reference", "table", *h]
        if h == header[2:]:
            cells += [[paper, table, *row] for row in c]
        for ln in lines:
            summary[f"paper/{ln['metric']}"] = ln["paper"]
            if ln["runs"]:
                summary[f"ours/{ln['metric']}"] = ln["mean"]
                summary[f"delta/{ln['metric']}"] = ln["delta"]
    if summary:
        summary["paper/row"] = json.dumps(record.get("paper"), sort_keys=True)
    return summary, header, cells


def log_paper_comparison(run: Any, record: dict[str, Any]) -> dict[str, Any]:
    """Write the run's paper row, ours and Δ into a W&B run's summary and log them as the table
    ``paper_comparison`` (:func:`paper_comparison`); returns the summary values (empty: nothing logged)."""
    import wandb

    summary, header, cells = paper_comparison(record)
    if not summary:
        return {}
    for k, v in summary.items():
        run.summary[k] = v
    if cells:
        run.log({"paper_comparison": wandb.Table(columns=header, data=cells)})
    return summary


def log_paper_comparisons(loggers: list[Any], record: dict[str, Any]) -> None:
    """:func:`log_paper_comparison` of ``record`` (a ``results.json`` record) into every W&B logger's run among
    ``loggers``; the summary values logged are logged here too."""
    for lg in loggers:
        if isinstance(lg, _WandbLogger):
            summary = log_paper_comparison(lg.experiment, record)
            if summary:
                log.info("W&B summary: %s", ", ".join(f"{k}={v}" for k, v in summary.items() if "/row" not in k))


def finish_wandb() -> None:
    """``wandb.finish()`` whenever a W&B run is open (also after an exception): the next multirun job must get
    its own run, not attach to this one. Never imports wandb: a process that has not imported it has no W&B run
    (and a signal that cut its import short left a half-initialised module, on which an ``import wandb`` fails with
    a circular-import ``AttributeError`` that would replace the run's own error); a failing ``finish`` is logged."""
    wandb = sys.modules.get("wandb")
    if getattr(wandb, "run", None) is None:
        return
    try:
        wandb.finish()
    except Exception:
        log.warning("could not finish the W&B run", exc_info=True)
