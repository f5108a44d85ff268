"""The environment a sweep hands its jobs: variables set by the Hydra callbacks (or by the user) and read by every
job, whichever launcher starts it (in process, joblib, submitit, SLURM)."""

from __future__ import annotations

import os

#: the one budget switch (docs/experiments.md, "Smoke budget"): set to 1, every training run of a script
#: (``train.py``, ``diffrank-train``, each job of a multirun) trains and tests a few batches, and an Optuna
#: search runs at most :data:`SMOKE_OPTUNA_TRIALS` trials; the commands themselves stay as typed
SMOKE_ENV = "DIFFRANK_SMOKE"
SMOKE_OPTUNA_TRIALS = 2
#: the sweep's swept keys, comma-separated, set by the sweep callback for the job folder names
#: (:func:`diffrank.experiments.run.resolvers.job_dir_name`)
SWEPT_KEYS_ENV = "DIFFRANK_SWEPT_KEYS"


def smoke_budget() -> bool:
    """Whether the smoke budget is on (``$DIFFRANK_SMOKE`` is set to anything but ``""`` / ``0``)."""
    return os.environ.get(SMOKE_ENV, "") not in ("", "0")


__all__ = ["SMOKE_ENV", "SMOKE_OPTUNA_TRIALS", "SWEPT_KEYS_ENV", "smoke_budget"]
