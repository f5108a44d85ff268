"""A divergence guard: a run whose loss is no longer finite, explodes, or whose validation accuracy falls back to
chance after it was above it stops, and its record says ``diverged`` instead of ``done``.

Such runs otherwise look finished: a classifier trained with ``model.optimizer.lr=1e6`` reaches a training loss of
4.6e22 and 1.17 % test accuracy and exits 0; a Newton-loss run that diverged in epoch 21 logged a training loss of
0.0 at 10 % accuracy (chance for 10 classes) for 180 more epochs. The report never pools a diverged run with
finished ones (:func:`diffrank.experiments.records.matching.collect_runs` takes ``status: done`` only).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


class DivergenceGuard(L.Callback):
    """Stop a run that diverged and say why (:attr:`reason`, recorded as the run's ``error``).

    Three signs, checked on every rank (any rank's sign stops all):

    - the training loss of a step is NaN or infinite;
    - the training loss exceeds ``explode`` times the largest ``|loss|`` of the first ``warmup`` steps (at least 1:
      a loss that starts near 0 is not called exploding for reaching 1; the first step's loss is that of the
      initial weights: a learning rate of 1e6 has blown the loss up by the second step);
    - a validation's ``monitor`` (an accuracy, ``val/top1``) fell back to chance (1 / the model's or the data's
      ``num_classes``) after an earlier validation was at least halfway from chance to 1 (a run trained for top-5
      whose top-1 wanders near chance is not called diverged). "Back to chance" is measured against the distance
      the run had gained: ``value - chance <= chance_margin * (best - chance)``, i.e. the run lost at least
      ``1 - chance_margin`` (90 %) of its gain over chance. A margin in units of chance would not do: for two
      classes 1.5 × chance is 0.75, and a binary classifier dipping from 0.80 to 0.74 would be called diverged
      (a final status); with the relative margin it is called diverged at 0.53 or below (ten classes after 0.9:
      at 0.18 or below).

    Args:
        explode: the factor of the loss (units: the loss's own) over its first steps that counts as exploding.
        warmup: steps whose loss sets the scale.
        monitor: the validation accuracy checked against chance; runs without it, or without ``num_classes``,
            skip that check.
        chance_margin: the fraction of its best gain over chance (``best - chance``) that a run may keep and still
            count as back at chance (0 < chance_margin < 1).
        device_every: on an accelerator, the loss is read every this many steps (reading it waits for the
            device; a NaN or exploded loss stays so, and is caught a few steps later); on the CPU every step.

    Raises:
        ValueError: ``explode <= 1``, ``warmup < 1``, ``chance_margin`` outside (0, 1) or ``device_every < 1``.
    """

    def __init__(self, explode: float = 1e4, warmup: int = 1, monitor: str = "val/top1",
                 chance_margin: float = 0.1, device_every: int = 20) -> None:
        if not (explode > 1 and warmup >= 1 and 0 < chance_margin < 1 and device_every >= 1):
            raise ValueError(f"need explode > 1, warmup >= 1, 0 < chance_margin < 1 (a fraction of the gain over "
                             f"chance), device_every >= 1; got {explode}, {warmup}, {chance_margin}, {device_every}")
        self.device_every = int(device_every)
        self.explode, self.warmup, self.monitor, self.chance_margin = float(explode), int(warmup), monitor, \
            float(chance_margin)
        self.scale: float | None = None
        self._first: list[float] = []
        self.best: float | None = None
        self.reason: str | None = None

    def _stop(self, trainer: L.Trainer, reason: str | None) -> None:
        # a sign on one rank stops every rank
        if trainer.world_size > 1 and trainer.strategy.reduce_boolean_decision(reason is not None, all=False):
            reason = reason or "another rank diverged"
        if reason is None:
            return
        self.reason = self.reason or reason
        trainer.should_stop = True
        log.error("diverged: %s; the run stops (its record says status: diverged)", reason)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Check the step's training loss."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor) or self.reason is not None:
            return
        if loss.device.type != "cpu" and self.scale is not None and trainer.global_step % self.device_every:
            return
        value = float(loss.detach().float().mean())
        reason = None
        if not math.isfinite(value):
            reason = f"the training loss is {value} at step {trainer.global_step}"
        elif self.scale is None:
            self._first.append(abs(value))
            if len(self._first) >= self.warmup:
                self.scale = max(1.0, max(self._first))
        elif abs(value) > self.explode * self.scale:
            reason = (f"the training loss {value:.3g} at step {trainer.global_step} is over {self.explode:g} x its "
                      f"first steps' {self.scale:.3g} (e.g. too high a learning rate)")
        self._stop(trainer, reason)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Check the validation accuracy against chance."""
        if trainer.sanity_checking or self.reason is not None:
            return
        value = trainer.callback_metrics.get(self.monitor)
        classes = getattr(pl_module, "num_classes", None) or getattr(trainer.datamodule, "num_classes", None)
        reason = None
        if value is not None and isinstance(classes, int) and classes > 1:
            value, chance = float(value), 1.0 / classes
            if self.best is not None and self.best >= (1 + chance) / 2 \
                    and value - chance <= self.chance_margin * (self.best - chance):
                reason = (f"{self.monitor} fell to {value:.4f} (chance: {chance:.4f}) at epoch {trainer.current_epoch}"
                          f" after reaching {self.best:.4f}: within {self.chance_margin:g} of its gain over chance")
            self.best = value if self.best is None else max(self.best, value)
        if trainer.world_size > 1 or reason is not None:
            self._stop(trainer, reason)

    def state_dict(self) -> dict[str, Any]:
        """The loss scale and the best accuracy so far (a resumed run keeps checking against them)."""
        return {"scale": self.scale, "first": self._first, "best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.scale, self._first, self.best = state_dict.get("scale"), list(state_dict.get("first") or []), \
            state_dict.get("best")
