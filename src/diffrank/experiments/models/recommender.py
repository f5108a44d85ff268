"""Top-K recommendation by matrix factorisation (Koren, Bell, Volinsky, IEEE Computer 2009; RecBole's BPR model):
user and item embeddings, a user's scores of all items their dot products; trained by any loss of
:mod:`diffrank.losses.recommendation` on users' training positives, evaluated by full ranking
(:mod:`diffrank.experiments.metrics.ranking`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from diffrank.experiments.metrics.ranking import NAMES, MeanListMetric
from diffrank.experiments.models.base import ConfiguredModule


class DotProductScorer(nn.Module):
    """``(B,)`` int64 user indices -> ``(B, num_items)`` scores ⟨p_u, q_i⟩ (dtype of the embeddings, float32).

    Embeddings initialised by Xavier normal, as RecBole's ``xavier_normal_initialization`` of its BPR model.

    Raises:
        ValueError: fewer than one user, item or dimension.
    """

    def __init__(self, num_users: int, num_items: int, dim: int = 64) -> None:
        super().__init__()
        if min(int(num_users), int(num_items), int(dim)) < 1:
            raise ValueError(f"need num_users, num_items and dim >= 1, got {num_users}, {num_items}, {dim}")
        self.user = nn.Embedding(int(num_users), int(dim))
        self.item = nn.Embedding(int(num_items), int(dim))
        nn.init.xavier_normal_(self.user.weight)
        nn.init.xavier_normal_(self.item.weight)

    def forward(self, users: Tensor) -> Tensor:
        """Scores of every item for each user."""
        return self.user(users) @ self.item.weight.T


class MatrixFactorization(ConfiguredModule):
    """Users' embeddings · items' embeddings -> scores (B, num_items) -> loss against the training positives.

    Args:
        loss: ``loss(scores (B, n), positives (B, n) float 0/1) -> scalar``.
        optimizer: partial constructor ``optimizer(params)``. scheduler: optional ``scheduler(optimizer)``.
        num_users / num_items: the data's counts (``data.num_users`` / ``data.num_items``). dim: embedding size.
        ks: the cut-offs of the reported metrics. compile: ``torch.compile`` the scorer at fit time.

    Batches as :class:`~diffrank.experiments.data.movielens.MovieLensDataModule` yields them. Logged:
    ``train/loss``; ``val/recall{k}``, ``val/ndcg{k}``, ``test/recall{k}``, ``test/ndcg{k}`` (means over users in
    [0, 1], known positives left out of the ranking).

    Raises:
        ValueError: an empty ``ks`` or a k outside ``1 … num_items``.
    """

    def __init__(self, loss: Callable[[Tensor, Tensor], Tensor], optimizer: Callable, num_users: int, num_items: int,
                 dim: int = 64, scheduler: Callable | None = None, ks: Sequence[int] = (10, 20),
                 compile: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["loss"])
        self.ks = [int(k) for k in ks]
        if not self.ks or not all(1 <= k <= int(num_items) for k in self.ks):
            raise ValueError(f"model.ks={list(ks)}: each cut-off must lie in 1..{num_items} (data.num_items)")
        self.net = DotProductScorer(num_users, num_items, dim)
        self.loss = loss
        self.metrics = nn.ModuleDict({f"{stage}_{name}{k}": MeanListMetric(name, k)
                                      for stage in ("val", "test") for name in NAMES for k in self.ks})

    def forward(self, users: Tensor) -> Tensor:
        """Scores ``(B, num_items)``."""
        return self.net(users)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """One optimisation step on a batch of users; logs ``train/loss``."""
        users, positives = batch
        loss = self.loss(self(users), positives)
        self.log("train/loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(users))
        return loss

    def _eval_step(self, stage: str, batch: tuple[Tensor, Tensor, Tensor, Tensor]) -> None:
        users, _, targets, candidates = batch
        scores = self(users)
        for name in NAMES:
            for k in self.ks:
                metric = self.metrics[f"{stage}_{name}{k}"]
                metric(scores, targets, candidates)
                self.log(f"{stage}/{name}{k}", metric, on_step=False, on_epoch=True, prog_bar=(name, k) == ("ndcg", 10))

    def validation_step(self, batch: tuple[Tensor, Tensor, Tensor, Tensor], batch_idx: int) -> None:
        """Validation metrics (full ranking, training positives left out)."""
        self._eval_step("val", batch)

    def test_step(self, batch: tuple[Tensor, Tensor, Tensor, Tensor], batch_idx: int) -> None:
        """Test metrics (full ranking, training and validation positives left out)."""
        self._eval_step("test", batch)
