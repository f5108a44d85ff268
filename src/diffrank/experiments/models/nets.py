"""Backbones built from configs (``model.net``); timm models are used directly through ``timm.create_model``."""

from __future__ import annotations

import math
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



def _flat_size(features: nn.Module, image_shape: Sequence[int]) -> int:
    with torch.no_grad():
        return int(features(torch.zeros(1, *(int(v) for v in image_shape))).numel())


class FullyConnected(nn.Module):
    """A fully connected network on flattened images: ``depth`` linear layers, ``depth − 1`` hidden layers of
    ``width`` units with ReLU between them (thesis Table 7.1's M1–M3: depth 5, width 100 / 400 / 1 600; Petersen,
    PhD thesis 2022, §7.5.1, which gives depth, widths and activation but not the initialisation: PyTorch's
    default here).

    Args:
        num_classes: output scores.
        image_shape: (C, H, W) of the input; C·H·W inputs.
        width: hidden units per layer.
        depth: linear layers (≥ 1; 1 is a linear classifier).

    Shapes: ``(B, C, H, W)`` float → ``(B, num_classes)`` scores.

    Raises:
        ValueError: ``depth`` < 1, ``width`` < 1 or ``num_classes`` < 1.
    """

    def __init__(self, num_classes: int, image_shape: Sequence[int] = (1, 28, 28), width: int = 100,
                 depth: int = 5) -> None:
        super().__init__()
        if depth < 1 or width < 1 or num_classes < 1:
            raise ValueError(f"need depth, width, num_classes >= 1, got {depth}, {width}, {num_classes}")
        sizes = [math.prod(int(v) for v in image_shape), *[int(width)] * (depth - 1), int(num_classes)]
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < depth - 1 else [])
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Scores ``(B, num_classes)`` for images ``(B, C, H, W)``."""
        return self.layers(x)


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) with a choice of activation (thesis Table 7.1's M4: sigmoid, M5: ReLU):
    conv 5×5 (6, padding 2) → act → avg-pool 2 → conv 5×5 (16) → act → avg-pool 2 → linear 400 → 120 → act →
    84 → act → ``num_classes``. The thesis names the model and its activations only; the padding that keeps
    28×28 MNIST at LeNet's 32×32 geometry and the average (sub-sampling) pools are the original's.

    Args:
        num_classes: output scores.
        image_shape: (C, H, W); 28×28 gives 16×5×5 = 400 inputs to the first linear layer.
        activation: ``"sigmoid"``, ``"relu"`` or ``"tanh"``.

    Shapes: ``(B, C, H, W)`` float → ``(B, num_classes)`` scores.

    Raises:
        ValueError: an unknown activation, or an image too small for the two conv + pool stages.
    """

    ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}

    def __init__(self, num_classes: int = 10, image_shape: Sequence[int] = (1, 28, 28),
                 activation: str = "relu") -> None:
        super().__init__()
        if activation not in self.ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(self.ACTIVATIONS)}, got {activation!r}")
        act = self.ACTIVATIONS[activation]
        self.features = nn.Sequential(nn.Conv2d(int(image_shape[0]), 6, 5, padding=2), act(), nn.AvgPool2d(2),
                                      nn.Conv2d(6, 16, 5), act(), nn.AvgPool2d(2), nn.Flatten())
        try:
            flat = _flat_size(self.features, image_shape)
        except RuntimeError as e:
            raise ValueError(f"image_shape {tuple(image_shape)} is too small for LeNet-5's conv + pool stages") from e
        self.head = nn.Sequential(nn.Linear(flat, 120), act(), nn.Linear(120, 84), act(),
                                  nn.Linear(84, int(num_classes)))

    def forward(self, x: Tensor) -> Tensor:
        """Scores ``(B, num_classes)`` for images ``(B, C, H, W)``."""
        return self.head(self.features(x))


class TwoLayerConvNet(nn.Module):
    """The 2-layer conv net of the deep kNN experiments on MNIST (Grover et al. 2019, §5.2; Xie et al. 2020,
    App. I Table 3): conv 5×5 (20) → ReLU → max-pool 2 → conv 5×5 (50) → ReLU → max-pool 2 → linear
    (``feature_dim``, 500 in the papers) → ReLU. It is the feature network f_θ: the classifier's last linear
    layer and softmax are not part of it (Xie et al. 2020, App. I).

    Args:
        image_shape: (C, H, W); 28×28 gives 4×4×50 = 800 inputs to the linear layer.
        channels: widths of the two conv layers.
        feature_dim: output features.
        padding: conv padding (0 as in the papers; 2 keeps 8×8 digits large enough for two pools).

    Shapes: ``(B, C, H, W)`` float32 → ``(B, feature_dim)`` float32, ≥ 0.

    Raises:
        ValueError: an image too small for the two conv + pool stages.
    """

    def __init__(self, image_shape: Sequence[int] = (1, 28, 28), channels: Sequence[int] = (20, 50),
                 feature_dim: int = 500, padding: int = 0) -> None:
        super().__init__()
        c1, c2 = (int(v) for v in channels)
        # pool before ReLU: the same values (max and ReLU commute) with a quarter of the ReLU work
        self.conv = nn.Sequential(nn.Conv2d(int(image_shape[0]), c1, 5, padding=padding), nn.MaxPool2d(2), nn.ReLU(),
                                  nn.Conv2d(c1, c2, 5, padding=padding), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten())
        try:
            flat = _flat_size(self.conv, image_shape)
        except RuntimeError as e:
            raise ValueError(f"image_shape {tuple(image_shape)} is too small for two 5x5 conv + 2x2 pool stages "
                             f"with padding {padding}") from e
        self.fc = nn.Sequential(nn.Linear(flat, int(feature_dim)), nn.ReLU())
        self.feature_dim = int(feature_dim)

    def forward(self, x: Tensor) -> Tensor:
        """Features ``(B, feature_dim)`` of images ``(B, C, H, W)``."""
        return self.fc(self.conv(x))


class CifarResNet18(nn.Module):
    """ResNet-18 for 32×32 images: torchvision's ResNet-18 (He et al. 2016; [2, 2, 2, 2] BasicBlocks) with a 3×3
    stride-1 stem.

    Two uses:

    - feature network (``num_classes=None``, the default; the CIFAR-10 deep kNN net, Xie et al. 2020, App. I):
      no stem max-pool (the usual CIFAR variant), no final linear layer: ``(B, 512)`` features;
    - classifier (``num_classes=n``; the CIFAR-100 top-k net of Petersen et al. 2022, §5.1): a linear layer
      512 → n after the pool. ``maxpool=true`` keeps torchvision's 3×3 stride-2 stem max-pool, as the difftopk
      code's CIFAR ResNet-18 does (the paper only says "ResNet-18"); the top-k protocol follows the code.

    Args:
        in_channels: image channels.
        num_classes: None (features) or the number of classes of the linear head.
        maxpool: keep the stem max-pool (halves the feature maps: 16×16 after the stem for 32×32 images).

    Shapes: ``(B, C, 32, 32)`` float32 → ``(B, 512)`` float32 features (≥ 0, after the global average pool), or
    ``(B, num_classes)`` float32 scores.

    Raises:
        ValueError: ``num_classes`` < 2.
    """

    def __init__(self, in_channels: int = 3, num_classes: int | None = None, maxpool: bool = False) -> None:
        super().__init__()
        import torchvision

        if num_classes is not None and int(num_classes) < 2:
            raise ValueError(f"num_classes must be >= 2 (or None for features), got {num_classes}")
        net = torchvision.models.resnet18(num_classes=10 if num_classes is None else int(num_classes))
        net.conv1 = nn.Conv2d(int(in_channels), 64, 3, stride=1, padding=1, bias=False)
        if not maxpool:
            net.maxpool = nn.Identity()
        if num_classes is None:
            net.fc = nn.Identity()
        self.net = net
        self.feature_dim = 512
        self.num_classes = None if num_classes is None else int(num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Features ``(B, 512)`` or scores ``(B, num_classes)`` of images ``(B, C, H, W)``."""
        return self.net(x)


class PixelFeatures(nn.Module):
    """Raw pixels as features (the kNN baseline of Grover et al. 2019 / Xie et al. 2020, Table 1).

    Shapes: ``(B, C, H, W)`` → ``(B, C·H·W)``, same dtype.
    """

    def forward(self, x: Tensor) -> Tensor:
        """Flattened images."""
        return x.flatten(1)


class PCAFeatures(nn.Module):
    """Projection on the top principal components of the training images (the kNN+PCA baseline, 50
    components; Grover et al. 2019, Xie et al. 2020 Table 1), fitted with scikit-learn's ``PCA``.

    Args:
        image_shape: (C, H, W) of the input.
        n_components: number of components.

    Shapes: ``(B, C, H, W)`` float32 → ``(B, n_components)`` float32.

    Raises:
        RuntimeError: ``forward`` before :meth:`fit` (the kNN module fits it on the training split).
    """

    def __init__(self, image_shape: Sequence[int] = (1, 28, 28), n_components: int = 50) -> None:
        super().__init__()
        d = 1
        for v in image_shape:
            d *= int(v)
        self.n_components = int(n_components)
        self.register_buffer("mean", torch.zeros(d))
        self.register_buffer("components", torch.zeros(self.n_components, d))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    def fit(self, images: Tensor) -> None:
        """Fit on ``(N, C, H, W)`` images (N ≥ n_components)."""
        from sklearn.decomposition import PCA

        pca = PCA(n_components=self.n_components, svd_solver="randomized", random_state=0)
        pca.fit(images.flatten(1).double().cpu().numpy())
        self.mean.copy_(torch.from_numpy(pca.mean_))
        self.components.copy_(torch.from_numpy(pca.components_))
        self.fitted.fill_(True)

    def forward(self, x: Tensor) -> Tensor:
        """Component scores ``(B, n_components)``."""
        if not self.fitted:
            raise RuntimeError("PCAFeatures.forward before fit(): fit it on the training images first")
        return (x.flatten(1) - self.mean) @ self.components.T
__all__ = ["CifarResNet18", "PCAFeatures", "PixelFeatures", "SmallCNN", "TwoLayerConvNet", "count_parameters"]
