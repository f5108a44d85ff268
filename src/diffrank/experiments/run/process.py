"""Process-wide settings of a script run (``python train.py``): warnings, the allocator of CPU runs."""

from __future__ import annotations

import logging
import warnings

import torch
from omegaconf import DictConfig

from diffrank.experiments.run.malloc import keep_freed_memory

log = logging.getLogger(__name__)


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
    if extras.get("keep_freed_memory") and _runs_on_cpu(cfg.trainer):
        applied["keep_freed_memory"] = keep_freed_memory()
        log.info("CPU run, extras.keep_freed_memory: glibc malloc keeps freed memory (%s)",
                 "applied" if applied["keep_freed_memory"] else "not glibc, nothing changed")
    return applied
