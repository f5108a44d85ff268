"""LightningModule for deep kNN classification trained end to end through a differentiable top-k.

Protocol of Grover et al. 2019 (§5.2) as reused by Xie et al. 2020 (§4.1, App. C, I.1) and Struski et al.
2025 (LapSum, §5.1): each training batch is split into queries and a disjoint set of templates, both go
through the same feature network, and the loss (:class:`~diffrank.losses.knn.NeighbourLoss`) penalises
soft-top-k mass on templates of another label. Evaluation is a hard kNN with the same k over the features of
the whole training split (:func:`~diffrank.experiments.metrics.knn.knn_predict`), recomputed at every validation / test.

The same module runs the two-stage baselines of Table 1 (Xie et al. 2020): a fixed feature map (raw pixels,
PCA-50: nothing to optimise, one step so that validation runs) or a network trained with softmax
cross-entropy through a linear ``head`` (``loss=softmax_ce``), then kNN on its features ("kNN+pretrained
CNN"); the head's own accuracy is the "CE+CNN" row. With ``autoencoder=True`` the net is an autoencoder
(:class:`~diffrank.experiments.models.autoencoder.ConvAutoEncoder`) trained to reconstruct the training images,
and the kNN runs on its codes ("kNN+AE", LapSum Table 3, from Grover et al. 2019).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from diffrank.experiments.metrics.knn import knn_predict
from diffrank.experiments.models.base import ConfiguredModule
from diffrank.losses.knn import NeighbourLoss


class KNNClassifier(ConfiguredModule):
    """Feature network + soft-kNN loss (or softmax CE through ``head``, or reconstruction through the net's
    decoder); hard-kNN accuracy as the metric.

    Args:
        net: feature network, ``(B, C, H, W)`` → ``(B, D)``.
        loss: :class:`NeighbourLoss` (end-to-end kNN) or ``loss(logits, labels)`` (with ``head``).
        optimizer: partial ``optimizer(params)``. scheduler: optional partial ``scheduler(optimizer)``.
        num_classes: label count.
        k: neighbours of the hard kNN evaluation (the loss's k for end-to-end training).
        num_queries: the first ``num_queries`` images of a training batch are queries, the rest templates.
        head: linear head for the cross-entropy baseline (``None`` for kNN training).
        autoencoder: train ``net`` as an autoencoder: the loss is ``loss(net.decode(net(x)), x)`` (e.g.
            ``torch.nn.MSELoss``), no labels, no head; the kNN runs on the codes ``net(x)``.
        primary: which accuracy is logged as ``top1`` (the table's number): ``"knn"`` or ``"head"``; the
            other is ``knn_top1`` / ``head_top1``.
        chunk: reference features per distance block in the evaluation.
        compile: ``torch.compile`` the feature network at fit time.

    Batches: ``(images float32, labels int64)``; the datamodule provides ``reference_dataloader()``.

    Logged: ``train/loss``, ``train/queries_per_s`` (per epoch, training steps only), ``train/beta`` (a learned
    β), ``val/top1``, ``val/top1_best``, ``test/top1`` (fractions in [0, 1]).

    Raises:
        ValueError: bad ``primary``, ``head`` given with a :class:`NeighbourLoss` (or missing without),
            ``autoencoder`` with a head, a :class:`NeighbourLoss` or a net without ``decode``, a training batch
            with no more templates than k.
    """

    def __init__(self, net: nn.Module, loss: Callable, optimizer: Callable, num_classes: int, k: int = 9,
                 num_queries: int = 100, head: nn.Module | None = None, primary: str = "knn",
                 scheduler: Callable | None = None, chunk: int = 8192, compile: bool = False,
                 autoencoder: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net", "loss", "head"])
        if primary not in ("knn", "head"):
            raise ValueError(f"primary must be 'knn' or 'head', got {primary!r}")
        self.end_to_end = isinstance(loss, NeighbourLoss)
        self.autoencoder = bool(autoencoder)
        if self.autoencoder:
            if head is not None or self.end_to_end:
                raise ValueError("autoencoder=True trains the net by reconstruction: no head, no NeighbourLoss")
            if not callable(getattr(net, "decode", None)):
                raise ValueError(f"autoencoder=True needs a net with decode(); {type(net).__name__} has none")
        elif self.end_to_end == (head is not None):
            raise ValueError("a NeighbourLoss trains the features directly (no head); any other loss needs a head")
        if primary == "head" and head is None:
            raise ValueError("primary='head' needs a head")
        self.net, self.loss, self.head = net, loss, head
        self.k, self.num_queries, self.num_classes = int(k), int(num_queries), int(num_classes)
        names = {"knn": "top1" if primary == "knn" else "knn_top1",
                 "head": "top1" if primary == "head" else "head_top1"}
        self.names = {kind: names[kind] for kind in (("knn", "head") if head is not None else ("knn",))}
        self.metrics = nn.ModuleDict({f"{stage}_{kind}": MulticlassAccuracy(num_classes=num_classes, average="micro")
                                      for stage in ("val", "test") for kind in self.names})
        self.val_top1_best = MaxMetric()
        self._reference: tuple[Tensor, Tensor] | None = None
        self._fixed = False
        self._epoch_start = 0.0
        self._epoch_steps = 0

    def forward(self, x: Tensor) -> Tensor:
        """Features ``(B, D)``."""
        return self.net(x)

    def setup(self, stage: str) -> None:
        """Fit a fixed feature map that needs it (PCA) on the training split, then compile if asked."""
        fit = getattr(self.net, "fit", None)
        if callable(fit) and not bool(getattr(self.net, "fitted", True)):
            images = torch.cat([x for x, _ in self.trainer.datamodule.reference_dataloader()])
            fit(images)
        super().setup(stage)

    def configure_optimizers(self):
        self._fixed = not any(p.requires_grad for p in self.parameters())
        if self._fixed:
            return None  # a fixed feature map (pixels, PCA): nothing to optimise
        return super().configure_optimizers()

    def on_train_start(self) -> None:
        """Forget the sanity-check validation (it would pollute the best value)."""
        self.val_top1_best.reset()

    def on_train_epoch_start(self) -> None:
        """Start the throughput clock (validation excluded)."""
        self._epoch_start, self._epoch_steps = time.perf_counter(), 0

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """One step on ``num_queries`` queries and the remaining templates (or CE through the head)."""
        if self._fixed:
            return None  # nothing to train (Lightning skips the step)
        x, y = batch
        features = self(x)
        if self.end_to_end:
            q = self.num_queries
            if len(y) - q <= self.k:
                raise ValueError(f"a batch of {len(y)} leaves {len(y) - q} templates for {q} queries; need > k = "
                                 f"{self.k} (data.batch_size = queries + templates)")
            loss = self.loss(features[:q], y[:q], features[q:], y[q:])
            if self.loss.log_scale is not None:
                self.log("train/beta", self.loss.beta, on_step=False, on_epoch=True, batch_size=q)
        elif self.autoencoder:
            loss = self.loss(self.net.decode(features), x)
        else:
            loss = self.loss(self.head(features), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(y))
        self._epoch_steps += 1
        return loss

    def on_train_epoch_end(self) -> None:
        """Queries (images, for the CE baseline) per second of this epoch's training steps."""
        seconds = time.perf_counter() - self._epoch_start
        per_step = self.num_queries if self.end_to_end else self.trainer.datamodule.batch_size
        if self._epoch_steps and seconds > 0:
            self.log("train/queries_per_s", self._epoch_steps * per_step / seconds)

    @torch.no_grad()
    def _reference_features(self) -> tuple[Tensor, Tensor]:
        feats, labels = [], []
        for x, y in self.trainer.datamodule.reference_dataloader():
            feats.append(self(x.to(self.device)))
            labels.append(y.to(self.device))
        return torch.cat(feats), torch.cat(labels)

    def on_validation_epoch_start(self) -> None:
        """Features of the whole training split with the current weights."""
        self._reference = self._reference_features()

    on_test_epoch_start = on_validation_epoch_start

    def _eval_step(self, stage: str, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        features = self(x)
        reference, labels = self._reference
        predictions = {"knn": knn_predict(features, reference, labels, self.k, self.num_classes,
                                          self.hparams.chunk)}
        if self.head is not None:
            predictions["head"] = self.head(features).argmax(1)
        for kind, name in self.names.items():
            metric = self.metrics[f"{stage}_{kind}"]
            metric(predictions[kind], y)
            self.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, prog_bar=name == "top1")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Hard-kNN (and head) accuracy of a validation batch."""
        self._eval_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        """Track the best validation top-1 (``val/top1_best``); free the reference features."""
        kind = next(k for k, name in self.names.items() if name == "top1")
        self.val_top1_best(self.metrics[f"val_{kind}"].compute())
        self.log("val/top1_best", self.val_top1_best.compute())
        self._reference = None

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Hard-kNN (and head) accuracy of a test batch."""
        self._eval_step("test", batch)

    def on_test_epoch_end(self) -> None:
        """Free the reference features."""
        self._reference = None
