"""Backbones built from configs (``model.net``); timm models are used directly through ``timm.create_model``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class SmallCNN(nn.Module):
    """A small CNN for tiny images (sklearn digits, 8x8 or 8x16).

    Two 3x3 conv layers (32, 64 channels, ReLU), one 2x2 max-pool, a hidden fully connected layer and a
    linear head producing one score per class.

    Args:
        num_classes: number of output scores n.
        image_shape: (C, H, W) of the input; H and W must be even.
        hidden: width of the hidden layer.
        dropout: dropout before the head.

    Shapes: ``(B, C, H, W)`` float → ``(B, num_classes)`` scores.

    Raises:
        ValueError: for odd H or W, or num_classes < 1.
    """

    def __init__(self, num_classes: int, image_shape: Sequence[int] = (1, 8, 8), hidden: int = 256,
                 dropout: float = 0.2) -> None:
        super().__init__()
        c, h, w = (int(v) for v in image_shape)
        if h % 2 or w % 2:
            raise ValueError(f"image height and width must be even, got {(h, w)}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * (h // 2) * (w // 2), hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Scores ``(B, num_classes)`` for images ``(B, C, H, W)``."""
        return self.head(self.features(x))


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


__all__ = ["SmallCNN", "count_parameters", "torch"]
