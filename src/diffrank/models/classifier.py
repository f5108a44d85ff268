"""LightningModule for top-k classification (Petersen et al. 2022, §5): a backbone and a loss."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from diffrank.models.base import ConfiguredModule


class TopKClassifier(ConfiguredModule):
    """Backbone → scores (B, n) → loss (top-k CE or a baseline); reports top-k accuracies.

    Args:
        net: backbone mapping a batch of inputs to ``(B, num_classes)`` scores.
        loss: callable ``loss(scores, labels) -> scalar``.
        optimizer: partial constructor ``optimizer(params)`` (Hydra ``_partial_: true``).
        num_classes: n.
        scheduler: optional partial constructor ``scheduler(optimizer)``.
        topk: the k of the reported accuracies (``val/top1``, ``val/top5``, ``test/top1``, …).
        compile: wrap the backbone in ``torch.compile`` at fit time.

    Logged: ``train/loss``, ``val/loss``, ``val/top{k}``, ``val/top1_best``, ``test/top{k}`` (fractions in [0, 1]).
    """

    def __init__(self, net: nn.Module, loss: Callable[[Tensor, Tensor], Tensor], optimizer: Callable,
                 num_classes: int, scheduler: Callable | None = None, topk: Sequence[int] = (1, 5),
                 compile: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net", "loss"])
        self.net = net
        self.loss = loss
        self.topk = [k for k in topk if k <= num_classes]
        self.metrics = nn.ModuleDict({
            f"{stage}_top{k}": MulticlassAccuracy(num_classes=num_classes, top_k=k, average="micro")
            for stage in ("val", "test") for k in self.topk
        })
        self.val_top1_best = MaxMetric()

    def forward(self, x: Tensor) -> Tensor:
        """Scores ``(B, num_classes)``."""
        return self.net(x)

    def on_train_start(self) -> None:
        """Forget the sanity-check validation (LHT: it would pollute the best value)."""
        self.val_top1_best.reset()
        for k in self.topk:
            self.metrics[f"val_top{k}"].reset()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """One optimisation step; logs ``train/loss``."""
        x, y = batch
        loss = self.loss(self(x), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(y))
        return loss

    def _eval_step(self, stage: str, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        scores = self(x)
        self.log(f"{stage}/loss", self.loss(scores, y), on_step=False, on_epoch=True, batch_size=len(y),
                 sync_dist=True)
        for k in self.topk:
            m = self.metrics[f"{stage}_top{k}"]
            m(scores, y)
            self.log(f"{stage}/top{k}", m, on_step=False, on_epoch=True, prog_bar=k == 1)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Validation metrics."""
        self._eval_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        """Track the best validation top-1 (``val/top1_best``)."""
        if "val_top1" in self.metrics:
            self.val_top1_best(self.metrics["val_top1"].compute())
            self.log("val/top1_best", self.val_top1_best.compute(), prog_bar=False)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Test metrics."""
        self._eval_step("test", batch)
