"""Fast differentiable sorting and ranking (Blondel, Teboul, Berthet, Djolonga, ICML 2020).

Soft rank and soft sort are regularised projections onto the permutahedron P(w) = conv{w_σ}
(paper §3-§5):

- ``l2`` (Q): P_Q(z, w) = argmin_{μ ∈ P(w)} ½‖μ - z‖²;
- ``kl`` (E): P_E(z, w) = log argmin_{μ ∈ P(e^w)} KL(μ, e^z).

Both reduce to an isotonic regression solved by pool adjacent violators (paper Prop. 3): with σ
sorting z descending and s = z_σ, v = argmin_{v_1 >= ... >= v_n} of ½‖v - (s - w)‖² (block value =
mean of s - w) or of ⟨e^{s-v}, 1⟩ + ⟨e^w, v⟩ (block value = LSE(s_B) - LSE(w_B)); the projection is
s - v, unsorted. O(n log n): one sort, then O(n) PAV (:mod:`diffrank.operators.fast_soft_sort_cpu`: one kernel
call for the batch, compiled ahead of time or by numba's JIT).

diffrank orientation (descending, rank 1 = largest), with ρ = (n, n-1, ..., 1) and ε = 1/β the
``regularization_strength``:

- soft rank: r = P_Q(-θ/ε, ρ) (l2) or exp(P_E(-θ/ε, log ρ)) (kl) — ``torchsort.soft_rank(-θ)``;
- soft sort: P(ρ/ε, sort(θ)) (the projection of ρ/ε onto the permutahedron of θ) — ``-torchsort.soft_sort(-θ)``.

torchsort's ascending functions are :mod:`diffrank.compat.torchsort` (both regularizations, its ties), and
:func:`diffrank.functional.soft_rank` / :func:`diffrank.functional.soft_sort` with ``method="fast_soft_sort",
beta=1/ε`` for ``l2`` (their ascending result reflects the descending one, which is torchsort's only for l2).

Derivatives (paper Lemma 2 / §5): the Jacobian of the isotonic step is block diagonal, every row of a block 1/|B|
(l2) or the softmax of the block's entries (kl). At kinks and ties (two blocks with equal values) this uses the
convention of the authors' code and torchsort (fast_soft_sort_cpu: equal blocks pool, then a 1e-9 partition), so
torchsort's README Spearman example gets its gradient. The backward is one kernel call on plain tensors, and
differentiable tensor operations when a graph is recorded: exact second derivatives (zero a.e. for l2, whose
Jacobian is piecewise constant; the softmax's curvature for kl), ``torch.func`` (``grad``, ``jacrev``, ``vmap``,
``jvp``) and ``torch.compile`` (the kernel is the custom op ``diffrank::fast_soft_sort_project``: dynamo does not
trace it; graph breaks only where the base class validates). β may be a tensor that requires grad: it scales the
projected point (βθ, ρβ), so autograd gives ∂/∂β. The PAV runs on the CPU (CUDA inputs are copied to the host and
back).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators import fast_soft_sort_cpu as _cpu
from diffrank.operators.base import SOFT_RANK, SOFT_SORT, RankingOperator

REGULARIZATIONS = ("l2", "kl")


def _project_impl(z: Tensor, w: Tensor, kl: bool, z_sorted: int) -> tuple[Tensor, Tensor, Tensor]:
    """(μ (B, n), order (like z), block (B, n)) of :class:`_Projection` through the CPU kernel; ``z`` and ``w`` are
    (1 or B, n), a single row shared by the batch; ``z_sorted`` 1 / -1 when every row of z is already descending /
    ascending (the soft sort's ±ρ/ε: no sort; ``order`` is then a cached constant, see :func:`_fresh`), else 0.
    CUDA inputs go to the host and back."""
    z = z.detach()
    if z_sorted:
        order = _arange(z.shape[-1], z_sorted > 0, z.device)
        if z.shape[0] > 1:
            order = order.expand(z.shape).contiguous()
    else:
        order = torch.sort(z, dim=-1, descending=True)[1]
    w = w.detach()
    dev = z.device
    if dev.type != "cpu":
        z, order, w = z.cpu(), order.cpu(), w.cpu()
    if not w.is_contiguous():
        w = w.contiguous()
    if not z.is_contiguous():
        z = z.contiguous()
    shape = (max(z.shape[0], w.shape[0]), z.shape[1])
    mu = z.new_empty(shape)
    bid = order.new_empty(shape)
    _cpu.kernel("project_fwd", z.dtype)(z.numpy(), order.numpy(), w.numpy(), kl, mu.numpy(), bid.numpy())
    if dev.type != "cpu":
        return mu.to(dev), order.to(dev), bid.to(dev)
    return mu, order, bid


def _fresh(out: tuple[Tensor, Tensor, Tensor], z_sorted: int) -> tuple[Tensor, Tensor, Tensor]:
    """``out`` with an order that is not the cached constant, for a Function or operator output (autograd and
    torch.library take ownership of outputs)."""
    return (out[0], out[1].clone(), out[2]) if z_sorted else out


@torch.library.custom_op("diffrank::fast_soft_sort_project", mutates_args=())
def _project_op(z: Tensor, w: Tensor, kl: bool, z_sorted: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_project_impl` as an operator that ``torch.compile`` does not trace into (numba / the compiled
    module are opaque to dynamo; tracing numba's dispatcher crashed it)."""
    return _fresh(_project_impl(z, w, kl, z_sorted), z_sorted)


@_project_op.register_fake
def _(z: Tensor, w: Tensor, kl: bool, z_sorted: int) -> tuple[Tensor, Tensor, Tensor]:
    shape = (max(z.shape[0], w.shape[0]), z.shape[1])
    return z.new_empty(shape), z.new_empty(z.shape, dtype=torch.int64), z.new_empty(shape, dtype=torch.int64)


def _block_softmax(x: Tensor, bid: Tensor) -> Tensor:
    """softmax of ``x`` (B, n) over each block (``bid``: the block of each position), in differentiable ops."""
    top = torch.full_like(x, float("-inf")).scatter_reduce(-1, bid, x.detach(), "amax")
    e = (x - top.gather(-1, bid)).exp()
    return e / torch.zeros_like(e).scatter_add(-1, bid, e).gather(-1, bid)


def _vjp_ops(g: Tensor, z: Tensor | None, w: Tensor, order: Tensor, bid: Tensor, kl: bool,
             need_w: bool) -> tuple[Tensor, Tensor | None]:
    """The VJP of :func:`_cpu.project_bwd` in differentiable tensor operations: what double backward, torch.func
    transforms and torch.compile differentiate (for kl the block softmax depends on z and w). Returns (B, n)
    gradients; the caller sums a shared input's."""
    order = order.expand_as(g)
    gs = g.gather(-1, order)
    tot = torch.zeros_like(gs).scatter_add(-1, bid, gs).gather(-1, bid)
    if kl:
        p = _block_softmax(z.expand_as(g).gather(-1, order), bid)
        q = _block_softmax(w.expand_as(gs), bid) if need_w else None
    else:
        p = q = 1 / torch.zeros_like(gs).scatter_add(-1, bid, torch.ones_like(gs)).gather(-1, bid)
    gz = torch.zeros_like(gs).scatter(-1, order, gs - p * tot)
    return gz, (q * tot if need_w else None)


def _jvp_ops(dz: Tensor | None, dw: Tensor | None, z: Tensor, w: Tensor, order: Tensor, bid: Tensor,
             kl: bool) -> Tensor:
    """The JVP of the projection (forward mode: ``torch.func.jvp``, ``jacfwd``, ``hessian``), in differentiable
    tensor operations: per block dμ_i = ds_i - (Σ p ds - Σ q dw) with p, q as in :func:`_vjp_ops`."""
    B = bid.shape[0]
    order = order.expand(B, -1)

    def block_sum(x, weights):
        x = x * weights if weights is not None else x
        return torch.zeros_like(x).scatter_add(-1, bid, x).gather(-1, bid)

    if kl:
        p = _block_softmax(z.expand(B, -1).gather(-1, order), bid)
        q = _block_softmax(w.expand(B, -1), bid)
    else:
        p = q = 1 / block_sum(torch.ones(bid.shape, dtype=z.dtype, device=z.device), None)
    ds = dz.expand(B, -1).gather(-1, order) if dz is not None else None
    dv = block_sum(ds, p) if ds is not None else 0
    if dw is not None:
        dv = dv - block_sum(dw.expand(B, -1), q)
    dmu = (ds if ds is not None else 0) - dv
    return torch.zeros(bid.shape, dtype=z.dtype, device=z.device).scatter(-1, order, dmu)


def _backward(ctx, g: Tensor, z: Tensor | None, w: Tensor | None, order: Tensor, bid: Tensor):
    """The backward of both Functions: ``ctx.kl``, ``ctx.rows`` (the row counts of z and w), ``z`` and ``w``
    (saved for kl only) and the forward's ``order`` and ``bid``.

    The kernel's VJP on a plain CPU cotangent with no graph to record; otherwise (double backward, torch.func
    transforms, compiling, CUDA) :func:`_vjp_ops`, whose derivatives are exact: zero a.e. in z and w for l2 (the
    Jacobian is piecewise constant), the block softmax's for kl.
    """
    need_z, need_w = ctx.needs_input_grad[:2]
    if (not torch.is_grad_enabled() and type(g) is Tensor and g.is_cpu and not torch.compiler.is_compiling()
            and not torch._C._functorch.is_functorch_wrapped_tensor(g)):
        g = g.contiguous()
        gz = torch.empty_like(g) if need_z else g  # g: a placeholder the kernel does not touch
        gw = torch.empty_like(g) if need_w else g
        zz = g if z is None else z.detach().contiguous()
        ww = g if w is None else w.detach().contiguous()
        _cpu.kernel("project_bwd", g.dtype)(g.numpy(), zz.numpy(), order.numpy(), ww.numpy(), bid.numpy(), ctx.kl,
                                            need_z, need_w, gz.numpy(), gw.numpy())
    else:
        gz, gw = _vjp_ops(g, z, w, order, bid, ctx.kl, need_w)
    # a single row shared by the batch (z of the soft sort, w of the soft rank) gets the sum of the rows
    if need_z and ctx.rows[0] != gz.shape[0]:
        gz = gz.sum(0, keepdim=True)
    if need_w and ctx.rows[1] != gw.shape[0]:
        gw = gw.sum(0, keepdim=True)
    return (gz if need_z else None), gw, None, None


class _Projection(torch.autograd.Function):
    """μ = P(z, w): the projection of z (1 or B, n) onto the permutahedron of w (1 or B, n; sorted descending), l2
    (P_Q) or kl (P_E, in log space) (Blondel et al. 2020, Prop. 3 and §5), differentiable in both z and w; a single
    row is shared by the batch.

    Returns (μ (B, n), order, block) with the last two int64 and non-differentiable (saved for the backward,
    :func:`_backward`). This form (``setup_context``, a vmap rule, the kernel as a custom op while compiling) is
    the one torch.func and torch.compile need; eager calls take :class:`_ProjectionEager`.
    """

    @staticmethod
    def forward(z: Tensor, w: Tensor, kl: bool, z_sorted: int) -> tuple[Tensor, Tensor, Tensor]:
        if torch.compiler.is_compiling():
            return _project_op(z, w, kl, z_sorted)
        return _fresh(_project_impl(z, w, kl, z_sorted), z_sorted)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        z, w, kl, _ = inputs
        _, order, bid = output
        ctx.mark_non_differentiable(order, bid)
        ctx.save_for_backward(z if kl else None, w if kl else None, order, bid)
        ctx.save_for_forward(z, w, order, bid)
        ctx.kl, ctx.rows = kl, (z.shape[0], w.shape[0])

    @staticmethod
    def backward(ctx, g: Tensor, _g_order, _g_bid):
        return _backward(ctx, g, *ctx.saved_tensors)

    @staticmethod
    def jvp(ctx, dz: Tensor | None, dw: Tensor | None, _kl, _z_sorted):
        z, w, order, bid = ctx.saved_tensors
        return _jvp_ops(dz, dw, z, w, order, bid, ctx.kl), None, None

    @staticmethod
    def vmap(info, in_dims, z: Tensor, w: Tensor, kl: bool, z_sorted: int):
        """Fold the vmapped dimension into the batch, (V, B, n) -> (V·B, n); a shared unbatched row stays shared."""
        V = info.batch_size
        xs = [x if d is None else x.movedim(d, 0) for x, d in zip((z, w), in_dims[:2])]
        B = max(x.shape[-2] for x in xs)
        n = z.shape[-1]
        flat = [x if d is None and x.shape[0] == 1 else x.expand(V, B, n).reshape(V * B, n)
                for x, d in zip(xs, in_dims[:2])]
        mu, order, bid = _Projection.apply(flat[0], flat[1], kl, z_sorted)
        order_dim = None if order.shape[0] == 1 and flat[0] is xs[0] else 0
        if order_dim == 0:
            order = order.reshape(V, B, n)
        return (mu.reshape(V, B, n), order, bid.reshape(V, B, n)), (0, order_dim, 0)


class _ProjectionEager(torch.autograd.Function):
    """:class:`_Projection` for eager calls outside torch.func transforms, returning μ alone: ``Function.apply``
    binds the arguments through ``inspect.signature`` on every call when ``setup_context`` is defined (about 50 µs,
    more than the whole projection of n = 100 items), and each extra output costs a wrapper too."""

    @staticmethod
    def forward(ctx, z: Tensor, w: Tensor, kl: bool, z_sorted: int) -> Tensor:
        mu, ctx.order, ctx.bid = _project_impl(z, w, kl, z_sorted)  # int64, no autograd: plain attributes
        if kl:
            ctx.save_for_backward(z, w)
        ctx.kl, ctx.rows = kl, (z.shape[0], w.shape[0])
        return mu

    @staticmethod
    def backward(ctx, g: Tensor):
        z, w = ctx.saved_tensors if ctx.kl else (None, None)
        return _backward(ctx, g, z, w, ctx.order, ctx.bid)


def _project(z: Tensor, w: Tensor, kl: bool, z_sorted: int = 0) -> Tensor:
    """μ = P(z, w) (see :class:`_Projection`), through the Function that fits the context."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return _Projection.apply(z, w, kl, z_sorted)[0]
    return _ProjectionEager.apply(z, w, kl, z_sorted)


_CONSTANTS: dict[tuple, Tensor] = {}


def _constant(key: tuple, make) -> Tensor:
    """``make()`` cached under ``key``: building ρ or an arange was a tenth of a call at n = 100. Never written to;
    made outside inference mode, so that it may be saved for backward later; not cached while compiling."""
    if torch.compiler.is_compiling():
        return make()
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) >= 64:
            _CONSTANTS.clear()
        with torch.inference_mode(False):
            t = _CONSTANTS[key] = make()
    return t


def _rho(n: int, like: Tensor, log: bool = False) -> Tensor:
    """ρ = (n, n-1, ..., 1) (or log ρ) as a (1, n) row of ``like``'s dtype and device."""
    def make():
        rho = torch.arange(n, 0, -1, dtype=like.dtype, device=like.device).unsqueeze(0)
        return rho.log() if log else rho
    return _constant(("rho", n, like.dtype, like.device, log), make)


def _arange(n: int, ascending: bool, device: torch.device) -> Tensor:
    """The (1, n) int64 order of a row that is already sorted descending (0, 1, ...) or ascending (n-1, ..., 0)."""
    return _constant(("order", n, ascending, device), lambda: (
        torch.arange(n, device=device) if ascending else torch.arange(n - 1, -1, -1, device=device)).unsqueeze(0))


class FastSoftSort(RankingOperator):
    """Blondel et al. (2020) soft sort / soft rank as a ranking operator (no P, no top-k membership).

    Args:
        beta: inverse temperature β = 1/ε, ε torchsort's ``regularization_strength``; a float, or a 0-d tensor that
            requires grad (a learnable β: ∂/∂β by autograd through the scaling, see the methods).
        regularization: ``"l2"`` (quadratic, P_Q) or ``"kl"`` (entropic, P_E).

    Shapes: ``soft_rank(scores (B, n))`` / ``soft_sort(scores (B, n))`` → ``(B, n)``. ``forward`` and
    ``topk_membership`` raise (these operators give values, not probabilities). Exact second derivatives (both
    regularizations); ``torch.func`` (``grad``, ``jacrev``, ``vmap``) and ``torch.compile`` (the kernel is the
    operator ``torch.ops.diffrank.fast_soft_sort_project``) work.

    Raises:
        ValueError: beta <= 0, unknown regularization; ``forward`` / ``topk_membership`` always.
    """

    capabilities = frozenset({SOFT_SORT, SOFT_RANK})
    permutation_equivariant = True
    hard_beta = 100.0
    learnable_beta = True
    # no Triton path; a class attribute spares guarded_call's getattr(op, "backend") the miss through
    # nn.Module.__getattr__ (an exception per call, a few µs at n = 100)
    backend = None

    def __init__(self, beta: float | Tensor = 1.0, regularization: str = "l2") -> None:
        super().__init__(beta)
        if regularization not in REGULARIZATIONS:
            raise ValueError(f"regularization must be one of {REGULARIZATIONS}, got {regularization!r}")
        self.regularization = regularization
        self.regularization_strength = 1.0 / float(self.beta)

    @classmethod
    def with_strength(cls, regularization_strength: float, regularization: str = "l2") -> FastSoftSort:
        """The operator for a given ε (torchsort's ``regularization_strength``) instead of β = 1/ε.

        Raises:
            ValueError: ε <= 0 or an unknown regularization.
        """
        if not regularization_strength > 0:
            raise ValueError(f"regularization_strength must be > 0, got {regularization_strength}")
        op = cls(1.0 / regularization_strength, regularization)
        op.regularization_strength = float(regularization_strength)  # exact, not 1 / (1 / ε)
        return op

    def _soft_rank(self, scores: Tensor) -> Tensor:
        """Soft ranks, 1 = largest (paper §5 "soft ranking"): r = P_Q(-βθ, ρ) (l2) or exp P_E(-βθ, log ρ) (kl),
        ``torchsort.soft_rank(-θ)``; Σ r = n(n+1)/2 exactly for l2. β scales the input (torchsort's
        ``tensor * (1/ε)``), so a learnable β gets its gradient by autograd."""
        return self._rank(scores, -self.beta)

    def _soft_sort(self, scores: Tensor) -> Tensor:
        """Soft sort, descending (paper §5 "soft sorting"): P(ρ/ε, sort(θ)) (l2: Σ = Σ θ exactly; kl: Σ e^out =
        Σ e^θ), ``-torchsort.soft_sort(-θ)``; a learnable β enters as ρβ."""
        return _project(self._sort_z(scores, 1), scores.sort(dim=-1, descending=True).values,
                        self.regularization == "kl", 1)

    # torchsort's ascending forms, for diffrank.compat.torchsort (through RankingOperator._per_item: validated)
    def _soft_rank_ascending(self, scores: Tensor) -> Tensor:
        """``torchsort.soft_rank(θ)``: P_Q(βθ, ρ) or exp P_E(βθ, log ρ), rank 1 = the smallest."""
        return self._rank(scores, self.beta)

    def _soft_sort_ascending(self, scores: Tensor) -> Tensor:
        """``torchsort.soft_sort(θ)`` = -P(ρ/ε, sort(-θ)); for l2 that is P_Q(-ρ/ε, sort(θ)) (the projection onto
        -P(w) is the negated projection of -z onto P(w)), which needs no negation of the input or the output. The
        descending sort is the ascending one reversed, which orders tied values as torchsort's sort of -θ does (tied
        items get different gradients, so the order decides which gets which)."""
        if self.regularization == "kl":
            return -self._soft_sort(-scores)
        return _project(self._sort_z(scores, -1), scores.sort(dim=-1).values.flip(-1), False, -1)

    def _rank(self, scores: Tensor, scale: float | Tensor) -> Tensor:
        kl = self.regularization == "kl"
        mu = _project(scores * scale, _rho(scores.shape[-1], scores, log=kl), kl)
        return mu.exp() if kl else mu

    def _sort_z(self, scores: Tensor, sign: int) -> Tensor:
        """±ρ/ε, the point the soft sort projects: one (1, n) row shared by the batch (one sort of n items)."""
        rho = _rho(scores.shape[-1], scores)
        if isinstance(self.beta, Tensor):
            return rho * (self.beta if sign > 0 else -self.beta)
        eps = sign * self.regularization_strength
        return _constant(("z", *rho.shape, rho.dtype, rho.device, eps), lambda: rho / eps)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, regularization={self.regularization!r}"
