"""Ranking supervision (thesis §3.5, Fig. 3.1): a CNN scores each image of a set; a ranking loss on the scores.

Networks (thesis §3.5 "Network Architecture"; official ``diffsort`` ``models.py``):

- :class:`MultiDigitCNN`: [conv 5x5 → ReLU → max-pool 2] blocks, flatten, Linear → 64, ReLU, Linear → 1.
  ``channels=(32, 64)`` on 1 x 28 x 112 is the MNIST net (Grover et al. 2019; 12 544 features);
  ``channels=(32, 64, 128, 256)`` on 3 x 54 x 54 is the SVHN net (2 304 features); ``channels=(32, 64)``
  on 1 x 8 x 32 is our digits variant (64 · 2 · 8 = 1 024 features).
- :class:`RowStochasticNet`: the "vanilla row-stochastic" baseline of Grover et al. (ICLR 2019, §6.1; LapSum,
  ICML 2025, Table 4): the same CNN with n outputs per image, the n·n outputs of a set concatenated and mapped by
  three n² → n² linear layers to n × n logits, a softmax over each row (rows = ranks, columns = items).
- :class:`RankingSupervisionModule`: Lightning module, logs EM / EW / EM5 (fractions in [0, 1]);
  :class:`RowStochasticModule` the same for a net that predicts the n × n logits itself (no ranking operator).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn
from torchmetrics import MaxMetric

from diffrank.experiments.metrics.sorting import ElementWiseAccuracy, ExactMatch
from diffrank.experiments.models.base import ConfiguredModule


class MultiDigitCNN(nn.Module):
    """One score per image: ``(N, C, H, W)`` float → ``(N,)``.

    Args:
        image_shape: (C, H, W).
        channels: output channels of the conv blocks (each 5x5, padding 2, then ReLU and 2x2 max-pool
            with floor, as PyTorch's ``MaxPool2d(2)``).
        hidden: width of the hidden fully connected layer (64 in the papers).
        outputs: outputs per image: 1 (a score; ``forward`` returns ``(N,)``) or more (``(N, outputs)``, the
            per-image representation of :class:`RowStochasticNet`).

    Default PyTorch initialisation, no batch-norm, no dropout (as the reference code).

    Raises:
        ValueError: an image too small for the number of pooling blocks, empty ``channels`` or ``outputs`` < 1.
    """

    def __init__(self, image_shape: Sequence[int] = (1, 28, 112), channels: Sequence[int] = (32, 64),
                 hidden: int = 64, outputs: int = 1) -> None:
        super().__init__()
        c, h, w = (int(v) for v in image_shape)
        if not channels:
            raise ValueError("channels must list at least one conv block")
        if int(outputs) < 1:
            raise ValueError(f"outputs must be >= 1, got {outputs}")
        layers: list[nn.Module] = []
        for out in channels:
            layers += [nn.Conv2d(c, int(out), 5, stride=1, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2)]
            c, h, w = int(out), h // 2, w // 2
        if h < 1 or w < 1:
            raise ValueError(f"image {tuple(image_shape)} is too small for {len(channels)} pooling blocks")
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, int(hidden)), nn.ReLU(),
                                  nn.Linear(int(hidden), int(outputs)))
        self.num_features, self.outputs = c * h * w, int(outputs)

    def forward(self, x: Tensor) -> Tensor:
        """Scores ``(N,)`` (``outputs = 1``) or ``(N, outputs)`` for images ``(N, C, H, W)``."""
        out = self.head(self.features(x))
        return out.squeeze(-1) if self.outputs == 1 else out


class RowStochasticNet(nn.Module):
    """The vanilla row-stochastic baseline: a set of n images ``(B, n, C, H, W)`` → n × n logits ``(B, n, n)``.

    Grover et al. (ICLR 2019), §6.1 "Vanilla RS" (their ``run_sort.py``, ``method=vanilla``), quoted by LapSum
    (ICML 2025) Table 4: each image goes through :class:`MultiDigitCNN` with n outputs, the n·n outputs of a set
    are concatenated (in item order) and mapped by three n² → n² linear layers (no activation between them, as in
    the authors' code) to logits whose row r, after a softmax, is the predicted distribution over the items of
    rank r + 1 (rank 1 = the largest: the project's P layout, :mod:`diffrank.losses.sorting`). Unlike a
    ranking operator the net sees the whole set at once and is tied to its n.

    Args:
        n: the set size (fixed: the linear layers are n² wide).
        image_shape, channels, hidden: as :class:`MultiDigitCNN`.
        layers: number of n² → n² linear layers after the concatenation (3 in the authors' code).

    Raises:
        ValueError: ``n`` < 2, ``layers`` < 1, or a bad CNN configuration (:class:`MultiDigitCNN`).
    """

    def __init__(self, n: int, image_shape: Sequence[int] = (1, 28, 112), channels: Sequence[int] = (32, 64),
                 hidden: int = 64, layers: int = 3) -> None:
        super().__init__()
        n = int(n)
        if n < 2:
            raise ValueError(f"n must be >= 2, got {n}")
        if int(layers) < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.n = n
        self.cnn = MultiDigitCNN(image_shape, channels, hidden, outputs=n)
        self.mlp = nn.Sequential(*(nn.Linear(n * n, n * n) for _ in range(int(layers))))

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(B, n, n)`` (rows = ranks, columns = items) for sets of images ``(B, n, C, H, W)``.

        Raises:
            ValueError: sets of another size than ``n``.
        """
        b, n = images.shape[:2]
        if n != self.n:
            raise ValueError(f"this net was built for sets of n = {self.n}, got n = {n}")
        return self.mlp(self.cnn(images.flatten(0, 1)).reshape(b, n * n)).view(b, n, n)


class RankingSupervisionModule(ConfiguredModule):
    """Scores the n images of each set independently and trains them with a ranking loss.

    Args:
        net: maps ``(N, C, H, W)`` to ``(N,)`` scores (:class:`MultiDigitCNN`).
        loss: callable ``loss(scores (B, n), values (B, n)) -> scalar`` (``loss=sort_bce`` / ``sort_rank_mse``).
        optimizer: partial constructor ``optimizer(params)`` (Adam, lr 10^-3.5 in the thesis).
        scheduler: optional partial constructor ``scheduler(optimizer)`` (stepped every step).
        compile: ``torch.compile`` the net at fit time.

    Batches: ``(images (B, n, C, H, W), values (B, n))``, evaluation batches optionally followed by
    ``(images5 (B, 5, C, H, W), values5 (B, 5))``, dedicated 5-sets for EM5. Without them EM5 is EM on
    the ⌊n/5⌋ disjoint 5-chunks of each set when n >= 5 (the reference code takes the first chunk only;
    more chunks = more 5-sets from the same images) and is not logged for n < 5.

    Logged: ``train/loss``; ``val/loss``, ``val/em``, ``val/ew``, ``val/em5``, ``val/em5_best``;
    ``test/loss``, ``test/em``, ``test/ew``, ``test/em5`` (fractions in [0, 1]).
    """

    scheduler_interval = "step"

    def __init__(self, net: nn.Module, loss: Callable[[Tensor, Tensor], Tensor], optimizer: Callable,
                 scheduler: Callable | None = None, compile: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net", "loss"])
        self.net = net
        self.loss = loss
        self.metrics = nn.ModuleDict({
            f"{stage}_{name}": cls() for stage in ("val", "test")
            for name, cls in (("em", ExactMatch), ("ew", ElementWiseAccuracy), ("em5", ExactMatch))
        })
        self.val_em5_best = MaxMetric()

    def forward(self, images: Tensor) -> Tensor:
        """Scores ``(B, n)`` for sets of images ``(B, n, C, H, W)``.

        Raises:
            ValueError: if ``images`` is not 5-D.
        """
        if images.dim() != 5:
            raise ValueError(f"images must be (B, n, C, H, W), got shape {tuple(images.shape)}")
        b, n = images.shape[:2]
        return self.net(images.flatten(0, 1)).view(b, n)

    def on_train_start(self) -> None:
        """Forget the sanity-check validation (it would pollute the best value)."""
        self.val_em5_best.reset()
        for name in ("em", "ew", "em5"):
            self.metrics[f"val_{name}"].reset()

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        """One optimisation step on a batch of sets; logs ``train/loss``."""
        images, values = batch[0], batch[1]
        loss = self.loss(self(images), values)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=len(values))
        return loss

    def _five_sets(self, scores: Tensor, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor] | None:
        """The predictions and values of the 5-sets for EM5, or None when there are none."""
        values = batch[1]
        if len(batch) >= 4:
            return self(batch[2]), batch[3]
        if values.shape[1] >= 5:
            # disjoint 5-chunks of each set: independent 5-sets (numbers are drawn independently)
            c = 5 * (values.shape[1] // 5)
            return scores[:, :c].reshape(-1, 5), values[:, :c].reshape(-1, 5)
        return None

    def _eval_step(self, stage: str, batch: Sequence[Tensor]) -> None:
        images, values = batch[0], batch[1]
        scores = self(images)
        self.log(f"{stage}/loss", self.loss(scores, values), on_step=False, on_epoch=True, batch_size=len(values),
                 sync_dist=True)
        for name in ("em", "ew"):
            m = self.metrics[f"{stage}_{name}"]
            m(scores, values)
            self.log(f"{stage}/{name}", m, on_step=False, on_epoch=True, prog_bar=name == "em")
        five = self._five_sets(scores, batch)
        if five is None:
            return
        m = self.metrics[f"{stage}_em5"]
        m(*five)
        self.log(f"{stage}/em5", m, on_step=False, on_epoch=True, prog_bar=True)

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        """Validation EM / EW / EM5."""
        self._eval_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        """Track the best validation EM5 (``val/em5_best``; the reference code selects on it)."""
        m = self.metrics["val_em5"]
        if m.update_count:
            self.val_em5_best(m.compute())
            self.log("val/em5_best", self.val_em5_best.compute())

    def test_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        """Test EM / EW / EM5."""
        self._eval_step("test", batch)


class RowStochasticModule(RankingSupervisionModule):
    """:class:`RankingSupervisionModule` for a net that maps a whole set to n × n logits (:class:`RowStochasticNet`,
    ``model=sorting_row_stochastic``): trained with ``loss=sort_rows_ce`` (row-wise cross-entropy of the row
    softmax against the true permutation, :class:`diffrank.losses.sorting.RowSoftmaxCELoss`), evaluated on the
    row-wise argmax (EM / EW of :mod:`diffrank.experiments.metrics.sorting` on ``(B, n, n)`` logits, as Grover et
    al.'s ``prop_correct``). EM5 only when n = 5 (it is EM then): the net is tied to its n, so neither the
    dedicated 5-sets nor 5-chunks of an n-set can be scored (use ``data.em5=false``).

    Batches and logged metrics as :class:`RankingSupervisionModule`; ``forward(images (B, n, C, H, W)) ->
    (B, n, n)`` logits (rows = ranks, rank 1 = largest; columns = items).
    """

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(B, n, n)`` for sets of images ``(B, n, C, H, W)``.

        Raises:
            ValueError: if ``images`` is not 5-D, or its n is not the net's.
        """
        if images.dim() != 5:
            raise ValueError(f"images must be (B, n, C, H, W), got shape {tuple(images.shape)}")
        return self.net(images)

    def _five_sets(self, scores: Tensor, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor] | None:
        return (scores, batch[1]) if batch[1].shape[1] == 5 else None
