"""Blackbox differentiation of the exact shortest-path solver (Vlastelica et al., ICLR 2020, §3, Algorithm 1),
used as a Warcraft baseline in Petersen's thesis Table 2.2.

Forward: the exact Dijkstra path ``y = Y(c)`` of the cost map (piecewise constant in c). Backward: for the
incoming gradient ``g = ∂L/∂y`` the solver is called once more on the perturbed costs
``c' = max(c + λ·g, 0)`` (the clamp keeps Dijkstra's costs non-negative, as the reference code does), and the
gradient of the piecewise-linear interpolation of L∘Y is returned:

    ∂L/∂c ≈ -(y - y_λ) / λ,   y_λ = Y(c').

The training loss is the Hamming distance between the predicted path and the label,
``mean_b Σ_cells [y(1 - ŷ) + (1 - y)ŷ]``, on the costs ``|network output|`` (the reference code's ``abs``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.experiments.algorithms.dijkstra import shortest_paths


class _BlackboxShortestPath(torch.autograd.Function):
    @staticmethod
    def forward(ctx, costs: Tensor, lam: float) -> Tensor:
        paths = shortest_paths(costs.detach())
        ctx.save_for_backward(costs, paths)
        ctx.lam = lam
        return paths

    @staticmethod
    def backward(ctx, grad: Tensor):
        costs, paths = ctx.saved_tensors
        perturbed = torch.clamp(costs.detach() + ctx.lam * grad, min=0.0)
        return -(paths - shortest_paths(perturbed)) / ctx.lam, None


def blackbox_shortest_paths(costs: Tensor, lam: float = 20.0) -> Tensor:
    """Exact shortest paths whose backward pass is Vlastelica et al.'s blackbox gradient (module docstring).

    Args:
        costs: ``(B, k, k)`` float vertex costs >= 0.
        lam: interpolation strength λ > 0 (20 in the Warcraft experiments of Vlastelica et al., §5.1).

    Returns:
        ``(B, k, k)`` 0/1 path indicator (same dtype/device as ``costs``), start (0, 0) and goal (k-1, k-1)
        included; backward gives ``∂L/∂c = -(y - y_λ)/λ`` with ``y_λ`` the path of ``max(c + λ·∂L/∂y, 0)``.

    Raises:
        ValueError: ``lam <= 0`` or bad costs (shape, dtype, negative, non-finite; from ``shortest_paths``).

    Source: Vlastelica et al. (ICLR 2020), Eq. 6 / Algorithm 1.
    """
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    return _BlackboxShortestPath.apply(costs, float(lam))


def hamming_loss(pred_paths: Tensor, true_paths: Tensor) -> Tensor:
    """Hamming distance between paths, ``mean_b Σ_cells [y(1 - ŷ) + (1 - y)ŷ]`` (a scalar; units: cells).

    Args:
        pred_paths: ``(B, k, k)`` predicted (0/1 or relaxed) paths ŷ.
        true_paths: ``(B, k, k)`` 0/1 labels y.

    Raises:
        ValueError: shapes differ.

    Source: Vlastelica et al. (ICLR 2020, §5.1; the reference code's Hamming loss).
    """
    if tuple(pred_paths.shape) != tuple(true_paths.shape):
        raise ValueError(f"pred_paths {tuple(pred_paths.shape)} and true_paths {tuple(true_paths.shape)} differ")
    y = true_paths.to(pred_paths.dtype)
    return (y * (1.0 - pred_paths) + (1.0 - y) * pred_paths).flatten(1).sum(1).mean()


class BlackboxDijkstra:
    """Path-supervision loss with blackbox differentiation of Dijkstra (Vlastelica et al., ICLR 2020).

    ``loss(costs, true_paths)`` = Hamming loss of ``blackbox_shortest_paths(|costs|, lam)`` against the label.

    Args:
        lam: interpolation strength λ (default 20, Vlastelica et al. §5.1 for Warcraft).

    Raises:
        ValueError: ``lam <= 0``.
    """

    name = "blackbox"

    def __init__(self, lam: float = 20.0) -> None:
        if not lam > 0:
            raise ValueError(f"lam must be > 0, got {lam}")
        self.lam = float(lam)

    def loss(self, costs: Tensor, true_paths: Tensor) -> Tensor:
        """Scalar Hamming loss for predicted costs ``(B, k, k)`` and 0/1 labels ``(B, k, k)``.

        Raises:
            ValueError: shapes differ, or non-finite costs.
        """
        return hamming_loss(blackbox_shortest_paths(costs.abs(), self.lam), true_paths)

    def __repr__(self) -> str:
        return f"BlackboxDijkstra(lam={self.lam})"


__all__ = ["BlackboxDijkstra", "blackbox_shortest_paths", "hamming_loss"]
