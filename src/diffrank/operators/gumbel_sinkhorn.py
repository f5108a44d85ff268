"""Gumbel-Sinkhorn (Mena, Belanger, Linderman, Snoek, ICLR 2018): the Sinkhorn operator applied to a log-kernel
perturbed by Gumbel noise, S((X + σ·g) / τ), g i.i.d. Gumbel(0, 1) per entry (Mena et al. 2018, §3, the
Gumbel-Sinkhorn distribution; σ is their code's ``noise_factor``).

Two entry points:

- :class:`GumbelSinkhorn`, the operator (scores → P): X = log α = −β·C, the log-kernel of our
  :class:`~diffrank.operators.sinkhorn.SinkhornSort` at ε = 1/β (C its [0, 1] cost of squashed scores against
  the targets y_r), and τ = 1, so the plan is the entropic OT of the perturbed cost C − (σ/β)·g at ε = 1/β, solved
  by the same log-domain Sinkhorn (:mod:`diffrank.operators.log_sinkhorn`, same schedule and stopping rule).
  Without noise it is SinkhornSort, call for call (the same code on the same cost).
- :func:`gumbel_sinkhorn`, for a model that outputs the n × n log-kernel itself (Mena et al.'s and Grover et
  al. 2019's permutation-learning baselines): S((log α + σ·g)/τ) of a given ``(B, n, n)`` log α.

Noise, samples and reproducibility: :mod:`diffrank.operators.gumbel` (noise follows ``train()`` / ``eval()``
unless ``noise`` is set; ``samples`` > 1 adds a leading samples dimension).
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
from torch import Tensor

from diffrank.operators.base import data_checks_traced, raise_failed
from diffrank.operators.gumbel import GumbelSampling, gumbel
from diffrank.operators.log_sinkhorn import SinkhornSchedule, log_sinkhorn
from diffrank.operators.sinkhorn import SinkhornSort


class GumbelSinkhorn(GumbelSampling, SinkhornSort):
    """Gumbel-Sinkhorn relaxed permutation of scores (doubly stochastic up to the tolerance).

    Args:
        beta: inverse temperature; ε = 1/β as in :class:`~diffrank.operators.sinkhorn.SinkhornSort` (learnable
            as there).
        noise_scale: σ ≥ 0, the Gumbel noise in units of the log-kernel −β·C (Mena et al.'s ``noise_factor``,
            default 1 as in their code): the perturbed cost is C − (σ/β)·g.
        noise: None (noise in ``train()``, none in ``eval()``), True or False (see :mod:`diffrank.operators.gumbel`).
        samples: perturbations per set, S >= 1; S > 1 adds a leading dimension to every result.
        generator: a :class:`torch.Generator` for the noise (on the scores' device), or None for torch's global one.
        tolerance, max_iter, epsilon_start, anneal, check_every, backend: as in
            :class:`~diffrank.operators.sinkhorn.SinkhornSort` (the same solver; the fused kernel serves the
            perturbed cost too).

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``, or ``(S, B, k or n, n)`` for S > 1 (the other
    methods likewise, :mod:`diffrank.operators.gumbel`). ``soft_sort`` is ``P @ s`` of the unperturbed scores.

    Raises:
        ValueError: as SinkhornSort, and a negative or non-finite ``noise_scale``, a bad ``noise`` / ``samples``.
        TypeError: a ``generator`` that is not a :class:`torch.Generator`.

    Warns:
        RuntimeWarning: the item marginals are still above ``tolerance`` after ``max_iter`` iterations.
    """

    paper = ("Mena, Belanger, Linderman, Snoek, ICLR 2018, §3 "
             "(Gumbel-Sinkhorn; log α = −β·C of our Sinkhorn, Cuturi et al. 2019)")
    parameter = "ε = 1/β (entropic regularisation, on scores squashed to [0, 1])"

    def __init__(self, beta: float | Tensor = 100.0, noise_scale: float = 1.0, noise: bool | None = None,
                 samples: int = 1, generator: torch.Generator | None = None, tolerance: float | None = 1e-2,
                 max_iter: int = 2000, epsilon_start: float | None = 0.1, anneal: float = 0.95, check_every: int = 5,
                 backend: str = "auto") -> None:
        super().__init__(beta, tolerance, max_iter, epsilon_start, anneal, check_every, backend)
        self.noise_scale = _check_noise_scale(noise_scale)
        self._init_sampling(noise, samples, generator)

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Rows of P of the perturbed plan, ``(B, k or n, n)`` or ``(S, B, k or n, n)``."""
        self._check_range(scores)
        B, n = scores.shape
        if n == 1:
            return self._expanded(torch.ones_like(scores).unsqueeze(-1) + 0 * scores.unsqueeze(-1))
        cost = self._cost(scores)
        if not self.noisy or self.noise_scale == 0:
            return self._expanded(self._plan(cost, k))
        g = gumbel((self.samples, B, n, n), cost, self.generator)
        perturbed = cost.unsqueeze(0) - (self.noise_scale / self.beta) * g  # log α + σ g = −β (C − σ g / β)
        return self._samples_out(self._plan(perturbed.flatten(0, 1), k))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, noise_scale={self.noise_scale}, {self._sampling_repr()}"


def _check_noise_scale(noise_scale: float) -> float:
    """σ as a float.

    Raises:
        ValueError: not a number, not finite or negative.
    """
    if isinstance(noise_scale, bool) or not isinstance(noise_scale, numbers.Real) or not (
            math.isfinite(noise_scale) and noise_scale >= 0):
        raise ValueError(f"noise_scale must be a finite number >= 0, got {noise_scale!r}")
    return float(noise_scale)


def _check_tau(tau: float | Tensor) -> float | Tensor:
    """τ validated under its name: a float, or the 0-d tensor of a tensor τ that requires grad (kept in the graph,
    learnable as the operators' β; its value read once, not under ``torch.compile`` / ``vmap``).

    Raises:
        ValueError: not one real number, not finite or not > 0; a tensor τ on the meta device.
    """
    if isinstance(tau, Tensor):
        if tau.numel() != 1 or tau.is_complex() or tau.dtype == torch.bool:
            raise ValueError(f"tau must be one real number (a float or a one-element tensor), got a tensor of shape "
                             f"{tuple(tau.shape)}, dtype {tau.dtype}")
        if tau.is_meta:
            raise ValueError("tau is on the meta device: it has a shape but no value; pass a float or a tensor with a "
                             "value")
        if tau.requires_grad:
            tau = tau.reshape(())
            if not data_checks_traced(tau):
                _check_tau(float(tau.detach()))
            return tau
        tau = float(tau)
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau (the temperature) must be a finite number > 0, got {tau!r}")
    return float(tau)


def _check_arguments(log_alpha: Tensor, tau: float | Tensor, noise_scale: float, samples: int,
                     generator: torch.Generator | None,
                     schedule: SinkhornSchedule | None) -> tuple[float | Tensor, float]:
    """:func:`gumbel_sinkhorn`'s arguments checked (its Raises); returns the validated ``(τ, σ)``."""
    if not isinstance(log_alpha, Tensor) or not log_alpha.is_floating_point():
        raise TypeError("log_alpha must be a floating-point torch.Tensor, got "
                        + (f"dtype {log_alpha.dtype}" if isinstance(log_alpha, Tensor) else type(log_alpha).__name__))
    if log_alpha.dim() != 3 or log_alpha.shape[1] != log_alpha.shape[2]:
        raise ValueError(f"log_alpha must have shape (B, n, n), got {tuple(log_alpha.shape)}")
    if log_alpha.is_meta:
        raise ValueError("log_alpha is on the meta device: it has a shape but no values to normalise")
    epsilon = _check_tau(tau)
    noise_scale = _check_noise_scale(noise_scale)
    if schedule is not None and not isinstance(schedule, SinkhornSchedule):
        raise TypeError(f"schedule must be a SinkhornSchedule or None, got {type(schedule).__name__} (e.g. "
                        "SinkhornSchedule(max_iter=500, tolerance=1e-3, epsilon_start=None))")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    # −inf is a mask (a forbidden assignment, weight 0); NaN and +inf have no meaning and would turn every entry NaN
    raise_failed([(~(log_alpha.isnan() | (log_alpha == math.inf)).any(),
                   ValueError("log_alpha contains NaN or +inf (−inf, a masked entry, is allowed)"))])
    return epsilon, noise_scale


def gumbel_sinkhorn(log_alpha: Tensor, tau: float | Tensor = 1.0, *, noise_scale: float = 1.0, noise: bool = True,
                    samples: int = 1, generator: torch.Generator | None = None,
                    schedule: SinkhornSchedule | None = None) -> Tensor:
    """The Gumbel-Sinkhorn operator S((log α + σ·g)/τ) of a log-kernel (Mena et al. 2018, §3): the doubly stochastic
    matrix closest, in the entropic sense, to exp((log α + σ·g)/τ), by log-domain Sinkhorn.

    Args:
        log_alpha: ``(B, n, n)`` float32 / float64 log-kernel (e.g. a network's n × n logits): finite, or −inf for
            a forbidden (masked) entry; NaN and +inf raise (one host read, skipped under ``torch.compile`` /
            ``vmap``).
        tau: temperature τ > 0 (ε of the entropic OT whose cost is −log α): a number, or a one-element tensor; one
            that requires grad (e.g. an ``nn.Parameter``) stays in the graph and ``tau.grad`` fills (autograd through
            the iterations at τ, as SinkhornSort's learnable β).
        noise_scale: σ >= 0 (Mena et al.'s ``noise_factor``).
        noise: draw the noise (False: the Sinkhorn operator S(log α / τ) itself).
        samples: S >= 1 perturbations per matrix.
        generator: a :class:`torch.Generator` for the noise (on ``log_alpha``'s device), or None (global).
        schedule: the iterations (:class:`~diffrank.operators.log_sinkhorn.SinkhornSchedule`); None (default) is
            plain Sinkhorn at τ (Mena et al. iterate a fixed number of times, 20 in their code; here the loop stops once
            the column sums are within 1e-3 of 1, at most 200 iterations).

    Returns:
        ``(B, n, n)``, or ``(S, B, n, n)`` for S > 1, same layout as ``log_alpha``: rows sum to 1 exactly (the last
        normalisation), columns within the schedule's tolerance (a ``RuntimeWarning`` says when they are not).

    Raises:
        ValueError: ``log_alpha`` not 3-D square, on the meta device, or holding NaN / +inf; τ not a finite number
            > 0; a negative or non-finite σ; ``samples`` < 1.
        TypeError: ``log_alpha`` not a floating tensor; ``generator`` not a :class:`torch.Generator` or None;
            ``schedule`` not a :class:`~diffrank.operators.log_sinkhorn.SinkhornSchedule` or None.

    Warns:
        RuntimeWarning: the column sums are still further than the schedule's tolerance from 1 after its
            ``max_iter`` iterations (a small τ needs more: raise ``max_iter`` in ``schedule``, or τ).
    """
    epsilon, noise_scale = _check_arguments(log_alpha, tau, noise_scale, samples, generator, schedule)
    B, n, _ = log_alpha.shape
    x = log_alpha.unsqueeze(0).expand(samples, B, n, n)
    if noise and noise_scale > 0:
        x = x + noise_scale * gumbel(x.shape, log_alpha, generator)
    cost = -x.flatten(0, 1)
    # Sinkhorn is invariant to a constant added to a matrix: shifting each to a minimum of 0 (detached) keeps the
    # potentials O(range) whatever the logits' offset
    cost = cost - cost.detach().amin(dim=(1, 2), keepdim=True)
    # cost rows = log_alpha's columns, so that the last (target-side) update normalises log_alpha's rows
    log_w = cost.new_full((1, n), -math.log(n))
    schedule = schedule or SinkhornSchedule(max_iter=200, tolerance=1e-3, check_every=5, epsilon_start=None)
    log_t, iterations, err = log_sinkhorn(cost.transpose(1, 2), log_w, log_w, epsilon, schedule)
    if schedule.tolerance is not None and not err < schedule.tolerance:  # also NaN
        value = float(epsilon.detach()) if isinstance(epsilon, Tensor) else epsilon
        warnings.warn(f"gumbel_sinkhorn did not converge: column-sum error {err:.2e} > tolerance "
                      f"{schedule.tolerance:g} after {iterations} iterations (tau={value:g}, n={n}); columns of the "
                      "result may not sum to 1: raise max_iter (schedule=SinkhornSchedule(max_iter=...)) or tau",
                      RuntimeWarning, stacklevel=2)
    p = (log_t + math.log(n)).exp().transpose(1, 2)
    return p.unflatten(0, (samples, B)) if samples > 1 else p
