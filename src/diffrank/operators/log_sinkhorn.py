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
included). Under ``torch.func.vmap`` the read covers every vmapped row too
(:func:`~diffrank.operators.base.host_max`), so a vmapped call stops where the eager call on the stacked batch
stops. ``torch.compile`` cannot trace the read: with a tolerance the loop runs eagerly inside a compiled
function (one graph break, no ``fullgraph=True``); with ``tolerance = None`` the loop has a fixed length and
compiles as one graph. The iterations are plain tensor
operations, so autograd differentiates through them (Cuturi et al. 2019, §3), twice as well (exact second
derivatives), unless the caller runs them under its own backward (SOFT top-k).

**Fused kernel.** With ``kernel=True`` (SinkhornSort with ``backend`` ``"triton"``, or ``"auto"`` on CUDA)
the iterations run in the Triton kernel of ``diffrank/kernels/sinkhorn.py``: one program per batch row keeps its cost
tile and potentials on chip for every iteration between two checks (n, m <= 64 in float32, 32 in float64, the
tiles that compile without register spills: :func:`diffrank.kernels.sinkhorn.fused_size`; larger problems run
the PyTorch loop). It runs the same iterations with the same ε and the same checks. Its backward is the reverse
sweep that autograd takes through the PyTorch loop, fused in a second kernel over the potentials the forward
recorded (n + m numbers per iteration instead of several n x m tensors), so the gradient is the PyTorch
path's. It is differentiable once: a double backward raises
:class:`~diffrank.operators.base.DoubleBackwardError` naming ``backend='torch'``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor
from torch._C import _functorch

from diffrank.operators.base import check_int, fold_vmapped, host_max, refuse_double_backward


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
        ValueError: for a setting outside its range, or a real setting that is not a number.
        TypeError: ``max_iter`` or ``check_every`` not an integer (2.5 is refused, not truncated).
    """

    max_iter: int = 2000
    tolerance: float | None = 1e-6
    check_every: int = 10
    epsilon_start: float | None = 1.0
    anneal: float = 0.9

    def __post_init__(self) -> None:
        for name in ("max_iter", "check_every"):  # integers, never truncated (2.5 is not 2)
            object.__setattr__(self, name, check_int(getattr(self, name), name))
        for name in ("tolerance", "epsilon_start", "anneal"):
            value = getattr(self, name)
            if value is None and name != "anneal":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number, got {value!r} of type {type(value).__name__}")
            object.__setattr__(self, name, float(value))
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError(f"tolerance must be > 0 or None, got {self.tolerance}")
        if self.epsilon_start is not None and not (math.isfinite(self.epsilon_start) and self.epsilon_start > 0):
            raise ValueError(f"epsilon_start must be a finite positive number or None, got {self.epsilon_start}")
        if not 0 < self.anneal < 1:
            raise ValueError(f"anneal must be in (0, 1), got {self.anneal}")


def _epsilon_schedule(cost: Tensor, epsilon: float, schedule: SinkhornSchedule,
                      cost_scale: float | None) -> tuple[Tensor | float, int]:
    """ε_0 (a float, or per row ``(R, 1, 1)`` when the scale is the rows' largest cost) and the number of
    iterations with ε_t > ε for some row (one host read when ε_0 is per row)."""
    start: Tensor | float = epsilon
    if schedule.epsilon_start is not None and cost_scale is not None:
        start = max(epsilon, schedule.epsilon_start * cost_scale)
    elif schedule.epsilon_start is not None:
        start = (schedule.epsilon_start * cost.detach().amax(dim=(1, 2), keepdim=True)).clamp_min(epsilon)
    top = start if isinstance(start, float) else host_max(start)  # one host read for the schedule's length
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


def log_sinkhorn(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float | Tensor, schedule: SinkhornSchedule,
                 cost_scale: float | None = None, kernel: bool = False) -> tuple[Tensor, int, float]:
    """log Γ of the entropic OT plan by log-domain Sinkhorn with the ε schedule of the module docstring.

    Args:
        cost: ``(R, n, m)`` cost C (items × targets), float32 or float64.
        log_mu: ``(R or 1, n)`` log item masses; log_nu: ``(R or 1, m)`` log target masses (each sums to 1).
        epsilon: the target ε > 0: a float, or a 0-d tensor that may require grad (a learnable temperature: the
            iterations at ε carry its gradient; the schedule reads its value once). A tensor ε runs the PyTorch
            loop whatever ``kernel`` says.
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
    if kernel and not isinstance(epsilon, Tensor):
        from diffrank.kernels.sinkhorn import fused_size

        if max(cost.shape[1], cost.shape[2]) <= fused_size(cost.dtype):
            return _log_sinkhorn_fused(cost, log_mu, log_nu, epsilon, schedule, cost_scale)
    if schedule.tolerance is not None and torch.compiler.is_compiling():
        # a loop that stops on a read of the marginal error runs eagerly, as one graph break: traced, every check
        # would break the graph and each resumed piece recompile for the next iteration count
        return _loop_eagerly(cost, log_mu, log_nu, epsilon, schedule, cost_scale)
    return _loop(cost, log_mu, log_nu, epsilon, schedule, cost_scale)


def _loop(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float | Tensor, schedule: SinkhornSchedule,
          cost_scale: float | None) -> tuple[Tensor, int, float]:
    """The PyTorch iterations of :func:`log_sinkhorn`."""
    R, n, m = cost.shape
    log_mu, log_nu = log_mu.unsqueeze(-1), log_nu.unsqueeze(-2)  # (R, n, 1), (R, 1, m)
    f = cost.new_zeros(R, n, 1)
    g = cost.new_zeros(R, 1, m)
    value = float(epsilon.detach()) if isinstance(epsilon, Tensor) else epsilon
    start, scaling = _epsilon_schedule(cost, value, schedule, cost_scale)
    it, err = 0, float("nan")
    eps: Tensor | float = epsilon
    while it < schedule.max_iter:
        # at ε itself the (possibly learnable) tensor: the scaling iterations' ε does not depend on it
        eps = epsilon if it >= scaling else _epsilon_at(it, start, scaling, value, schedule)
        f = eps * log_mu - eps * torch.logsumexp((g - cost) / eps, dim=2, keepdim=True)
        g = eps * log_nu - eps * torch.logsumexp((f - cost) / eps, dim=1, keepdim=True)
        it += 1
        if not _is_check(it, scaling, schedule):
            continue
        with torch.no_grad():
            row = torch.logsumexp((f + g - cost) / eps, dim=2, keepdim=True)
            err = host_max((torch.exp(row - log_mu) - 1).abs())
        if it > scaling and err < schedule.tolerance:
            break
    return (f + g - cost) / eps, it, err


# torch's lazy form of torch.compiler.disable: dynamo (which loads Triton) is imported at the first call, under
# torch.compile, never by an eager user
_loop_eagerly = torch._disable_dynamo(_loop)



def _log_sinkhorn_fused(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float, schedule: SinkhornSchedule,
                        cost_scale: float | None) -> tuple[Tensor, int, float]:
    """:func:`log_sinkhorn` with the iterations in the Triton kernel: one launch per marginal check."""
    info = _RunInfo()
    # the potentials are recorded only for a backward (the forward of a Function runs without grad mode)
    history = torch.is_grad_enabled() and any(t.requires_grad for t in (cost, log_mu, log_nu))
    log_t = _FusedSinkhorn.apply(cost, log_mu, log_nu, epsilon, schedule, cost_scale, history, info)
    return log_t, info.iterations, info.error


def _epsilon_table(steps: list, like: Tensor) -> Tensor:
    """The ε of a run of iterations as the kernel reads it: ``(1, T)`` when every ε is a Python float (rounded
    to the cost dtype, as PyTorch does with a scalar operand), else ``(R, T)`` from the per-row values."""
    if all(isinstance(e, float) for e in steps):
        return torch.tensor(steps, dtype=like.dtype, device=like.device).view(1, -1)
    R = like.shape[0]
    return torch.cat([e.reshape(R, 1).to(like.dtype) if isinstance(e, Tensor) else like.new_full((R, 1), e)
                      for e in steps], dim=1)


class _RunInfo:
    """What a fused run reports besides log Γ: iterations, error, and for the backward the last ε and the recorded
    runs. A plain object: ``torch.func`` rebuilds a dict argument (a pytree), so the caller's would stay empty."""

    __slots__ = ("iterations", "error", "eps", "runs")


class _FusedSinkhorn(torch.autograd.Function):
    """log Γ by the kernel's iterations (the schedule and checks of :func:`log_sinkhorn`); the backward runs
    the kernel's reverse sweep over the recorded potentials. ``info`` receives the iterations and the error
    (and, for :meth:`setup_context`, the ε and the recorded runs). Differentiable once: a double backward raises
    :class:`~diffrank.operators.base.DoubleBackwardError` (the PyTorch loop, ``backend='torch'``, has exact
    second derivatives). ``torch.func.vmap`` folds the vmapped dimension into the rows (:meth:`vmap`)."""

    @staticmethod
    def forward(cost, log_mu, log_nu, epsilon, schedule, cost_scale, history, info):
        from diffrank.kernels.sinkhorn import sinkhorn_updates

        R, n, m = cost.shape
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
        info.iterations, info.error, info.eps, info.runs = it, err, eps, runs
        return (f.unsqueeze(-1) + g.unsqueeze(-2) - cost) / eps

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        cost, log_mu, log_nu, *_, info = inputs
        ctx.eps, ctx.runs = info.eps, info.runs
        ctx.shapes = (log_mu.shape, log_nu.shape)
        ctx.save_for_backward(cost)

    @staticmethod
    def vmap(vinfo, in_dims, cost, log_mu, log_nu, epsilon, schedule, cost_scale, history, info):
        """Every (vmapped sample, row) is one row of the kernel: the stopping rule's worst row then covers them
        all, as in the eager call on the stacked batch."""
        V = vinfo.batch_size
        c = fold_vmapped(cost, in_dims[0], V)
        R = c.shape[0] // V
        log_t = _FusedSinkhorn.apply(c, _fold_masses(log_mu, in_dims[1], V, R),
                                     _fold_masses(log_nu, in_dims[2], V, R), epsilon, schedule, cost_scale,
                                     history, info)
        return log_t.unflatten(0, (V, R)), 0

    @staticmethod
    def backward(ctx, grad):
        from diffrank.kernels.sinkhorn import sinkhorn_backward

        (cost,) = ctx.saved_tensors
        acc = torch.float64 if cost.dtype == torch.float64 else torch.float32
        scaled = grad.to(acc) / ctx.eps  # log Γ = (f + g - C) / ε_last
        # a torch.func transform hands wrapped (or batched, for jacrev) gradients, which a kernel cannot read
        sweep = _reverse_sweep if _functorch.is_functorch_wrapped_tensor(grad) else sinkhorn_backward
        d_cost, d_mu, d_nu = sweep(cost, ctx.runs, (-scaled).contiguous(), scaled.sum(2).contiguous(),
                                   scaled.sum(1).contiguous())
        mu_shape, nu_shape = ctx.shapes
        d_mu = d_mu.sum(0, keepdim=True) if mu_shape[0] == 1 else d_mu  # log μ broadcast over the rows
        d_nu = d_nu.sum(0, keepdim=True) if nu_shape[0] == 1 else d_nu
        grads = (d_cost.to(cost.dtype), d_mu.to(cost.dtype), d_nu.to(cost.dtype), None, None, None, None, None)
        return refuse_double_backward(grads, "the fused Sinkhorn kernel (SinkhornSort with backend 'triton' or "
                                      "'auto' on CUDA)", "backend='torch' (autograd through the PyTorch iterations "
                                      "gives exact second derivatives)")


def _reverse_sweep(cost: Tensor, runs: list[tuple[Tensor, Tensor, Tensor]], d_cost: Tensor, d_f: Tensor,
                   d_g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`diffrank.kernels.sinkhorn.sinkhorn_backward` (the reverse sweep of the kernels' module docstring) in
    PyTorch operations, for the gradients of ``torch.func`` transforms; same arguments and results."""
    c = cost.to(d_cost.dtype)
    d_mu, d_nu = torch.zeros_like(d_f), torch.zeros_like(d_g)
    for eps, fh, gh in reversed(runs):
        eps = eps.to(c.dtype)
        for t in reversed(range(eps.shape[1])):
            e = eps[:, t].view(-1, 1, 1)
            # the target-side update g_t = ε log ν - ε LSE_i((f_t - C) / ε)
            wa = torch.softmax((fh[:, t].unsqueeze(-1).to(c.dtype) - c) / e, dim=1) * d_g.unsqueeze(1)
            d_f = d_f - wa.sum(2)
            d_cost = d_cost + wa
            d_nu = d_nu + e.view(-1, 1) * d_g
            # the item-side update f_t = ε log μ - ε LSE_j((g_{t-1} - C) / ε)
            wb = torch.softmax((gh[:, t].unsqueeze(1).to(c.dtype) - c) / e, dim=2) * d_f.unsqueeze(-1)
            d_g = -wb.sum(1)
            d_cost = d_cost + wb
            d_mu = d_mu + e.view(-1, 1) * d_f
            d_f = torch.zeros_like(d_f)  # f_{t-1} feeds nothing but the output, counted once at the top
    return d_cost, d_mu, d_nu


def _fold_masses(x: Tensor, dim: int | None, size: int, rows: int) -> Tensor:
    """Log masses ``(R or 1, n)`` under vmap as ``(size · R, n)``; unvmapped ``(1, n)`` masses stay shared."""
    if dim is None and x.shape[0] == 1:
        return x
    x = x.unsqueeze(0) if dim is None else x.movedim(dim, 0)
    return x.expand(size, rows, x.shape[-1]).flatten(0, 1)
