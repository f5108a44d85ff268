"""The process of a run: which Hydra job it is (:func:`hydra_job`) and whether it is the run's main process; the
process-wide settings of a script run (``python train.py``: warnings, the allocator of CPU runs, and the smoke
budget, ``DIFFRANK_SMOKE=1``, under which the documentation's commands are tested as typed); and what it prints
at the end (:func:`print_summary`). How a run stops is :mod:`diffrank.experiments.run.stops`."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, open_dict

from diffrank.experiments.callbacks.job_env import SMOKE_ENV, smoke_budget
from diffrank.experiments.run.malloc import keep_freed_memory

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class HydraJob:
    """What Hydra says of the job this process runs: the config group choices (``hydra/*`` left out), the task
    overrides, the run folder, and for a multirun job its sweep folder. Outside Hydra (a test composing a config):
    no choices, no overrides, no folders."""

    choices: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    run_dir: str | None = None
    multirun: bool = False
    sweep_dir: str | None = None


def hydra_job() -> HydraJob:
    """The :class:`HydraJob` of this process (``HydraConfig``; an empty one when Hydra is not running)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return HydraJob()
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    return HydraJob(choices={k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")},
                    overrides=list(hc.overrides.task), run_dir=hc.runtime.output_dir, multirun=multirun,
                    sweep_dir=str(hc.sweep.dir) if multirun else None)


def main_process() -> bool:
    """Whether this process is the run's main one (rank 0 of node 0: it owns the folder's lock and record)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def output_dir(cfg: DictConfig) -> str | None:
    """The run's folder, ``paths.output_dir`` (None when the config has no ``paths`` or leaves it empty)."""
    return cfg.paths.get("output_dir") if cfg.get("paths") else None


#: what the smoke budget switch (:data:`~diffrank.experiments.callbacks.job_env.SMOKE_ENV`) sets in ``trainer``
#: (Lightning's arguments)
SMOKE_TRAINER = {"max_epochs": 1, "min_epochs": 1, "max_steps": 2, "limit_train_batches": 2,
                 "limit_val_batches": 2, "limit_test_batches": 2, "val_check_interval": None,
                 "check_val_every_n_epoch": 1, "num_sanity_val_steps": 0, "log_every_n_steps": 1}


def apply_smoke_budget(cfg: DictConfig) -> bool:
    """Under ``DIFFRANK_SMOKE=1``, cap ``cfg.trainer`` in place at :data:`SMOKE_TRAINER` (one epoch of at most two
    batches, two validation and two test batches): the record's config then says what ran, and its ``budget`` says
    why. A no-op otherwise.

    Returns:
        Whether the budget was capped.
    """
    if not smoke_budget() or cfg.get("trainer") is None:
        return False
    with open_dict(cfg.trainer):
        for key, value in SMOKE_TRAINER.items():
            cfg.trainer[key] = value
    log.info("%s=1: smoke budget, trainer capped at %s", SMOKE_ENV, SMOKE_TRAINER)
    return True


def _runs_on_cpu(trainer_cfg: DictConfig) -> bool:
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def apply_process_settings(cfg: DictConfig) -> dict[str, bool]:
    """Process-wide settings of a script run (never applied by :func:`train`, which is a library function).

    - ``extras.ignore_warnings`` (default false): silence every Python warning for this process.
    - ``extras.keep_freed_memory`` (default true): for CPU runs only, glibc keeps freed memory instead of
      unmapping it every step (:func:`diffrank.experiments.run.malloc.keep_freed_memory`); logged when applied.

    Returns:
        ``{"ignore_warnings": bool, "keep_freed_memory": bool}``: what was applied.
    """
    extras = cfg.get("extras") or {}
    applied = {"ignore_warnings": bool(extras.get("ignore_warnings")), "keep_freed_memory": False}
    if applied["ignore_warnings"]:
        warnings.filterwarnings("ignore")
    # Lightning 2.6 builds torch's deprecated LeafSpec on its first batch: a FutureWarning about Lightning's code
    # that no user can act on, printed before the first step of every run
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    if extras.get("keep_freed_memory") and _runs_on_cpu(cfg.trainer):
        applied["keep_freed_memory"] = keep_freed_memory()
        log.info("CPU run, extras.keep_freed_memory: glibc malloc keeps freed memory (%s)",
                 "applied" if applied["keep_freed_memory"] else "not glibc, nothing changed")
    return applied


def summary_caption(record: dict[str, Any] | None) -> str | None:
    """The conditions of a headline number: which checkpoint was tested, on what device and threads."""
    if not record:
        return None
    ckpt = record.get("checkpoint") or {}
    what = f"{Path(ckpt['path']).name} (epoch {ckpt['epoch']}, step {ckpt['global_step']})" if ckpt \
        else "final weights"
    if record.get("evaluated_checkpoint"):
        what = f"evaluation of {what}"
    versions = record.get("versions") or {}
    return f"{what}; {record.get('device')}; torch {versions.get('torch')}"


def print_summary(metrics: dict[str, float], record: dict[str, Any] | None = None) -> None:
    """Print the test metrics as a rich table (what ``make train`` ends with), captioned with the tested
    checkpoint and the device when ``record`` (the ``results.json`` record) is given."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="test metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in sorted(metrics):
        if k.startswith("test/"):
            v = metrics[k]
            table.add_row(k, f"{100 * v:.2f} %" if "loss" not in k else f"{v:.4f}")
    console = Console()
    console.print(table)
    caption = summary_caption(record)
    if caption:
        console.print(f"tested: {caption}", soft_wrap=True, markup=False, highlight=False)
