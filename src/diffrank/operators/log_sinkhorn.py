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

**Fused kernel.** With ``kernel=True`` (SinkhornSort with ``backend`` ``"triton"``, or ``"auto"`` on CUDA)
the iterations run in the Triton kernel of ``diffrank/kernels/sinkhorn.py``: one program per batch row keeps its cost
tile and potentials on chip for every iteration between two checks (n, m <= 64 in float32, 32 in float64, the
tiles that compile without register spills: :func:`diffrank.kernels.sinkhorn.fused_size`; larger problems run
the PyTorch loop). It runs the same iterations with the same ε and the same checks. Its backward is the reverse
sweep that autograd takes through the PyTorch loop, fused in a second kernel over the potentials the forward
recorded (n + m numbers per iteration instead of several n x m tensors), so the gradient is the PyTorch
path's. It is differentiable once (no double backward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


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


def _epsilon_schedule(cost: Tensor, epsilon: float, schedule: SinkhornSchedule,
                      cost_scale: float | None) -> tuple[Tensor | float, int]:
    """ε_0 (a float, or per row ``(R, 1, 1)`` when the scale is the rows' largest cost) and the number of
    iterations with ε_t > ε for some row (one host read when ε_0 is per row)."""
    start: Tensor | float = epsilon
    if schedule.epsilon_start is not None and cost_scale is not None:
        start = max(epsilon, schedule.epsilon_start * cost_scale)
    elif schedule.epsilon_start is not None:
        start = (schedule.epsilon_start * cost.detach().amax(dim=(1, 2), keepdim=True)).clamp_min(epsilon)
    top = start if isinstance(start, float) else float(start.max())  # one host read for the schedule's length
    scaling = math.ceil(math.log(epsilon / top) / math.log(schedule.anneal)) if top > epsilon else 0
    return start, scaling


def _epsilon_at(it: int, start: Tensor | float, scaling: int, epsilon: float,
                schedule: SinkhornSchedule) -> Tensor | float:
    """ε of iteration ``it`` (0-based): max(ε, anneal^it · ε_0) during the scaling, then ε."""
    if it >= scaling:
        return epsilon
    decayed = start * schedule.anneal ** it
    return max(epsilon, decayed) if isinstance(decayed, float) else decayed.clamp_min(epsilon)


def _is_check(it: int, scaling: int, schedule: SinkhornSchedule) -> bool:
    """Whether the marginal error is read after ``it`` iterations (1-based count)."""
    return schedule.tolerance is not None and (it > scaling and it % schedule.check_every == 0
                                               or it == schedule.max_iter)


def log_sinkhorn(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float, schedule: SinkhornSchedule,
                 cost_scale: float | None = None, kernel: bool = False) -> tuple[Tensor, int, float]:
    """log Γ of the entropic OT plan by log-domain Sinkhorn with the ε schedule of the module docstring.

    Args:
        cost: ``(R, n, m)`` cost C (items × targets), float32 or float64.
        log_mu: ``(R or 1, n)`` log item masses; log_nu: ``(R or 1, m)`` log target masses (each sums to 1).
        epsilon: the target ε > 0.
        schedule: iteration settings.
        cost_scale: the cost scale c of the ε schedule (an upper bound of the entries of ``cost``), or
            ``None`` for each row's largest entry (one host read).
        kernel: run the iterations in the fused Triton kernel (``src/diffrank/kernels/sinkhorn.py``; CUDA, or the CPU
            under ``TRITON_INTERPRET=1``) when ``n, m <= 64`` (float32; 32 for float64:
            :func:`diffrank.kernels.sinkhorn.fused_size`), else (and by default) as PyTorch operations.
            Same result and gradient (see the module docstring).

    Returns:
        ``(log Γ (R, n, m), iterations used, last measured item-marginal error)``; the error is ``nan``
        when ``schedule.tolerance`` is None. log Γ is formed with the last ε used (ε itself unless
        ``max_iter`` ran out during the scaling).
    """
    if kernel:
        from diffrank.kernels.sinkhorn import fused_size

        if max(cost.shape[1], cost.shape[2]) <= fused_size(cost.dtype):
            return _log_sinkhorn_fused(cost, log_mu, log_nu, epsilon, schedule, cost_scale)
    R, n, m = cost.shape
    log_mu, log_nu = log_mu.unsqueeze(-1), log_nu.unsqueeze(-2)  # (R, n, 1), (R, 1, m)
    f = cost.new_zeros(R, n, 1)
    g = cost.new_zeros(R, 1, m)
    start, scaling = _epsilon_schedule(cost, epsilon, schedule, cost_scale)
    it, err = 0, float("nan")
    eps: Tensor | float = epsilon
    while it < schedule.max_iter:
        eps = _epsilon_at(it, start, scaling, epsilon, schedule)
        f = eps * log_mu - eps * torch.logsumexp((g - cost) / eps, dim=2, keepdim=True)
        g = eps * log_nu - eps * torch.logsumexp((f - cost) / eps, dim=1, keepdim=True)
        it += 1
        if not _is_check(it, scaling, schedule):
            continue
        with torch.no_grad():
            row = torch.logsumexp((f + g - cost) / eps, dim=2, keepdim=True)
            err = float((torch.exp(row - log_mu) - 1).abs().max())
        if it > scaling and err < schedule.tolerance:
            break
    return (f + g - cost) / eps, it, err


def _log_sinkhorn_fused(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float, schedule: SinkhornSchedule,
                        cost_scale: float | None) -> tuple[Tensor, int, float]:
    """:func:`log_sinkhorn` with the iterations in the Triton kernel: one launch per marginal check."""
    info: dict = {}
    log_t = _FusedSinkhorn.apply(cost, log_mu, log_nu, epsilon, schedule, cost_scale, info)
    return log_t, info["iterations"], info["error"]


def _epsilon_table(steps: list, like: Tensor) -> Tensor:
    """The ε of a run of iterations as the kernel reads it: ``(1, T)`` when every ε is a Python float (rounded
    to the cost dtype, as PyTorch does with a scalar operand), else ``(R, T)`` from the per-row values."""
    if all(isinstance(e, float) for e in steps):
        return torch.tensor(steps, dtype=like.dtype, device=like.device).view(1, -1)
    R = like.shape[0]
    return torch.cat([e.reshape(R, 1).to(like.dtype) if isinstance(e, Tensor) else like.new_full((R, 1), e)
                      for e in steps], dim=1)


class _FusedSinkhorn(torch.autograd.Function):
    """log Γ by the kernel's iterations (the schedule and checks of :func:`log_sinkhorn`); the backward runs
    the kernel's reverse sweep over the recorded potentials. ``info`` receives the iterations and the error."""

    @staticmethod
    def forward(ctx, cost, log_mu, log_nu, epsilon, schedule, cost_scale, info):
        from diffrank.kernels.sinkhorn import sinkhorn_updates

        R, n, m = cost.shape
        history = any(ctx.needs_input_grad[:3])
        start, scaling = _epsilon_schedule(cost, epsilon, schedule, cost_scale)
        f = cost.new_zeros(R, n)
        g = cost.new_zeros(R, m)
        it, err, runs = 0, float("nan"), []
        while it < schedule.max_iter:
            end = it + 1  # the run ends at the next check (or at max_iter)
            while end < schedule.max_iter and not _is_check(end, scaling, schedule):
                end += 1
            steps = [_epsilon_at(t, start, scaling, epsilon, schedule) for t in range(it, end)]
            table = _epsilon_table(steps, cost)
            check = _is_check(end, scaling, schedule)
            rows, past = sinkhorn_updates(cost, log_mu, log_nu, f, g, table, check, history)
            if history:
                runs.append((table, *past))
            it = end
            if check:
                err = float(rows.max())
                if it > scaling and err < schedule.tolerance:
                    break
        eps = steps[-1]
        info["iterations"], info["error"] = it, err
        ctx.eps, ctx.runs = eps, runs
        ctx.shapes = (log_mu.shape, log_nu.shape)
        ctx.save_for_backward(cost)
        return (f.unsqueeze(-1) + g.unsqueeze(-2) - cost) / eps

    @staticmethod
    @once_differentiable  # the kernels are not differentiable again: refuse double backward
    def backward(ctx, grad):
        from diffrank.kernels.sinkhorn import sinkhorn_backward

        (cost,) = ctx.saved_tensors
        acc = torch.float64 if cost.dtype == torch.float64 else torch.float32
        scaled = grad.to(acc) / ctx.eps  # log Γ = (f + g - C) / ε_last
        d_cost, d_mu, d_nu = sinkhorn_backward(cost, ctx.runs, (-scaled).contiguous(), scaled.sum(2).contiguous(),
                                               scaled.sum(1).contiguous())
        mu_shape, nu_shape = ctx.shapes
        d_mu = d_mu.sum(0, keepdim=True) if mu_shape[0] == 1 else d_mu  # log μ broadcast over the rows
        d_nu = d_nu.sum(0, keepdim=True) if nu_shape[0] == 1 else d_nu
        return d_cost.to(cost.dtype), d_mu.to(cost.dtype), d_nu.to(cost.dtype), None, None, None, None
