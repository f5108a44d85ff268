"""Process-wide settings of a script run (``python train.py``): warnings, the allocator of CPU runs, and the
smoke budget (``DIFFRANK_SMOKE=1``) under which the documentation's commands are tested as typed."""

from __future__ import annotations

import logging
import os
import warnings

import torch
from omegaconf import DictConfig, open_dict

from diffrank.experiments.run.malloc import keep_freed_memory

log = logging.getLogger(__name__)

#: the one budget switch (docs/experiments.md, "Smoke budget"): set to 1, every training run of a script
#: (``train.py``, ``diffrank-train``, each job of a multirun) trains and tests a few batches, and an Optuna
#: search runs at most :data:`SMOKE_OPTUNA_TRIALS` trials; the commands themselves stay as typed
SMOKE_ENV = "DIFFRANK_SMOKE"
#: what the switch sets in ``trainer`` (Lightning's arguments)
SMOKE_TRAINER = {"max_epochs": 1, "min_epochs": 1, "max_steps": 2, "limit_train_batches": 2,
                 "limit_val_batches": 2, "limit_test_batches": 2, "val_check_interval": None,
                 "check_val_every_n_epoch": 1, "num_sanity_val_steps": 0, "log_every_n_steps": 1}
SMOKE_OPTUNA_TRIALS = 2


def smoke_budget() -> bool:
    """Whether the smoke budget is on (``$DIFFRANK_SMOKE`` is set to anything but ``""`` / ``0``)."""
    return os.environ.get(SMOKE_ENV, "") not in ("", "0")


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
