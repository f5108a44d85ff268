"""A run-time estimate printed early in a run, so that a long run can be sized to its time limit before it is
half done."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


def _sync(trainer: L.Trainer) -> None:
    """Wait for queued CUDA work (only at the two timing points of a run; CPU steps are synchronous)."""
    if trainer.strategy.root_device.type == "cuda":
        torch.cuda.synchronize(trainer.strategy.root_device)


class RunTimeEstimate(L.Callback):
    """Logs the time per training step after ``warmup + measure`` steps and the time of the first validation,
    and from them the whole run's expected wall time and end (a line of the run's log, rank 0 only).

    Args:
        warmup: steps left out of the measurement (allocations, caches, the first validation's sanity check).
        measure: steps timed for the estimate.

    The estimate assumes the measured step time holds for the rest of the run (on a shared CPU it moves with the
    load) and that every validation costs what the first one did; the test pass at the end is not included.
    Units: seconds (the log line: ms per step, minutes, and the expected end as local HH:MM).

    Raises:
        ValueError: ``warmup < 0`` or ``measure < 1``.
    """

    def __init__(self, warmup: int = 5, measure: int = 20) -> None:
        if warmup < 0 or measure < 1:
            raise ValueError(f"need warmup >= 0 and measure >= 1, got {warmup}, {measure}")
        self.warmup, self.measure = int(warmup), int(measure)
        self._start_step: int | None = None
        self._t0: float | None = None
        self.step_s: float | None = None
        self.val_s: float | None = None
        self._val_t0: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Count the steps of this fit from here (a resumed run starts at its checkpoint's step)."""
        self._start_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Start the clock after ``warmup`` steps; after ``measure`` more, log the training estimate."""
        if self.step_s is not None or self._start_step is None:
            return
        done = trainer.global_step - self._start_step
        if done == self.warmup:
            _sync(trainer)
            self._t0 = time.perf_counter()
        elif done == self.warmup + self.measure and self._t0 is not None:
            _sync(trainer)
            self.step_s = (time.perf_counter() - self._t0) / self.measure
            self._report(trainer)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Time the first validation of the fit (not the sanity check)."""
        if not trainer.sanity_checking and self.val_s is None:
            _sync(trainer)
            self._val_t0 = time.perf_counter()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the whole run's estimate once the first validation's time is known."""
        if not trainer.sanity_checking and self.val_s is None and self._val_t0 is not None:
            _sync(trainer)
            self.val_s = time.perf_counter() - self._val_t0
            self._report(trainer)

    def total_steps(self, trainer: L.Trainer) -> int | None:
        """Optimizer steps the run will take: ``max_steps``, else ``max_epochs`` × batches per epoch."""
        if trainer.max_steps and trainer.max_steps > 0:
            return int(trainer.max_steps)
        batches = trainer.num_training_batches
        if trainer.max_epochs and trainer.max_epochs > 0 and batches not in (None, float("inf")):
            return int(trainer.max_epochs * batches / max(1, trainer.accumulate_grad_batches))
        return None

    def validations(self, trainer: L.Trainer, steps: int) -> int:
        """Validations in a run of ``steps`` steps (every ``val_check_interval`` steps, or once per epoch)."""
        interval = trainer.val_check_interval
        if isinstance(interval, int) and trainer.check_val_every_n_epoch is None:
            return steps // interval
        per_epoch = trainer.num_training_batches
        epochs = steps / per_epoch if per_epoch not in (None, 0, float("inf")) else 1
        return max(1, int(epochs / (trainer.check_val_every_n_epoch or 1)))

    def _report(self, trainer: L.Trainer) -> None:
        steps = self.total_steps(trainer)
        if steps is None or self.step_s is None or not trainer.is_global_zero:
            return
        run_steps = steps - (self._start_step or 0)
        train_s = run_steps * self.step_s
        threads = torch.get_num_threads()
        line = (f"run-time estimate: {1e3 * self.step_s:.0f} ms/step ({self.measure} steps after {self.warmup}, "
                f"{threads} thread{'s' if threads != 1 else ''}): {run_steps} steps ~ {train_s / 60:.1f} min of "
                "training")
        if self.val_s is None:
            log.info("%s (validation: estimated after the first one)", line)
            return
        n_val = self.validations(trainer, steps)
        total = train_s + n_val * self.val_s
        left_steps = max(0, steps - trainer.global_step)
        left_val = max(0, n_val - self.validations(trainer, trainer.global_step))
        end = time.time() + left_steps * self.step_s + left_val * self.val_s
        log.info("%s + %d validations x %.0f s = %.1f min (the test pass not included); ends ~ %s", line, n_val,
                 self.val_s, total / 60, time.strftime("%H:%M", time.localtime(end)))
