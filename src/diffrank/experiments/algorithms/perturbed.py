"""Perturbed optimizer with the Fenchel-Young loss (Berthet et al., NeurIPS 2020, §3–4), for the Warcraft
shortest path (Petersen's thesis Table 2.2 and Table 7.5, "PO w/ FY").

The shortest path is a maximiser over the paths' indicator vectors: ``y*(θ) = argmax_y ⟨θ, y⟩`` with
``θ = -c`` (the negated cost map). Gaussian perturbations smooth it:

    y_σ(θ) = E_Z[ argmax_y ⟨θ + σZ, y⟩ ],   F_σ(θ) = E_Z[ max_y ⟨θ + σZ, y⟩ ],   Z ~ N(0, I),

estimated with ``samples`` draws of Z per map. The Fenchel-Young loss ``L(θ; y) = F_σ(θ) - ⟨θ, y⟩ + Ω(y)`` has
the gradient ``∇_θ L = y_σ(θ) - y`` (Berthet et al., Prop. 4.1); Ω(y) does not depend on θ and is left out of
the value (so the value is a loss up to a constant per label, not a distance). With respect to the costs,
``∂L/∂c = -(y_σ - y)``.

The argmax is Dijkstra on the perturbed costs ``c - σZ``; Dijkstra needs non-negative costs, so they are
clamped at 0 (our choice, as the blackbox baseline clamps its perturbed costs; the perturbed value
``⟨θ + σZ, y⟩`` is evaluated on the unclamped θ + σZ).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.experiments.algorithms.dijkstra import shortest_paths


def perturbed_paths(costs: Tensor, sigma: float, samples: int, generator: torch.Generator | None = None
                    ) -> tuple[Tensor, Tensor]:
    """Monte-Carlo perturbed maximiser and perturbed max of ``⟨θ, y⟩`` with θ = -costs (no gradient).

    Args:
        costs: ``(B, k, k)`` float vertex costs.
        sigma: noise scale σ > 0 (cost units).
        samples: number M >= 1 of Gaussian draws per map.
        generator: optional torch generator for Z (default: the global one).

    Returns:
        ``(y_sigma (B, k, k), f_sigma (B,))``: the mean path over the draws (values in [0, 1]) and the mean of
        ``⟨θ + σZ, y_Z⟩`` over the draws, same dtype/device as ``costs``.

    Raises:
        ValueError: ``sigma <= 0``, ``samples < 1``, bad costs (shape, non-finite).

    Source: Berthet et al. (NeurIPS 2020), Eqs. 1–2 (perturbed maximiser / max), §3.
    """
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if int(samples) < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if costs.dim() != 3 or costs.shape[1] != costs.shape[2]:
        raise ValueError(f"costs must have shape (B, k, k), got {tuple(costs.shape)}")
    c = costs.detach()
    if c.numel() and not bool(torch.isfinite(c).all()):
        raise ValueError("costs must be finite (found NaN or inf)")
    z = torch.randn((int(samples), *c.shape), generator=generator, dtype=c.dtype, device=c.device)
    theta = -c.unsqueeze(0) + sigma * z  # (M, B, k, k)
    y = shortest_paths(torch.clamp(-theta, min=0.0).flatten(0, 1)).view_as(theta)
    return y.mean(0), (theta * y).flatten(2).sum(2).mean(0)


class _FenchelYoungLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, costs: Tensor, true_paths: Tensor, sigma: float, samples: int) -> Tensor:
        y_sigma, f_sigma = perturbed_paths(costs, sigma, samples)
        y = true_paths.to(costs.dtype)
        theta = -costs.detach()
        b = max(costs.shape[0], 1)
        # ∇_θ L = y_σ - y, so ∂L/∂c = -(y_σ - y); the batch mean divides by B
        ctx.save_for_backward((y - y_sigma) / b)
        return (f_sigma - (theta * y).flatten(1).sum(1)).mean()

    @staticmethod
    def backward(ctx, grad: Tensor):
        (d_costs,) = ctx.saved_tensors
        return grad * d_costs, None, None, None


def fenchel_young_loss(costs: Tensor, true_paths: Tensor, sigma: float = 1.0, samples: int = 3) -> Tensor:
    """Perturbed Fenchel-Young loss of predicted costs against label paths, mean over the batch (a scalar).

    Value: ``mean_b [F_σ(θ_b) - ⟨θ_b, y_b⟩]`` with θ = -costs (Ω(y) omitted: constant in θ). Gradient w.r.t.
    ``costs``: ``(y - y_σ) / B`` (i.e. ``∇_θ = (y_σ - y)/B``), with the same Monte-Carlo draws as the value.

    Args:
        costs: ``(B, k, k)`` float predicted vertex costs.
        true_paths: ``(B, k, k)`` 0/1 label paths.
        sigma: noise scale σ > 0 (cost units).
        samples: Monte-Carlo draws M per map (thesis Table 7.5: 3, 10, 30).

    Raises:
        ValueError: shapes differ, ``sigma <= 0``, ``samples < 1``, bad costs.

    Source: Berthet et al. (NeurIPS 2020), Def. 4.1 and Prop. 4.1 (Fenchel-Young loss of the perturbed max).
    """
    if tuple(true_paths.shape) != tuple(costs.shape):
        raise ValueError(f"costs {tuple(costs.shape)} and true_paths {tuple(true_paths.shape)} differ in shape")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if int(samples) < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    return _FenchelYoungLoss.apply(costs, true_paths, float(sigma), int(samples))


class PerturbedFenchelYoung:
    """Path-supervision loss: perturbed optimizer with Fenchel-Young loss (Berthet et al., NeurIPS 2020).

    Args:
        sigma: Gaussian noise scale σ (cost units; thesis Fig. 2.6 relates ε ∈ {0.5, 2} to β ∈ {1.5, 0.25}).
        samples: Monte-Carlo draws per map and step.

    Raises:
        ValueError: ``sigma <= 0`` or ``samples < 1``.
    """

    name = "perturbed"

    def __init__(self, sigma: float = 1.0, samples: int = 3) -> None:
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        if int(samples) < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.sigma, self.samples = float(sigma), int(samples)

    def loss(self, costs: Tensor, true_paths: Tensor) -> Tensor:
        """Scalar Fenchel-Young loss (:func:`fenchel_young_loss`) for costs and labels ``(B, k, k)``.

        Raises:
            ValueError: shapes differ, bad costs.
        """
        return fenchel_young_loss(costs, true_paths, self.sigma, self.samples)

    def per_sample_derivatives(self, flat_costs: Tensor, true_paths: Tensor, hessian: bool = False
                               ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Per-map value, gradient and Hessian of the Fenchel-Young loss with respect to the flattened costs.

        The loss of map b is F_σ(θ_b) − ⟨θ_b, y_b⟩ with θ = −c, so ∇_c = y − y_σ and ∇²_c = ∇²_θ F_σ = ∇_θ y_σ,
        whose Monte-Carlo estimate is E[y*(θ + σZ) Zᵀ] / σ (Berthet et al. 2020, Prop. 3.1, Gaussian Z),
        symmetrised; the same M draws give the gradient and the Hessian. The Newton losses of thesis Table 7.5
        ("PO w/ FY", Hessian / Fisher Newton) use them (:class:`~diffrank.losses.newton.NewtonLoss`).

        Args:
            flat_costs: ``(B, k²)`` float costs (detached).
            true_paths: ``(B, k, k)`` 0/1 labels.
            hessian: also estimate the Hessians.

        Returns:
            ``(value (), grads (B, k²), hessians (B, k², k²) or None)``, detached, dtype of the costs. The
            Hessian estimate has rank <= M: the Newton step needs ``tikhonov`` > 0.

        Raises:
            ValueError: shapes that do not match, non-finite costs.
        """
        if flat_costs.dim() != 2 or flat_costs.shape[0] != true_paths.shape[0] \
                or flat_costs.shape[1] != true_paths[0].numel():
            raise ValueError(f"flat_costs must have shape (B, k*k) = ({true_paths.shape[0]}, "
                             f"{true_paths[0].numel()}), got {tuple(flat_costs.shape)}")
        c = flat_costs.detach()
        if c.numel() and not bool(torch.isfinite(c).all()):
            raise ValueError("costs must be finite (found NaN or inf)")
        m, b = self.samples, c.shape[0]
        z = torch.randn((m, *c.shape), dtype=c.dtype, device=c.device)
        theta = -c.unsqueeze(0) + self.sigma * z  # (M, B, d)
        paths = shortest_paths(torch.clamp(-theta, min=0.0).view(m * b, *true_paths.shape[1:])).view_as(theta)
        y = true_paths.to(c.dtype).flatten(1)
        value = ((theta * paths).sum(2).mean(0) - (-c * y).sum(1)).mean()
        grads = y - paths.mean(0)
        hessians = None
        if hessian:
            h = torch.einsum("mbi,mbj->bij", paths, z) / (m * self.sigma)
            hessians = 0.5 * (h + h.transpose(1, 2))
        return value, grads, hessians

    def __repr__(self) -> str:
        return f"PerturbedFenchelYoung(sigma={self.sigma}, samples={self.samples})"


__all__ = ["PerturbedFenchelYoung", "fenchel_young_loss", "perturbed_paths"]
