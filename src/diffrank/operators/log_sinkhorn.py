"""Log-domain Sinkhorn with ε-scaling, shared by SinkhornSort (Cuturi, Teboul, Vert, NeurIPS 2019) and the
Sinkhorn solver of SOFT top-k (Xie et al., NeurIPS 2020).

Entropic optimal transport of items i (masses μ_i) onto targets j (masses ν_j) under a cost C, per batch
row r: Γ = argmin ⟨Γ, C⟩ - ε H(Γ) subject to Γ1 = μ, Γᵀ1 = ν (Cuturi et al. 2019, §2, Eq. 3; Xie et al.
2020, Eq. 3). Iterated on the dual potentials (f, g), in log domain so that small ε does not underflow
(Xie et al. 2020, Alg. 1 written in log form):

    f_i ← ε log μ_i - ε LSE_j((g_j - C_ij) / ε),    g_j ← ε log ν_j - ε LSE_i((f_i - C_ij) / ε),

the target-side update last, so the target marginals Γᵀ1 = ν hold exactly after every iteration, and
Γ = exp((f + g - C) / ε).

**ε schedule (ε-scaling), the one convention of every operator that uses this solver.** With ε = 1/β the
target and c the cost scale, an upper bound of the cost entries:

    ε_0 = max(ε, epsilon_start · c),    ε_{t+1} = max(ε, anneal · ε_t),

the potentials warm-started from one ε to the next; ``epsilon_start = None`` runs at ε from the first
iteration (plain Sinkhorn). Starting relative to the cost scale makes the schedule independent of the
units of the scores. Near-hard plans (small ε) need thousands of plain iterations and tens with ε-scaling.
c is the bound the caller knows (SinkhornSort: 1, its points and targets lie in [0, 1]) or, when it knows
none (SOFT top-k on raw scores), each batch row's largest entry c_r = max_ij C_rij, detached: then the
schedule is data-dependent and is not differentiated, which is exact only for a converged plan.

**Stopping.** Once every row has reached ε, every ``check_every`` iterations (and at ``max_iter``) the
item-marginal error max_{r,i} |Σ_j Γ_rij / μ_ri - 1| is read (one host synchronisation per check), and the
loop stops below ``tolerance``; ``tolerance = None`` runs exactly ``max_iter`` iterations (annealing
included). The iterations are plain tensor operations, so autograd differentiates through them
(Cuturi et al. 2019, §3) unless the caller runs them under its own backward (SOFT top-k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SinkhornSchedule:
    """The iteration settings of :func:`log_sinkhorn` (see the module docstring for their meaning).

    Attributes:
        max_iter: iteration cap, >= 1 (each iteration = one item-side and one target-side update).
        tolerance: item-marginal error at which to stop, > 0, or ``None`` (always ``max_iter`` iterations).
        check_every: iterations between marginal checks once ε is reached, >= 1.
        epsilon_start: ε-scaling start as a fraction of the cost scale, > 0, or ``None`` (no scaling).
        anneal: factor per iteration of the ε-scaling, in (0, 1).

    Raises:
        ValueError: for a setting outside its range.
    """

    max_iter: int = 2000
    tolerance: float | None = 1e-6
    check_every: int = 10
    epsilon_start: float | None = 1.0
    anneal: float = 0.9

    def __post_init__(self) -> None:
        if int(self.max_iter) < 1 or int(self.check_every) < 1:
            raise ValueError(f"max_iter and check_every must be >= 1, got {self.max_iter}, {self.check_every}")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError(f"tolerance must be > 0 or None, got {self.tolerance}")
        if self.epsilon_start is not None and not (math.isfinite(self.epsilon_start) and self.epsilon_start > 0):
            raise ValueError(f"epsilon_start must be a finite positive number or None, got {self.epsilon_start}")
        if not 0 < self.anneal < 1:
            raise ValueError(f"anneal must be in (0, 1), got {self.anneal}")
        for name, cast in (("max_iter", int), ("check_every", int), ("anneal", float)):
            object.__setattr__(self, name, cast(getattr(self, name)))
        for name in ("tolerance", "epsilon_start"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))


def log_sinkhorn(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float, schedule: SinkhornSchedule,
                 cost_scale: float | None = None) -> tuple[Tensor, int, float]:
    """log Γ of the entropic OT plan by log-domain Sinkhorn with the ε schedule of the module docstring.

    Args:
        cost: ``(R, n, m)`` cost C (items × targets), float32 or float64.
        log_mu: ``(R or 1, n)`` log item masses; log_nu: ``(R or 1, m)`` log target masses (each sums to 1).
        epsilon: the target ε > 0.
        schedule: iteration settings.
        cost_scale: the cost scale c of the ε schedule (an upper bound of the entries of ``cost``), or
            ``None`` for each row's largest entry (one host read).

    Returns:
        ``(log Γ (R, n, m), iterations used, last measured item-marginal error)``; the error is ``nan``
        when ``schedule.tolerance`` is None. log Γ is formed with the last ε used (ε itself unless
        ``max_iter`` ran out during the scaling).
    """
    R, n, m = cost.shape
    log_mu, log_nu = log_mu.unsqueeze(-1), log_nu.unsqueeze(-2)  # (R, n, 1), (R, 1, m)
    f = cost.new_zeros(R, n, 1)
    g = cost.new_zeros(R, 1, m)
    start: Tensor | float = epsilon  # ε_0, per row (R, 1, 1) when the scale is the rows' largest cost
    if schedule.epsilon_start is not None and cost_scale is not None:
        start = max(epsilon, schedule.epsilon_start * cost_scale)
    elif schedule.epsilon_start is not None:
        start = (schedule.epsilon_start * cost.detach().amax(dim=(1, 2), keepdim=True)).clamp_min(epsilon)
    top = start if isinstance(start, float) else float(start.max())  # one host read for the schedule's length
    scaling = math.ceil(math.log(epsilon / top) / math.log(schedule.anneal)) if top > epsilon else 0
    it, err = 0, float("nan")
    eps: Tensor | float = epsilon
    while it < schedule.max_iter:
        if it < scaling:  # iterations at ε_t = max(ε, anneal^t · ε_0) > ε for some row
            decayed = start * schedule.anneal ** it
            eps = max(epsilon, decayed) if isinstance(decayed, float) else decayed.clamp_min(epsilon)
        else:
            eps = epsilon
        f = eps * log_mu - eps * torch.logsumexp((g - cost) / eps, dim=2, keepdim=True)
        g = eps * log_nu - eps * torch.logsumexp((f - cost) / eps, dim=1, keepdim=True)
        it += 1
        at_target = it > scaling
        if schedule.tolerance is None or not (at_target and it % schedule.check_every == 0 or it == schedule.max_iter):
            continue
        with torch.no_grad():
            row = torch.logsumexp((f + g - cost) / eps, dim=2, keepdim=True)
            err = float((torch.exp(row - log_mu) - 1).abs().max())
        if at_target and err < schedule.tolerance:
            break
    return (f + g - cost) / eps, it, err
