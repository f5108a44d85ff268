"""Sampling-based path-supervision losses for the Warcraft shortest path (Petersen's thesis §7.5.3): stochastic
smoothing of the loss, stochastic smoothing of the algorithm (Table 7.5) and RESGRO (Tables 7.6, 7.7).

Each is an *algorithm* of ``configs/algorithm/`` (an object with ``loss(costs (B, k, k), true_paths (B, k, k)) ->
scalar`` and a ``name``) built on the torch-only library estimators (:mod:`diffrank.losses.smoothing`,
:mod:`diffrank.losses.resgro`) and the exact Dijkstra of :mod:`diffrank.experiments.algorithms.dijkstra`.
Samples are drawn around the predicted costs, so perturbed costs can be negative; Dijkstra needs costs >= 0
and gets them clamped at 0 (as the blackbox baseline and the perturbed optimizer do). The thesis gives neither
the noise scale σ nor the loss after the smoothed algorithm; ours are in ``docs/warcraft.md`` ("What is inferred").

The costs are flattened to ``(B, k²)`` for the estimators: the smoothed loss's per-sample derivatives (and the
Newton losses on top, :mod:`diffrank.experiments.algorithms.newton`) live in R^{k²}.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from diffrank.experiments.algorithms.dijkstra import shortest_paths
from diffrank.losses.resgro import ResgroLoss, path_hamming_objective
from diffrank.losses.smoothing import SmoothedAlgorithm, SmoothedLoss, check_noise

LOSSES = ("l1", "l2sq")


def _check_pair(costs: Tensor, true_paths: Tensor) -> int:
    """k of a (B, k, k) cost map with a label of the same shape; raises ValueError otherwise."""
    if not isinstance(costs, Tensor) or not costs.is_floating_point() or costs.dim() != 3 \
            or costs.shape[1] != costs.shape[2]:
        raise ValueError(f"costs must be a floating tensor of shape (B, k, k), got "
                         f"{getattr(costs, 'shape', type(costs))} {getattr(costs, 'dtype', '')}")
    if tuple(true_paths.shape) != tuple(costs.shape):
        raise ValueError(f"costs {tuple(costs.shape)} and true_paths {tuple(true_paths.shape)} differ in shape")
    return costs.shape[1]


def exact_paths(costs: Tensor) -> Tensor:
    """Exact shortest paths of possibly negative candidate costs: Dijkstra on ``max(costs, 0)``.

    Args:
        costs: ``(N, k, k)`` float costs (any sign; NaN / inf refused by Dijkstra).

    Returns:
        ``(N, k, k)`` 0/1 paths, dtype and device of ``costs``, no gradient.

    Raises:
        ValueError: bad shape or non-finite costs.
    """
    return shortest_paths(costs.detach().clamp_min(0.0))


def per_map_loss(paths: Tensor, true_paths: Tensor, kind: str) -> Tensor:
    """``(N,)`` loss of (relaxed or exact) paths against 0/1 labels, summed over the k² cells.

    Args:
        paths: ``(N, k, k)`` float paths in [0, 1].
        true_paths: ``(N, k, k)`` 0/1 labels.
        kind: ``"l1"`` Σ|p − y| (the Hamming distance on 0/1 paths) or ``"l2sq"`` Σ(p − y)².

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in LOSSES:
        raise ValueError(f"unknown loss {kind!r}; choose one of {LOSSES}")
    diff = (paths - true_paths.to(paths.dtype)).flatten(1)
    return diff.abs().sum(1) if kind == "l1" else diff.pow(2).sum(1)


class SmoothedLossDijkstra:
    """Stochastic smoothing of algorithm + loss as one unit ("SS of loss", thesis Table 7.5).

    The per-map loss ℓ(c) = Hamming distance between the exact path of c (Dijkstra on max(c, 0)) and the label is
    smoothed, E_ε[ℓ(c + ε)], and differentiated by the score-function estimator with the baseline ℓ(c) (thesis
    Lemma 2.1, :class:`~diffrank.losses.smoothing.SmoothedLoss`). ``per_sample_derivatives`` gives the per-map
    gradient and Hessian estimates in R^{k²} that the Hessian / Fisher Newton rows use.

    Args:
        samples: S draws per map and step (thesis: 3, 10, 30).
        sigma: noise scale σ > 0 (cost units; not given in the thesis).
        noise: ``"gaussian"`` or ``"cauchy"``.
        loss: ``"l1"`` (Hamming on the exact 0/1 path; equals ``"l2sq"`` there).

    Cost per step: (S + 1) Dijkstra calls per map.

    Raises:
        ValueError: bad samples / sigma / noise / loss.

    Source: Petersen, PhD thesis 2022, Lemma 2.1 and §7.5.3 (Table 7.5, "SS of loss").
    """

    name = "smoothed_loss"

    def __init__(self, samples: int = 10, sigma: float = 1.0, noise: str = "gaussian", loss: str = "l1") -> None:
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
        self.sigma, self.samples = check_noise(noise, sigma, samples)
        self.noise, self.loss_kind = noise, loss
        self._smoothed = SmoothedLoss(self._per_map, samples=self.samples, scale=self.sigma, noise=noise)

    def _per_map(self, flat: Tensor, true_paths: Tensor) -> Tensor:
        """``(N,)`` loss of the exact paths of flattened costs ``(N, k²)`` against labels ``(N, k, k)``."""
        costs = flat.view(true_paths.shape)
        return per_map_loss(exact_paths(costs), true_paths, self.loss_kind)

    def loss(self, costs: Tensor, true_paths: Tensor) -> Tensor:
        """Scalar Monte-Carlo smoothed loss (mean over maps); its gradient is the score-function estimate.

        Raises:
            ValueError: shapes differ, non-floating or non-finite costs.
        """
        _check_pair(costs, true_paths)
        return self._smoothed(costs.flatten(1), true_paths)

    def per_sample_derivatives(self, flat_costs: Tensor, true_paths: Tensor, hessian: bool = False
                               ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(value (), grads (B, k²), hessians (B, k², k²) or None)`` of the smoothed per-map losses (detached);
        the Newton losses' derivatives (:class:`~diffrank.losses.newton.NewtonLoss`, ``derivatives="auto"``)."""
        return self._smoothed.per_sample_derivatives(flat_costs, true_paths, hessian=hessian)

    def __repr__(self) -> str:
        return (f"SmoothedLossDijkstra(samples={self.samples}, sigma={self.sigma}, noise={self.noise!r}, "
                f"loss={self.loss_kind!r})")


class SmoothedAlgorithmDijkstra:
    """Stochastic smoothing of the algorithm alone ("SS of algorithm", thesis Table 7.5).

    The exact path of c is smoothed, p(c) = E_ε[path(c + ε)] ∈ [0, 1]^{k×k}, differentiated by the score-function
    Jacobian estimate (:class:`~diffrank.losses.smoothing.SmoothedAlgorithm`), and the loss ``loss`` between p and
    the label is backpropagated through it. Second derivatives are not available (the thesis pairs it with the
    Fisher Newton loss only; the Hessian variants are refused with a message naming ``fisher``).

    Args:
        samples: S draws per map and step (thesis: 3, 10, 30).
        sigma: noise scale σ > 0 (cost units; not given in the thesis).
        noise: ``"gaussian"`` or ``"cauchy"``.
        loss: ``"l2sq"`` Σ(p − y)² (default) or ``"l1"`` Σ|p − y|; the thesis does not name it.

    Cost per step: (S + 1) Dijkstra calls per map.

    Raises:
        ValueError: bad samples / sigma / noise / loss.

    Source: Petersen, PhD thesis 2022, Lemma 2.1 and §7.5.3 (Table 7.5, "SS of algorithm").
    """

    name = "smoothed_algorithm"

    def __init__(self, samples: int = 10, sigma: float = 1.0, noise: str = "gaussian", loss: str = "l2sq") -> None:
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
        self.sigma, self.samples = check_noise(noise, sigma, samples)
        self.noise, self.loss_kind = noise, loss
        self._smoothed = SmoothedAlgorithm(exact_paths, samples=self.samples, scale=self.sigma, noise=noise)

    def path(self, costs: Tensor) -> Tensor:
        """Smoothed path ``(B, k, k)`` in [0, 1] of costs ``(B, k, k)``, differentiable (score-function Jacobian)."""
        return self._smoothed(costs)

    def loss(self, costs: Tensor, true_paths: Tensor) -> Tensor:
        """Scalar loss between the smoothed path and the label, mean over maps.

        Raises:
            ValueError: shapes differ, non-floating or non-finite costs.
        """
        _check_pair(costs, true_paths)
        return per_map_loss(self.path(costs), true_paths, self.loss_kind).mean()

    def __repr__(self) -> str:
        return (f"SmoothedAlgorithmDijkstra(samples={self.samples}, sigma={self.sigma}, noise={self.noise!r}, "
                f"loss={self.loss_kind!r})")


class ResgroDijkstra:
    """RESGRO for shortest-path supervision (thesis §7.4; Tables 7.6 bootstrapped, 7.7 one-set).

    M candidate cost maps c + ε per map, each scored by the Hamming distance between its exact path (Dijkstra on
    max(c + ε, 0)) and the label; the target z* is the best candidate (one-set, Eq. 7.46) or the bootstrapped
    expectation of the best of K-subsets (Eq. 7.47, S random subsets); the network regresses its costs onto z*
    with ½‖z* − c‖² (mean over maps).

    Args:
        samples: M candidates per map (Table 7.6: 6 … 100; Table 7.7: 3 … 100).
        subset_size: K < M for bootstrapped RESGRO, None for one-set (the thesis does not print K).
        sets: bootstrapped only: S random K-subsets (Table 7.6: 3 … 100); None = the exact expectation.
        sigma: noise scale σ > 0 (cost units; not given in the thesis).
        noise: ``"gaussian"`` or ``"cauchy"``.

    Cost per step: M Dijkstra calls per map.

    Raises:
        ValueError: bad samples / subset_size / sets / sigma / noise.

    Source: Petersen, PhD thesis 2022, §7.4 (Eqs. 7.44–7.47) and §7.5.3 (Tables 7.6, 7.7).
    """

    name = "resgro"

    def __init__(self, samples: int = 10, subset_size: int | None = None, sets: int | None = None,
                 sigma: float = 1.0, noise: str = "gaussian") -> None:
        self._resgro = ResgroLoss(path_hamming_objective(exact_paths), samples=samples, subset_size=subset_size,
                                  sets=sets, noise=noise, scale=sigma)
        self.samples, self.sigma, self.noise = self._resgro.samples, self._resgro.scale, noise
        self.subset_size, self.sets = self._resgro.subset_size, self._resgro.sets

    def loss(self, costs: Tensor, true_paths: Tensor) -> Tensor:
        """Scalar ½‖z* − c‖² towards the RESGRO target, mean over maps.

        Raises:
            ValueError: shapes differ, non-floating or non-finite costs.
        """
        _check_pair(costs, true_paths)
        if costs.numel() and not bool(torch.isfinite(costs.detach()).all()):
            raise ValueError("costs must be finite (found NaN or inf)")
        return self._resgro(costs, true_paths)

    def __repr__(self) -> str:
        return (f"ResgroDijkstra(samples={self.samples}, subset_size={self.subset_size}, sets={self.sets}, "
                f"sigma={self.sigma}, noise={self.noise!r})")


__all__: list[Any] = ["ResgroDijkstra", "SmoothedAlgorithmDijkstra", "SmoothedLossDijkstra", "exact_paths",
                      "per_map_loss"]
