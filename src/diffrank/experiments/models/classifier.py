"""LightningModule for top-k classification (Petersen et al. 2022, §5): a backbone and a loss.

Model selection. By default the run's best checkpoint by ``val/top1`` is tested (``diffrank.experiments.run.fit``).
With ``test_each_epoch=true`` (the CIFAR-100 protocol) the module follows the difftopk code instead: it also
evaluates the test split after every validation and reports, per k, the test top-k accuracy of the epoch with
the best validation top-k (top-1 at the best val top-1 epoch, top-5 at the best val top-5 epoch, which may
differ) as ``test/top{k}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from diffrank.experiments.models.base import ConfiguredModule


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
        test_each_epoch: evaluate the test split after every validation epoch and report ``test/top{k}`` at the
            epoch of the best ``val/top{k}``, per k (Petersen et al. 2022, §5.1, as the difftopk code selects);
            the tested checkpoint's own accuracies are then logged as ``test_checkpoint/top{k}``.
        ties: with ``test_each_epoch``, which of several epochs with the same best validation accuracy counts:
            ``"later"`` (as ``callbacks.model_checkpoint.ties`` by default, so that ``test/top1`` is the tested
            checkpoint's) or ``"earlier"``.

    Logged: ``train/loss``, ``val/loss``, ``val/top{k}``, ``val/top1_best``, ``test/top{k}`` (fractions in [0, 1]);
    with ``test_each_epoch`` also ``val/top{k}_best``, ``selected_epoch/top{k}`` (the selected epoch) and
    ``test_checkpoint/top{k}``.

    The per-epoch record (:attr:`history`: epoch, ``val/top{k}``, ``test/top{k}``) is saved in every checkpoint,
    so a resumed run selects over all its epochs; loading an earlier checkpoint into a module that already holds a
    longer history (testing the best checkpoint after fit) keeps the longer one. Under ``ddp_spawn`` the main
    process only sees the history stored in the tested checkpoint.

    Raises:
        ValueError: an empty ``topk``, a k outside ``1 … num_classes`` (top-200 of 100 classes cannot be computed;
            the message names ``model.topk``), or an unknown ``ties``.
    """

    def __init__(self, net: nn.Module, loss: Callable[[Tensor, Tensor], Tensor], optimizer: Callable,
                 num_classes: int, scheduler: Callable | None = None, topk: Sequence[int] = (1, 5),
                 compile: bool = False, test_each_epoch: bool = False, ties: str = "later") -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net", "loss"])
        self.net = net
        self.loss = loss
        self.topk = [int(k) for k in topk]
        # a k that cannot be computed is refused, not dropped: model.topk=[1,200] with 100 classes recorded no
        # top-200 and said nothing
        bad = [k for k in self.topk if not 1 <= k <= num_classes]
        if bad or not self.topk:
            raise ValueError(f"model.topk={list(topk)}: top-k accuracy needs 1 <= k <= the number of classes, "
                             f"{num_classes} here (data.num_classes); {bad or 'an empty list'} cannot be computed. "
                             f"Use ks in 1..{num_classes}")
        if ties not in ("later", "earlier"):
            raise ValueError(f"ties must be 'later' or 'earlier', got {ties!r}")
        stages = ("val", "test", "epoch_test") if test_each_epoch else ("val", "test")
        self.metrics = nn.ModuleDict({
            f"{stage}_top{k}": MulticlassAccuracy(num_classes=num_classes, top_k=k, average="micro")
            for stage in stages for k in self.topk
        })
        self.val_top1_best = MaxMetric()
        self.test_each_epoch, self.ties = bool(test_each_epoch), ties
        self.history: list[dict[str, float]] = []

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
        # with test_each_epoch, test/top{k} is the selected epoch's (on_test_epoch_end), not this checkpoint's
        name = "test_checkpoint" if stage == "test" and self.test_each_epoch else stage
        self.log(f"{name}/loss", self.loss(scores, y), on_step=False, on_epoch=True, batch_size=len(y),
                 sync_dist=True)
        for k in self.topk:
            m = self.metrics[f"{stage}_top{k}"]
            m(scores, y)
            self.log(f"{name}/top{k}", m, on_step=False, on_epoch=True, prog_bar=k == 1)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Validation metrics."""
        self._eval_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        """Track the best validation top-1 (``val/top1_best``); with ``test_each_epoch`` evaluate the test split
        and append this epoch to :attr:`history` (not during the sanity check)."""
        if "val_top1" in self.metrics:
            self.val_top1_best(self.metrics["val_top1"].compute())
            self.log("val/top1_best", self.val_top1_best.compute(), prog_bar=False)
        if not self.test_each_epoch or self.trainer.sanity_checking:
            return
        entry = {"epoch": float(self.current_epoch),
                 **{f"val/top{k}": float(self.metrics[f"val_top{k}"].compute()) for k in self.topk},
                 **self._evaluate_test_split()}
        self.history.append(entry)
        for k, (_, val, _) in self.selected().items():
            if k != 1:  # val/top1_best is logged above (the same value)
                self.log(f"val/top{k}_best", val)

    @torch.no_grad()
    def _evaluate_test_split(self) -> dict[str, float]:
        # the datamodule's test loader through Lightning's transfer hooks (device, on-device normalisation);
        # under DDP every rank sees the whole split, so the synced accuracy is the same fraction
        loader = self.trainer.datamodule.test_dataloader()
        limit = 1 if self.trainer.fast_dev_run else None
        was_training = self.training
        self.eval()
        for i, batch in enumerate(loader):
            if limit is not None and i >= limit:
                break
            x, y = self._apply_batch_transfer_handler(batch)
            scores = self(x)
            for k in self.topk:
                self.metrics[f"epoch_test_top{k}"].update(scores, y)
        out = {}
        for k in self.topk:
            m = self.metrics[f"epoch_test_top{k}"]
            out[f"test/top{k}"] = float(m.compute())
            m.reset()
        self.train(was_training)
        return out

    def selected(self) -> dict[int, tuple[int, float, float]]:
        """Per k, ``(epoch, val/top{k}, test/top{k})`` of the epoch in :attr:`history` with the best validation
        top-k (ties: ``self.ties``); empty without history."""
        out = {}
        for k in self.topk:
            best = None
            for h in self.history:
                v = h[f"val/top{k}"]
                if best is None or v > best[f"val/top{k}"] or (self.ties == "later" and v == best[f"val/top{k}"]):
                    best = h
            if best is not None:
                out[k] = (int(best["epoch"]), best[f"val/top{k}"], best[f"test/top{k}"])
        return out

    def on_test_epoch_end(self) -> None:
        """With ``test_each_epoch``: log ``test/top{k}`` and ``selected_epoch/top{k}`` of the selected epochs (the
        tested checkpoint's own accuracies when there is no history, e.g. a module that never validated)."""
        if not self.test_each_epoch:
            return
        chosen = self.selected()
        for k in self.topk:
            if k in chosen:
                epoch, _, test = chosen[k]
                self.log(f"test/top{k}", test)
                self.log(f"selected_epoch/top{k}", float(epoch))
            else:
                self.log(f"test/top{k}", self.metrics[f"test_top{k}"].compute())

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store :attr:`history` (``checkpoint["topk_history"]``)."""
        checkpoint["topk_history"] = [dict(h) for h in self.history]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore :attr:`history` unless this module already holds a longer one (testing an earlier best
        checkpoint right after fit keeps the whole run's record)."""
        stored = checkpoint.get("topk_history") or []
        if len(stored) > len(self.history):
            self.history = [dict(h) for h in stored]

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Test metrics."""
        self._eval_step("test", batch)
