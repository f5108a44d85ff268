"""What every diffrank LightningModule shares: optional compilation and optimisers from config partials."""

from __future__ import annotations

from typing import ClassVar

import lightning as L
import torch


class ConfiguredModule(L.LightningModule):
    """LightningModule whose ``net`` may be compiled and whose optimiser / scheduler come from Hydra partials.

    Subclasses save ``compile`` (bool), ``optimizer`` (``params -> Optimizer``) and ``scheduler``
    (``optimizer -> LRScheduler`` or ``None``) with ``save_hyperparameters`` and set
    ``scheduler_interval`` (``"epoch"`` or ``"step"``).
    """

    scheduler_interval: ClassVar[str] = "epoch"
    #: Lightning's ThroughputMonitor logs FLOP/s when a module says its FLOPs per batch; ours count samples/s
    #: only (None: no FLOPs, and no warning that the attribute is missing)
    flops_per_batch: ClassVar[int | None] = None

    def setup(self, stage: str) -> None:
        """Compile ``net`` with ``torch.compile`` when ``compile`` is set (fit only)."""
        if self.hparams.compile and stage == "fit":
            self.net = torch.compile(self.net)

    def configure_optimizers(self):
        """Optimizer (and scheduler, stepped every ``scheduler_interval``) from the config's partials."""
        opt = self.hparams.optimizer(params=self.parameters())
        if self.hparams.scheduler is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.hparams.scheduler(optimizer=opt),
                                                     "interval": self.scheduler_interval}}
