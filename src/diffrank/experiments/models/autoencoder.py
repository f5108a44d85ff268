"""A small convolutional autoencoder: the feature net of the kNN+AE baseline (two-stage: the autoencoder is trained
to reconstruct the training images, then a hard kNN runs on its codes).

Source of the baseline: Grover et al. 2019 (§5.2, Table 3 there), copied by Xie et al. 2020 (§4.1, "autoencoder
(AE)" among the two-stage baselines; the number itself is not in their Table 1) and printed in LapSum (Struski et
al., ICML 2025) Table 3: MNIST 97.6 %, CIFAR-10 44.2 %. **None of the three papers gives the autoencoder's
architecture, code size, loss or training schedule**; the network below is ours (docs/knn.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


class ConvAutoEncoder(nn.Module):
    """Conv encoder (3×3 stride-2 convolutions + ReLU, then a linear layer to the code) and its mirror decoder
    (linear, 3×3 stride-2 transposed convolutions + ReLU, no output activation: the images are normalised per
    channel, not in [0, 1]). ``forward`` returns the code (the kNN features); :meth:`decode` maps a code back to
    an image, for the reconstruction loss.

    MNIST (``channels=(32, 64)``, ``code_dim=64``): 28 → 14 → 7, 64·7·7 → 64, 419 k parameters.
    CIFAR-10 (``channels=(32, 64, 128)``, ``code_dim=256``): 32 → 16 → 8 → 4, 128·4·4 → 256, the same family.
    These sizes are our choice: the papers do not give the autoencoder (module docstring).

    Args:
        image_shape: (C, H, W) of the input; H and W must be divisible by 2^len(channels).
        channels: output channels of the stride-2 convolutions (one halving of H and W each).
        code_dim: size of the code.

    Shapes: ``forward``: ``(B, C, H, W)`` float → ``(B, code_dim)``; :meth:`decode`: ``(B, code_dim)`` →
    ``(B, C, H, W)``; same dtype as the weights.

    Raises:
        ValueError: empty ``channels``, a non-positive size, or H / W not divisible by 2^len(channels).
    """

    def __init__(self, image_shape: Sequence[int] = (1, 28, 28), channels: Sequence[int] = (32, 64),
                 code_dim: int = 64) -> None:
        super().__init__()
        c, h, w = (int(v) for v in image_shape)
        channels = [int(v) for v in channels]
        if not channels or min(channels) < 1 or code_dim < 1 or c < 1:
            raise ValueError(f"need non-empty positive channels, code_dim >= 1, C >= 1; got {channels}, "
                             f"{code_dim}, C = {c}")
        f = 2 ** len(channels)
        if h % f or w % f:
            raise ValueError(f"image {h}x{w} must be divisible by 2^len(channels) = {f} (one halving per conv)")
        self.image_shape = (c, h, w)
        self.code_dim = int(code_dim)
        self._bottom = (channels[-1], h // f, w // f)
        flat = channels[-1] * (h // f) * (w // f)
        enc: list[nn.Module] = []
        for a, b in zip([c, *channels[:-1]], channels):
            enc += [nn.Conv2d(a, b, 3, stride=2, padding=1), nn.ReLU()]
        self.encoder = nn.Sequential(*enc, nn.Flatten(), nn.Linear(flat, self.code_dim))
        dec: list[nn.Module] = [nn.Linear(self.code_dim, flat), nn.ReLU(), nn.Unflatten(1, self._bottom)]
        ups = [*channels[::-1], c]
        for i, (a, b) in enumerate(zip(ups[:-1], ups[1:])):
            # output_padding=1 makes each transposed conv exactly double H and W (the encoder's inverse sizes)
            dec.append(nn.ConvTranspose2d(a, b, 3, stride=2, padding=1, output_padding=1))
            if i < len(ups) - 2:
                dec.append(nn.ReLU())
        self.decoder = nn.Sequential(*dec)

    def forward(self, x: Tensor) -> Tensor:
        """Codes ``(B, code_dim)`` of images ``(B, C, H, W)``."""
        return self.encoder(x)

    def decode(self, code: Tensor) -> Tensor:
        """Reconstructed images ``(B, C, H, W)`` from codes ``(B, code_dim)``.

        Raises:
            ValueError: ``code`` is not ``(B, code_dim)``.
        """
        if code.dim() != 2 or code.shape[1] != self.code_dim:
            raise ValueError(f"codes must be (B, {self.code_dim}), got {tuple(code.shape)}")
        return self.decoder(code)


__all__ = ["ConvAutoEncoder"]
