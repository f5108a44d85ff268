"""Newton losses on the Warcraft path-supervision losses (Petersen's thesis §7.3, §7.5.3, Tables 7.4, 7.5).

An algorithm of ``configs/algorithm/`` is the run's loss (``algorithm.loss(costs (B, k, k), true_paths)``); the
Newton loss (:class:`~diffrank.losses.newton.NewtonLoss`) needs a loss of a ``(B, d)`` output. :class:`AlgorithmLoss`
is that loss on the costs flattened to d = k² (144 for 12 × 12 maps), and :class:`NewtonAlgorithm` the algorithm
the module trains with: its loss is the Newton loss ½‖z* − c‖² with z* = c − (M + λI)⁻¹ g per map. ``newton=<variant>``
on a Warcraft run builds it (``diffrank.experiments.run.train.build``).

Derivatives: an algorithm with its own ``per_sample_derivatives`` (stochastic smoothing of the loss, the perturbed
optimizer's Fenchel-Young loss) provides the estimates; the others (relaxed Bellman-Ford, smoothing of the algorithm)
are differentiated by autograd, Fisher only where second derivatives are unavailable (smoothing of the algorithm
is a custom autograd Function: the Hessian variants are refused with a message naming ``fisher``). The relaxed
Bellman-Ford's Hessian would take k² = 144 double-backward passes per step; the thesis uses Fisher only there.
Cost per step on top of the algorithm: its per-map gradients (one backward pass, or the estimator's own) and one
144 × 144 solve per batch (``hessian``, ``fisher``) or per map (``elementwise_hessian``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from diffrank.losses.newton import NewtonLoss


class AlgorithmLoss:
    """An algorithm's loss as a loss of flattened costs: ``loss(flat (B, k²), true_paths (B, k, k)) -> scalar``.

    Args:
        algorithm: an object with ``loss(costs (B, k, k), true_paths (B, k, k)) -> scalar`` (the batch mean of
            per-map losses) and optionally ``per_sample_derivatives(flat, true_paths, hessian)``, which this
            object then exposes under the same name.

    Raises:
        ValueError: an ``algorithm`` without a callable ``loss``; at call time, flattened costs that do not
            have k² entries per map.
    """

    def __init__(self, algorithm: Any) -> None:
        if not callable(getattr(algorithm, "loss", None)):
            raise ValueError(f"algorithm must have a loss(costs, true_paths) method, got {type(algorithm).__name__}")
        self.algorithm = algorithm
        own = getattr(algorithm, "per_sample_derivatives", None)
        if callable(own):
            self.per_sample_derivatives = own

    def __call__(self, flat: Tensor, true_paths: Tensor) -> Tensor:
        """The algorithm's scalar loss of ``flat.view(true_paths.shape)``."""
        if flat.dim() != 2 or flat.shape[0] != true_paths.shape[0] or flat.shape[1] != true_paths[0].numel():
            raise ValueError(f"flattened costs must have shape (B, k*k) = ({true_paths.shape[0]}, "
                             f"{true_paths[0].numel()}), got {tuple(flat.shape)}")
        return self.algorithm.loss(flat.reshape(true_paths.shape), true_paths)


class NewtonAlgorithm:
    """An algorithm trained through a Newton loss (thesis §7.3, Eqs. 7.24–7.27) on its flattened cost map.

    Args:
        algorithm: the wrapped algorithm (``configs/algorithm/``).
        variant: ``"hessian"``, ``"fisher"`` or ``"elementwise_hessian"``.
        tikhonov: λ ≥ 0 (the Fisher and the sampled Hessians of few samples are singular: λ > 0 is needed).
        float64: take the derivatives of a float64 copy of the costs.

    ``loss(costs (B, k, k), true_paths (B, k, k)) -> scalar``: in training, the batch mean of ½‖z*_b − c_b‖²;
    without autograd (validation, test) the wrapped algorithm's loss, so ``val/loss`` compares with Regular.
    ``name`` is ``<algorithm>+<variant>``.

    Raises:
        ValueError: what :class:`AlgorithmLoss` and :class:`~diffrank.losses.newton.NewtonLoss` raise.

    Source: Petersen, PhD thesis 2022, §7.3 (Definitions 7.1–7.3) and §7.5.3 (Tables 7.4, 7.5).
    """

    def __init__(self, algorithm: Any, variant: str = "fisher", tikhonov: float = 0.0, float64: bool = False) -> None:
        self.algorithm = algorithm
        self.newton = NewtonLoss(AlgorithmLoss(algorithm), variant=variant, tikhonov=tikhonov, float64=float64)
        self.variant, self.tikhonov = variant, self.newton.tikhonov
        self.name = f"{getattr(algorithm, 'name', type(algorithm).__name__)}+{variant}"

    def loss(self, costs: Tensor, true_paths: Tensor) -> Tensor:
        """Scalar Newton loss of the cost maps ``(B, k, k)`` (the wrapped loss without autograd)."""
        if costs.dim() != 3 or tuple(true_paths.shape) != tuple(costs.shape):
            raise ValueError(f"costs {tuple(costs.shape)} and true_paths {tuple(true_paths.shape)} must both be "
                             "(B, k, k)")
        return self.newton(costs.flatten(1), true_paths)

    def __repr__(self) -> str:
        return f"NewtonAlgorithm({self.algorithm!r}, variant={self.variant!r}, tikhonov={self.tikhonov})"


def with_newton(algorithm: Any, variant: str = "none", tikhonov: float = 0.0, float64: bool = False, **_: Any) -> Any:
    """The ``newton`` group's choice applied to a Warcraft algorithm: itself for ``"none"``, else a
    :class:`NewtonAlgorithm` (the other keys of the group's config, e.g. ``_target_``, are ignored).

    Raises:
        ValueError: an unknown variant, a bad ``tikhonov``.
    """
    if variant in (None, "none"):
        return algorithm
    return NewtonAlgorithm(algorithm, variant=variant, tikhonov=tikhonov, float64=float64)


__all__ = ["AlgorithmLoss", "NewtonAlgorithm", "with_newton"]
