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
compiles as one graph.

**Gradient and memory.** The gradient is that of the iterations that ran (autograd through the unrolled loop,
Cuturi et al. 2019, §3), whether or not they converged, twice differentiable (exact second derivatives). Autograd
through the loop itself would keep about four ``(R, n, m)`` tensors per iteration (6 GiB for SinkhornSort at
n = 500, B = 16, 200 iterations; out of 80 GB at n = 1000, B = 1024). In eager autograd the loop therefore runs in
:class:`_RecomputedSinkhorn`, which saves the inputs and a snapshot of g every ⌈√max_iter⌉ iterations, and whose
backward recomputes the iterations one segment at a time and sweeps back through them: a few ``(R, n, m)``
buffers at its peak whatever the iteration count, for about three forward passes of time (exact recomputation,
not the implicit derivative of the fixed point, which would differ from the values' own derivative wherever the
loop stopped short of it). Under ``torch.func`` transforms (``vmap``, ``grad``, ``jacrev``, ``jvp``), forward-mode
AD and ``torch.compile`` tracing the loop runs as plain operations, differentiated (and its memory held) by
them. A caller that runs the loop under its own backward (SOFT top-k: implicit differentiation of the plan) runs it
without grad: nothing is saved.

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

import dataclasses
import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor
from torch._C import _functorch
from torch.autograd import forward_ad

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
            :func:`diffrank.kernels.sinkhorn.fused_size`), else (and by default) as PyTorch operations, whose
            backward in eager autograd holds a constant number of ``(R, n, m)`` buffers whatever the iterations
            (module docstring, "Gradient and memory"). Same result and gradient.

    Returns:
        ``(log Γ (R, n, m), iterations used, last measured item-marginal error)``; the error is ``nan``
        when ``schedule.tolerance`` is None. log Γ is formed with the last ε used (ε itself unless
        ``max_iter`` ran out during the scaling). Differentiable in ``cost``, ``log_mu``, ``log_nu`` and a tensor
        ``epsilon`` (the gradient of the iterations that ran; a tensor ε left unused by a loop that stopped inside
        the scaling gets gradient 0 in eager autograd).

    Raises:
        Nothing of its own: the callers validate their inputs (and warn when the error is above the tolerance).
    """
    if kernel and not isinstance(epsilon, Tensor):
        from diffrank.kernels.sinkhorn import fused_size

        if max(cost.shape[1], cost.shape[2]) <= fused_size(cost.dtype):
            return _log_sinkhorn_fused(cost, log_mu, log_nu, epsilon, schedule, cost_scale)
    if schedule.tolerance is not None and torch.compiler.is_compiling():
        # a loop that stops on a read of the marginal error runs eagerly, as one graph break: traced, every check
        # would break the graph and each resumed piece recompile for the next iteration count
        return _solve_eagerly(cost, log_mu, log_nu, epsilon, schedule, cost_scale)
    return _solve(cost, log_mu, log_nu, epsilon, schedule, cost_scale)


def _solve(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float | Tensor, schedule: SinkhornSchedule,
           cost_scale: float | None) -> tuple[Tensor, int, float]:
    """The PyTorch path of :func:`log_sinkhorn`: through :class:`_RecomputedSinkhorn` when plain eager autograd
    will differentiate it (its backward holds a constant number of ``(R, n, m)`` buffers) and the unrolled graph
    could be large (:func:`_unrolled_too_large`), else the loop itself
    (no graph to record; or a ``torch.func`` transform, forward-mode AD or ``torch.compile`` tracing, which
    differentiate the iterations themselves)."""
    if _recomputes(cost, log_mu, log_nu, epsilon) and _unrolled_too_large(cost, schedule.max_iter):
        record = _Record(_stride(schedule.max_iter))
        log_t = _RecomputedSinkhorn.apply(cost, log_mu, log_nu, epsilon, schedule, cost_scale, record)
        return log_t, record.iterations, record.error
    return _loop(cost, log_mu, log_nu, epsilon, schedule, cost_scale)


def _recomputes(*inputs: Tensor | float) -> bool:
    """Whether :func:`_solve` runs :class:`_RecomputedSinkhorn`: eager autograd will differentiate the result
    (grad mode on, an input requires grad) and nothing else has to see the iterations (no ``torch.func``
    transform, no forward-mode dual level, no ``torch.compile`` tracing)."""
    return (torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in inputs)
            and not torch.compiler.is_compiling() and _functorch.peek_interpreter_stack() is None
            and forward_ad._current_level < 0)


#: the recomputing backward runs once the unrolled loop could keep this many bytes (about four (R, n, m) tensors
#: per iteration, at ``max_iter`` iterations) or one (R, n, m) tensor holds this many elements; below both, the
#: unrolled loop's backward, which is faster on small sets (the recomputation's reverse sweep costs about 1.4x,
#: mostly per-iteration overhead), keeps at most that many bytes
UNROLLED_MAX_BYTES = 1 << 30
RECOMPUTED_MIN_ELEMENTS = 1 << 20


def _unrolled_too_large(cost: Tensor, max_iter: int) -> bool:
    """Whether the unrolled loop's graph could exceed :data:`UNROLLED_MAX_BYTES`, or one plan has at least
    :data:`RECOMPUTED_MIN_ELEMENTS` entries (then memory, not overhead, decides)."""
    return (cost.numel() >= RECOMPUTED_MIN_ELEMENTS
            or 4 * cost.numel() * cost.element_size() * max_iter > UNROLLED_MAX_BYTES)


def _stride(max_iter: int) -> int:
    """Iterations between two snapshots of the potentials: ⌈√max_iter⌉, so that the snapshots and the one
    segment the backward recomputes at a time hold at most 2⌈√max_iter⌉ vectors of m numbers per row."""
    return math.isqrt(max_iter - 1) + 1


def _update(cost: Tensor, log_mu: Tensor, log_nu: Tensor, g: Tensor, eps: Tensor | float) -> tuple[Tensor, Tensor]:
    """One iteration (the item-side update, then the target-side one) of the module docstring on ``(R, n, 1)`` /
    ``(R, 1, m)`` log masses and potentials: ``(f, g)``. The forward and the backward's recomputation share it, so
    that the recomputed potentials are the forward's, digit for digit."""
    f = eps * log_mu - eps * torch.logsumexp((g - cost) / eps, dim=2, keepdim=True)
    return f, eps * log_nu - eps * torch.logsumexp((f - cost) / eps, dim=1, keepdim=True)


def _loop(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: float | Tensor, schedule: SinkhornSchedule,
          cost_scale: float | None, record: _Record | None = None) -> tuple[Tensor, int, float]:
    """The PyTorch iterations of :func:`log_sinkhorn`; ``record`` (if given) receives the ε schedule and a snapshot
    of g every ``record.stride`` iterations, for :class:`_RecomputedSinkhorn`'s backward."""
    R, n, m = cost.shape
    log_mu, log_nu = log_mu.unsqueeze(-1), log_nu.unsqueeze(-2)  # (R, n, 1), (R, 1, m)
    f = cost.new_zeros(R, n, 1)
    g = cost.new_zeros(R, 1, m)
    value = float(epsilon.detach()) if isinstance(epsilon, Tensor) else epsilon
    start, scaling = _epsilon_schedule(cost, value, schedule, cost_scale)
    if record is not None:
        record.start, record.scaling = start, scaling
    it, err = 0, float("nan")
    eps: Tensor | float = epsilon
    while it < schedule.max_iter:
        if record is not None and it % record.stride == 0:
            record.snapshots.append(g)  # g after `it` iterations (a new tensor each iteration: no copy)
        # at ε itself the (possibly learnable) tensor: the scaling iterations' ε does not depend on it
        eps = epsilon if it >= scaling else _epsilon_at(it, start, scaling, value, schedule)
        f, g = _update(cost, log_mu, log_nu, g, eps)
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
# torch.compile, never by an eager user. The loop runs eagerly there, so it takes the memory-light backward too.
_solve_eagerly = torch._disable_dynamo(_solve)


class _Record:
    """What :func:`_loop` reports to :class:`_RecomputedSinkhorn`: the snapshot stride (set by the caller), then the
    ε schedule (ε_0, scaling length), the snapshots of g, the iterations and the error. A plain object, not a pytree."""

    __slots__ = ("stride", "snapshots", "start", "scaling", "iterations", "error")

    def __init__(self, stride: int) -> None:
        self.stride, self.snapshots = stride, []


class _RecomputedSinkhorn(torch.autograd.Function):
    """log Γ by the PyTorch iterations of :func:`log_sinkhorn` (same schedule, stopping rule and result), with a
    backward whose memory does not grow with the iterations: exact recomputation, the gradient of the iterations
    that ran (what autograd through the unrolled loop gives, to rounding; at convergence or not), not the implicit
    derivative of the fixed point, so a forward stopped early keeps a gradient consistent with its values.

    Saved: the inputs (the cost C, log μ, log ν, a tensor ε), ε_0 of the schedule, and g after every s = ⌈√max_iter⌉
    iterations: O(√max_iter · m) numbers per row, no ``(R, n, m)`` tensor but C. The backward walks the segments
    between two snapshots from the last: it recomputes the segment's g (s vectors), then takes the reverse sweep
    through it (:func:`_reverse_step`), so its peak is a few ``(R, n, m)`` buffers (C, ∂C and the step's two
    softmaxes) for any iteration count, and it costs about three forward passes. Unrolled autograd instead keeps
    about four ``(R, n, m)`` tensors per iteration (out of memory at n = 1000, B = 1024, a few hundred iterations).

    Second derivatives are exact: a backward that is itself recorded (``create_graph=True``) recomputes the same
    iterations (``max_iter`` = the iterations used, no check) in autograd operations and differentiates them
    (``torch.func.vjp``), holding the unrolled graph for that call. ``torch.func`` transforms, forward-mode AD and
    ``torch.compile`` tracing never reach this Function: :func:`_solve` runs the plain loop for them.
    """

    twice_differentiable = True  # the recorded backward is exact (above); read by diffrank.losses.newton

    @staticmethod
    def forward(cost, log_mu, log_nu, epsilon, schedule, cost_scale, record):
        log_t, record.iterations, record.error = _loop(cost, log_mu, log_nu, epsilon, schedule, cost_scale, record)
        return log_t

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        cost, log_mu, log_nu, epsilon, schedule, cost_scale, record = inputs
        ctx.schedule, ctx.cost_scale, ctx.scaling = schedule, cost_scale, record.scaling
        ctx.iterations, ctx.stride = record.iterations, record.stride
        ctx.tensor_eps, ctx.tensor_start = isinstance(epsilon, Tensor), isinstance(record.start, Tensor)
        ctx.epsilon = None if ctx.tensor_eps else epsilon
        ctx.start = None if ctx.tensor_start else record.start
        snapshots = torch.stack(record.snapshots)  # (K, R, 1, m)
        record.snapshots = []
        ctx.save_for_backward(cost, log_mu, log_nu, epsilon if ctx.tensor_eps else None, snapshots,
                              record.start if ctx.tensor_start else None)

    @staticmethod
    def backward(ctx, grad):
        cost, log_mu, log_nu, eps_t, snapshots, start_t = ctx.saved_tensors
        epsilon = eps_t if ctx.tensor_eps else ctx.epsilon
        if torch.is_grad_enabled():  # the backward is recorded: differentiate the recomputed iterations
            grads = _recorded_vjp(cost, log_mu, log_nu, epsilon, ctx, grad)
        else:
            start = start_t if ctx.tensor_start else ctx.start
            grads = _recomputed_vjp(cost, log_mu, log_nu, epsilon, start, snapshots, ctx, grad)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None, None, None)


def _recorded_vjp(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: Tensor | float, ctx,
                  grad: Tensor) -> tuple[Tensor | None, ...]:
    """The backward of :class:`_RecomputedSinkhorn` as a differentiable function of its inputs and ``grad``: the
    iterations that ran, recomputed in autograd operations (:func:`_loop` with ``max_iter`` = the iterations used,
    no check), under ``torch.func.vjp``. Returns the gradients of (C, log μ, log ν, ε), ``None`` for a float ε."""
    schedule = dataclasses.replace(ctx.schedule, max_iter=ctx.iterations, tolerance=None)
    primals = (cost, log_mu, log_nu, epsilon) if ctx.tensor_eps else (cost, log_mu, log_nu)

    def unrolled(c, lm, ln, *eps):
        """log Γ of the unrolled iterations (differentiable operations), for the recorded backward's VJP."""
        return _loop(c, lm, ln, eps[0] if eps else epsilon, schedule, ctx.cost_scale)[0]

    grads = torch.func.vjp(unrolled, *primals)[1](grad)
    return grads if ctx.tensor_eps else (*grads, None)


def _recomputed_vjp(cost: Tensor, log_mu: Tensor, log_nu: Tensor, epsilon: Tensor | float, start: Tensor | float,
                    snapshots: Tensor, ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
    """The reverse sweep through the iterations of :class:`_RecomputedSinkhorn`'s forward, one segment between two
    snapshots of g at a time (its g recomputed from the snapshot by :func:`_update`, as the forward computed them).
    Returns the gradients of (C ``(R, n, m)``, log μ ``(R or 1, n)``, log ν ``(R or 1, m)``, ε 0-d or ``None``)."""
    value = float(epsilon) if ctx.tensor_eps else epsilon
    T, s, scaling, schedule = ctx.iterations, ctx.stride, ctx.scaling, ctx.schedule

    def eps_at(t: int) -> Tensor | float:
        """ε of iteration ``t`` (0-based), as in :func:`_loop`."""
        return epsilon if t >= scaling else _epsilon_at(t, start, scaling, value, schedule)

    lmu, lnu = log_mu.unsqueeze(-1), log_nu.unsqueeze(-2)
    learn = ctx.tensor_eps and ctx.needs_input_grad[3]
    sums = _Adjoint(cost, grad, eps_at(T - 1), learn)
    for k in reversed(range(snapshots.shape[0])):
        t0, t1 = k * s, min(T, (k + 1) * s)
        gs = [snapshots[k]]
        for t in range(t0, t1 - 1):
            gs.append(_update(cost, lmu, lnu, gs[-1], eps_at(t))[1])
        for t in reversed(range(t0, t1)):
            _reverse_step(sums, cost, lmu, lnu, gs.pop(), eps_at(t), learn and t >= scaling, grad if t == T - 1
                          else None)
    d_mu, d_nu = sums.d_mu.squeeze(-1), sums.d_nu.squeeze(-2)
    d_mu = d_mu.sum(0, keepdim=True) if log_mu.shape[0] == 1 else d_mu  # log μ broadcast over the rows
    d_nu = d_nu.sum(0, keepdim=True) if log_nu.shape[0] == 1 else d_nu
    d_eps = sums.d_eps.to(epsilon.dtype).reshape(epsilon.shape) if learn else None
    return sums.d_cost, d_mu.to(log_mu.dtype), d_nu.to(log_nu.dtype), d_eps


class _Adjoint:
    """The reverse sweep's running sums: ∂C ``(R, n, m)``, ∂f ``(R, n, 1)``, ∂g ``(R, 1, m)``, ∂log μ, ∂log ν and
    ∂ε (0-d), started from the output log Γ = (f_T + g_T - C) / ε_T and its gradient ``grad``."""

    __slots__ = ("d_cost", "d_f", "d_g", "d_mu", "d_nu", "d_eps")

    def __init__(self, cost: Tensor, grad: Tensor, eps_last: Tensor | float, learn: bool) -> None:
        R, n, m = cost.shape
        self.d_cost = grad / -eps_last
        self.d_f = grad.sum(2, keepdim=True) / eps_last
        self.d_g = grad.sum(1, keepdim=True) / eps_last
        self.d_mu, self.d_nu = cost.new_zeros(R, n, 1), cost.new_zeros(R, 1, m)
        self.d_eps = cost.new_zeros(()) if learn else None


def _reverse_step(sums: _Adjoint, cost: Tensor, log_mu: Tensor, log_nu: Tensor, g_prev: Tensor, eps: Tensor | float,
                  learn: bool, grad: Tensor | None) -> None:
    """Walk ``sums`` back through one iteration, f = ε log μ - ε LSE_j((g_prev - C)/ε) then g = ε log ν -
    ε LSE_i((f - C)/ε), recomputing its two softmaxes P (over the targets) and Q (over the items) from ``g_prev``.
    ``learn``: ε is the learnable tensor in this iteration, so ∂f_i/∂ε = log μ_i + Σ_j P_ij log P_ij and ∂g_j/∂ε =
    log ν_j + Σ_i Q_ij log Q_ij (at fixed g_prev, f) accumulate into ∂ε; ``grad``: this is the last iteration, whose
    f and g form the output log Γ = (f + g - C)/ε, whose own ∂/∂ε is -log Γ / ε.

    Every ``(R, n, m)`` operation is in place on the step's two buffers, and the softmaxes stay unnormalised (their
    sums divide the vectors they multiply): on the CPU a fresh buffer per operation costs as much as the operation.
    """
    a = torch.sub(g_prev, cost).div_(eps)
    p, z_a, lse_a = _exp_(a, 2)  # P = p / z_a: ∂f_i/∂g_j = -P_ij, ∂f_i/∂C_ij = P_ij
    f = eps * log_mu - eps * lse_a
    b = torch.sub(f, cost).div_(eps)
    if learn and grad is not None:
        # log Γ = b - LSE_i(b) + log ν; a +inf cost (a masked entry, gradient 0) clamped so that 0 · log Γ stays 0
        log_gamma = b.clamp_min(torch.finfo(b.dtype).min).sub_(torch.logsumexp(b, dim=1, keepdim=True)).add_(log_nu)
        sums.d_eps -= (grad * log_gamma).sum() / eps
        del log_gamma
    q, z_b, _ = _exp_(b, 1)  # Q = q / z_b: ∂g_j/∂f_i = -Q_ij, ∂g_j/∂C_ij = Q_ij
    if learn:  # Σ Q log Q = Σ q log q / z - log z (xlogy: 0 log 0 = 0 for the zero weights)
        sums.d_eps += ((log_nu + torch.special.xlogy(q, q).sum(1, keepdim=True) / z_b - z_b.log())
                       * sums.d_g).sum()
        f_rate = log_mu + torch.special.xlogy(p, p).sum(2, keepdim=True) / z_a - z_a.log()
    q.mul_(sums.d_g / z_b)
    sums.d_cost.add_(q)
    d_f = sums.d_f - q.sum(2, keepdim=True)
    del q, b
    sums.d_nu += eps * sums.d_g
    if learn:
        sums.d_eps += (f_rate * d_f).sum()
    p.mul_(d_f / z_a)
    sums.d_cost.add_(p)
    sums.d_g = -p.sum(1, keepdim=True)
    sums.d_mu += eps * d_f
    sums.d_f = torch.zeros_like(d_f)  # f of the iteration before feeds only its g, nothing else


def _exp_(x: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """``exp(x - max(x))`` written over ``x``, its sum z and ``logsumexp(x)``, along ``dim`` (kept): the softmax is
    the first over z, from one exponential and no new ``(R, n, m)`` buffer."""
    top = x.amax(dim, keepdim=True)
    e = x.sub_(top).exp_()
    total = e.sum(dim, keepdim=True)
    return e, total, top + total.log()



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
