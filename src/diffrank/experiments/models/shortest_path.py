"""Shortest-path supervision on Warcraft maps (Petersen's thesis §2.4, §7.5.3; Vlastelica et al., ICLR 2020, §5.1).

A CNN maps a terrain image to a k x k cost map; an *algorithm* (``configs/algorithm/``: the relaxed
Bellman-Ford of :mod:`diffrank.experiments.algorithms.bellman_ford`, blackbox Dijkstra, perturbed optimizer with
Fenchel-Young loss) turns the costs and the label path into a loss. Only the path is supervised; the true
costs are used for the cost-ratio metric only.

- :class:`CombResNet18`: the network of the thesis / Vlastelica et al. ("CombResnet18"): the first five
  layers of a randomly initialised torchvision ResNet-18 (conv1, bn1, ReLU, max-pool, layer1), adaptive max
  pooling to k x k, mean over the 64 channels.
- :class:`ShortestPathModule`: the Lightning module; evaluation runs exact Dijkstra on the predicted costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from diffrank.experiments.metrics.shortest_path import CostRatio, PathExactMatch, predicted_paths
from diffrank.experiments.models.base import ConfiguredModule


class CombResNet18(nn.Module):
    """Cost map from an image: ``(B, C, H, W)`` float -> ``(B, k, k)`` float >= 0.

    conv1 (7x7, stride 2, no bias) -> bn1 -> ReLU -> max-pool (3x3, stride 2) -> layer1 (two basic blocks,
    64 channels) -> ``AdaptiveMaxPool2d((k, k))`` -> mean over channels. For 3 x 96 x 96 maps the feature map
    before pooling is 64 x 24 x 24. Non-negative because layer1 ends in a ReLU.

    Args:
        grid: k, the side of the cost map.
        in_channels: image channels (3 for RGB; conv1 is rebuilt for other values).

    Raises:
        ValueError: ``grid < 1`` or ``in_channels < 1``.

    Source: thesis §2.4 ("first five layers of ResNet18 + adaptive max pooling + averaging");
    Vlastelica et al. (ICLR 2020, §5.1).
    """

    def __init__(self, grid: int = 12, in_channels: int = 3) -> None:
        super().__init__()
        if int(grid) < 1 or int(in_channels) < 1:
            raise ValueError(f"grid and in_channels must be >= 1, got {grid}, {in_channels}")
        from torchvision.models import resnet18

        r = resnet18(weights=None)
        if int(in_channels) != 3:
            r.conv1 = nn.Conv2d(int(in_channels), 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.features = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1)
        self.pool = nn.AdaptiveMaxPool2d((int(grid), int(grid)))
        self.grid = int(grid)

    def forward(self, x: Tensor) -> Tensor:
        """Cost maps ``(B, k, k)`` for images ``(B, C, H, W)``."""
        if x.dim() != 4:
            raise ValueError(f"images must be (B, C, H, W), got shape {tuple(x.shape)}")
        return self.pool(self.features(x)).mean(1)


class ShortestPathModule(ConfiguredModule):
    """Trains a cost network through a shortest-path algorithm's loss (thesis §2.4).

    Args:
        net: ``(B, 3, H, W) -> (B, k, k)`` costs (:class:`CombResNet18`).
        algorithm: an object with ``loss(costs (B, k, k), true_paths (B, k, k)) -> scalar`` and a ``name``
            (``configs/algorithm/*.yaml``; the model config points ``model.algorithm`` at ``${algorithm}``).
        optimizer: partial ``optimizer(params)`` (Adam 5e-4).
        scheduler: optional partial ``scheduler(optimizer)``, stepped every epoch (MultiStepLR [30, 40] x 0.1).
        compile: ``torch.compile`` the net at fit time.

    Batches: ``(maps (B, 3, H, W) float, true_costs (B, k, k) float, paths (B, k, k) 0/1 float)``.

    Logged: ``train/loss``; ``val/loss``, ``val/em_path``, ``val/cost_ratio``; ``test/loss``,
    ``test/em_path``, ``test/cost_ratio``. ``em_path`` is a fraction in [0, 1] (the hard path = exact Dijkstra
    on the predicted costs equals the label everywhere); the report matches it to the thesis' ``EM_path`` in %.
    """

    scheduler_interval = "epoch"

    def __init__(self, net: nn.Module, algorithm: Any, optimizer: Any, scheduler: Any = None,
                 compile: bool = False) -> None:
        super().__init__()
        if not callable(getattr(algorithm, "loss", None)):
            raise ValueError(f"algorithm must be an object with a loss(costs, true_paths) method, got "
                             f"{type(algorithm).__name__}")
        self.save_hyperparameters(logger=False, ignore=["net", "algorithm"])
        self.net = net
        self.algorithm = algorithm
        self.metrics = nn.ModuleDict({
            f"{stage}_{name}": cls() for stage in ("val", "test")
            for name, cls in (("em_path", PathExactMatch), ("cost_ratio", CostRatio))
        })

    def forward(self, maps: Tensor) -> Tensor:
        """Predicted cost maps ``(B, k, k)`` for images ``(B, C, H, W)``."""
        return self.net(maps)

    @staticmethod
    def _unpack(batch: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        if len(batch) < 3:
            raise ValueError(f"a Warcraft batch is (maps, true_costs, paths), got {len(batch)} items")
        return batch[0], batch[1], batch[2]

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        """One optimisation step; logs ``train/loss``.

        Raises:
            ValueError: a non-finite loss (the message names the algorithm).
        """
        maps, _, paths = self._unpack(batch)
        loss = self.algorithm.loss(self(maps), paths)
        if not bool(torch.isfinite(loss.detach())):
            raise ValueError(f"non-finite training loss {float(loss)} with {self.algorithm!r}")
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=len(paths))
        return loss

    def _eval_step(self, stage: str, batch: Sequence[Tensor]) -> None:
        maps, true_costs, paths = self._unpack(batch)
        costs = self(maps)
        self.log(f"{stage}/loss", self.algorithm.loss(costs, paths), on_step=False, on_epoch=True,
                 batch_size=len(paths), sync_dist=True)
        hard = predicted_paths(costs)
        em, ratio = self.metrics[f"{stage}_em_path"], self.metrics[f"{stage}_cost_ratio"]
        em(hard, paths)
        ratio(hard, paths, true_costs)
        self.log(f"{stage}/em_path", em, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f"{stage}/cost_ratio", ratio, on_step=False, on_epoch=True)

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        """Validation loss, exact-match path accuracy and cost ratio."""
        self._eval_step("val", batch)

    def test_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        """Test loss, exact-match path accuracy and cost ratio."""
        self._eval_step("test", batch)
