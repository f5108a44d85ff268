"""Fast differentiable sorting and ranking (Blondel, Teboul, Berthet, Djolonga, ICML 2020).

Soft rank and soft sort are regularised projections onto the permutahedron P(w) = conv{w_σ}
(paper §3-§5):

- ``l2`` (Q): P_Q(z, w) = argmin_{μ ∈ P(w)} ½‖μ - z‖²;
- ``kl`` (E): P_E(z, w) = log argmin_{μ ∈ P(e^w)} KL(μ, e^z).

Both reduce to an isotonic regression solved by pool adjacent violators (paper Prop. 3): with σ
sorting z descending and s = z_σ, v = argmin_{v_1 >= ... >= v_n} of ½‖v - (s - w)‖² (block value =
mean of s - w) or of ⟨e^{s-v}, 1⟩ + ⟨e^w, v⟩ (block value = LSE(s_B) - LSE(w_B)); the projection is
s - v, unsorted. O(n log n): one sort, then O(n) PAV, one kernel call for the batch: on the CPU
:mod:`diffrank.operators.fast_soft_sort_cpu` (compiled ahead of time or by numba's JIT), on CUDA the Triton kernels
of :mod:`diffrank.kernels.fast_soft_sort` (one program per row; ``backend``, see :class:`FastSoftSort`).

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
projected point (βθ, ρβ), so autograd gives ∂/∂β. With ``backend="auto"`` (default) CUDA inputs stay on the device
(the Triton kernels, forward and backward; no host copy) and CPU inputs take the CPU kernels; ``backend="torch"``
takes the CPU kernels everywhere (CUDA inputs are copied to the host and back), ``"triton"`` the Triton kernels
everywhere (on the CPU under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from diffrank.operators import fast_soft_sort_cpu as _cpu
from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import SOFT_RANK, SOFT_SORT, RankingOperator, beta_repr, constant

REGULARIZATIONS = ("l2", "kl")


# how a row is ordered (``z_how`` / ``w_how``): already descending / ascending (the soft sort's ±ρ/ε, ρ itself: no
# sort, the order is a cached arange), to sort descending, or to sort ascending and read reversed (the order
# torchsort's descending sort of -x gives tied values: tied items get different gradients, so it decides which)
DESCENDING, ASCENDING, SORT, SORT_AS_NEGATED = 1, -1, 0, 2


def _order(x: Tensor, how: int, descending: bool = True) -> Tensor:
    """The int64 indices that read each row of ``x`` (1 or B, n) in descending order (ascending with
    ``descending=False``: the order of -x; see :data:`SORT`)."""
    if how in (DESCENDING, ASCENDING):
        order = _arange(x.shape[-1], how == DESCENDING, x.device)
        return order if x.shape[0] == 1 else order.expand(x.shape).contiguous()
    if how == SORT:
        return torch.sort(x, dim=-1, descending=descending)[1]
    return torch.sort(x, dim=-1)[1]  # ascending: SORT_AS_NEGATED rows are read from the end (_desc)


def _desc(worder: Tensor, w_how: int) -> Tensor:
    """``worder`` as indices that read w descending (:data:`SORT_AS_NEGATED` keeps the ascending order: the kernel
    reads it from the end; the tensor operations need it reversed)."""
    return worder.flip(-1) if w_how == SORT_AS_NEGATED else worder


def _project_impl(z: Tensor, w: Tensor, kl: bool, z_how: int, w_how: int, scale: float, triton: bool,
                  views: list | None = None) -> tuple[Tensor, ...]:
    """(μ (B, n), order (like z), worder (like w), block (B, n)) of :class:`_Projection` through the Triton kernel
    on z's device (``triton``: :func:`diffrank.kernels.fast_soft_sort.project_fwd`) or the CPU kernel; ``z`` and
    ``w`` are (1 or B, n), a single row shared by the batch, read in the orders ``z_how`` / ``w_how``
    (:data:`SORT`; a cached order for a presorted row, see :func:`_fresh`); the projected point is ``scale·z``.
    ``views`` (a list) receives the numpy views of the three int64 outputs on the CPU, for the backward kernel.
    Without ``triton``, CUDA inputs go to the host and back."""
    z, w = z.detach(), w.detach()
    order, worder = _order(z, z_how, scale > 0), _order(w, w_how)
    if triton:
        from diffrank.kernels.fast_soft_sort import project_fwd

        mu, bid = project_fwd(z, scale, order, w, worder, w_how == SORT_AS_NEGATED, kl)
        return mu, order, worder, bid
    dev = z.device
    if dev.type != "cpu":
        z, order, w, worder = z.cpu(), order.cpu(), w.cpu(), worder.cpu()
    # the kernels take C-contiguous rows (the ahead-of-time module does not check: a strided view, e.g. torch.sort's
    # indices of a transposed input, would be read as garbage)
    z, w, order, worder = (t if t.is_contiguous() else t.contiguous() for t in (z, w, order, worder))
    shape = (max(z.shape[0], w.shape[0]), z.shape[1])
    mu = z.new_empty(shape)
    bid = order.new_empty(shape)
    arrays = order.numpy(), worder.numpy(), bid.numpy()
    _cpu.kernel("project_fwd", z.dtype)(z.numpy(), scale, arrays[0], w.numpy(), arrays[1], w_how == SORT_AS_NEGATED,
                                        kl, mu.numpy(), arrays[2])
    if views is not None and dev.type == "cpu":
        views.extend(arrays)
    if dev.type != "cpu":
        return mu.to(dev), order.to(dev), worder.to(dev), bid.to(dev)
    return mu, order, worder, bid


def _fresh(out: tuple[Tensor, ...], z_how: int, w_how: int) -> tuple[Tensor, ...]:
    """``out`` without the cached constant orders, for a Function or operator output (autograd and torch.library
    take ownership of outputs)."""
    mu, order, worder, bid = out
    presorted = (DESCENDING, ASCENDING)
    return (mu, order.clone() if z_how in presorted else order, worder.clone() if w_how in presorted else worder,
            bid)


@torch.library.custom_op("diffrank::fast_soft_sort_project", mutates_args=())
def _project_op(z: Tensor, w: Tensor, kl: bool, z_how: int, w_how: int, scale: float,
                triton: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`_project_impl` as an operator that ``torch.compile`` does not trace into (numba / the compiled
    module are opaque to dynamo; tracing numba's dispatcher crashed it)."""
    return _fresh(_project_impl(z, w, kl, z_how, w_how, scale, triton), z_how, w_how)


@_project_op.register_fake
def _(z: Tensor, w: Tensor, kl: bool, z_how: int, w_how: int, scale: float,
      triton: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    shape = (max(z.shape[0], w.shape[0]), z.shape[1])
    return (z.new_empty(shape), z.new_empty(z.shape, dtype=torch.int64), z.new_empty(w.shape, dtype=torch.int64),
            z.new_empty(shape, dtype=torch.int64))


def _block_softmax(x: Tensor, bid: Tensor) -> Tensor:
    """softmax of ``x`` (B, n) over each block (``bid``: the block of each position), in differentiable ops."""
    top = torch.full_like(x, float("-inf")).scatter_reduce(-1, bid, x.detach(), "amax")
    e = (x - top.gather(-1, bid)).exp()
    return e / torch.zeros_like(e).scatter_add(-1, bid, e).gather(-1, bid)


def _block_sum(x: Tensor, bid: Tensor) -> Tensor:
    """Σ of ``x`` (B, n) over each block, at every position of the block."""
    return torch.zeros_like(x).scatter_add(-1, bid, x).gather(-1, bid)


def _weights(z: Tensor | None, w: Tensor | None, order: Tensor, worder: Tensor, bid: Tensor, kl: bool,
             dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """p, q (B, n, sorted positions): ∂v/∂s_j = p_j and ∂v/∂w_j = -q_j within a block (1/|B|, or the block
    softmax of s and of the sorted w)."""
    if kl:
        return (_block_softmax(z.expand(bid.shape).gather(-1, order), bid),
                _block_softmax(w.expand(bid.shape).gather(-1, worder), bid))
    p = 1 / _block_sum(torch.ones(bid.shape, dtype=dtype, device=bid.device), bid)
    return p, p


def _vjp_ops(g: Tensor, z: Tensor | None, w: Tensor | None, order: Tensor, worder: Tensor, bid: Tensor, kl: bool,
             need_w: bool, scale: float) -> tuple[Tensor, Tensor | None]:
    """The VJP of :func:`_cpu.project_bwd` in differentiable tensor operations: what double backward, torch.func
    transforms and torch.compile differentiate (for kl the block softmax depends on z and w). Returns (B, n)
    gradients in z's and w's order; the caller sums a shared input's."""
    order, worder = order.expand_as(g), worder.expand_as(g)
    gs = g.gather(-1, order)
    tot = _block_sum(gs, bid)
    p, q = _weights(None if z is None else z * scale, w, order, worder, bid, kl, g.dtype)
    gz = torch.zeros_like(gs).scatter(-1, order, (gs - p * tot) * scale)
    return gz, (torch.zeros_like(gs).scatter(-1, worder, q * tot) if need_w else None)


def _jvp_ops(dz: Tensor | None, dw: Tensor | None, z: Tensor, w: Tensor, order: Tensor, worder: Tensor,
             bid: Tensor, kl: bool, scale: float) -> Tensor:
    """The JVP of the projection (forward mode: ``torch.func.jvp``, ``jacfwd``, ``hessian``), in differentiable
    tensor operations: per block dμ_i = ds_i - (Σ p ds - Σ q dw_sorted) with p, q of :func:`_weights`."""
    order, worder = order.expand(bid.shape), worder.expand(bid.shape)
    p, q = _weights(z * scale, w, order, worder, bid, kl, z.dtype)
    ds = dz.expand(bid.shape).gather(-1, order) * scale if dz is not None else torch.zeros_like(p)
    dv = _block_sum(ds * p, bid)
    if dw is not None:
        dv = dv - _block_sum(dw.expand(bid.shape).gather(-1, worder) * q, bid)
    return torch.zeros_like(ds).scatter(-1, order, ds - dv)


def _backward(ctx, g: Tensor, z: Tensor | None, w: Tensor | None, order: Tensor, worder: Tensor, bid: Tensor):
    """The backward of both Functions: ``ctx.kl``, ``ctx.rows`` (the row counts of z and w), ``ctx.triton``, ``z``
    and ``w`` (saved for kl only) and the forward's orders and blocks.

    A kernel's VJP on a plain cotangent with no graph to record: the Triton kernel where the forward ran it
    (:func:`diffrank.kernels.fast_soft_sort.project_bwd`), else the CPU kernel on a CPU cotangent; otherwise (double
    backward, torch.func transforms, compiling, CUDA without Triton) :func:`_vjp_ops`, whose derivatives are exact:
    zero a.e. in z and w for l2 (the Jacobian is piecewise constant), the block softmax's for kl.
    """
    need_z, need_w = ctx.needs_input_grad[:2]
    plain = (not torch.is_grad_enabled() and type(g) is Tensor and not torch.compiler.is_compiling()
             and not torch._C._functorch.is_functorch_wrapped_tensor(g))
    if plain and ctx.triton:
        from diffrank.kernels.fast_soft_sort import project_bwd

        gz, gw = project_bwd(g, None if z is None else z.detach(), ctx.scale, order, w.detach() if w is not None
                             else g[:ctx.rows[1]], worder, ctx.w_how == SORT_AS_NEGATED, bid, ctx.kl, need_z, need_w)
    elif plain and g.is_cpu:
        gn = g.contiguous().numpy()
        gz = torch.empty_like(g, memory_format=torch.contiguous_format) if need_z else None
        gw = torch.empty_like(g, memory_format=torch.contiguous_format) if need_w else None
        # gn stands in for what the kernel does not read (z, w for l2; an unneeded gradient)
        zz = gn if z is None else z.detach().contiguous().numpy()
        ww = gn[:ctx.rows[1]] if w is None else w.detach().contiguous().numpy()
        views = getattr(ctx, "views", None) or (order.numpy(), worder.numpy(), bid.numpy())
        _cpu.kernel("project_bwd", g.dtype)(gn, zz, ctx.scale, views[0], ww, views[1], ctx.w_how == SORT_AS_NEGATED,
                                            views[2], ctx.kl, need_z, need_w, gn if gz is None else gz.numpy(),
                                            gn if gw is None else gw.numpy())
    else:
        gz, gw = _vjp_ops(g, z, w, order, _desc(worder, ctx.w_how), bid, ctx.kl, need_w, ctx.scale)
    # a single row shared by the batch (z of the soft sort, w of the soft rank) gets the sum of the rows
    if need_z and ctx.rows[0] != gz.shape[0]:
        gz = gz.sum(0, keepdim=True)
    if need_w and ctx.rows[1] != gw.shape[0]:
        gw = gw.sum(0, keepdim=True)
    return (gz if need_z else None), (gw if need_w else None), None, None, None, None, None


class _Projection(torch.autograd.Function):
    """μ = P(z, w): the projection of z (1 or B, n) onto the permutahedron of w (1 or B, n), l2 (P_Q) or kl (P_E,
    in log space) (Blondel et al. 2020, Prop. 3 and §5), differentiable in both z and w; a single row is shared by
    the batch; ``z_how`` / ``w_how`` say whether a row is presorted (:data:`SORT`).

    Returns (μ (B, n), order, worder, block) with the last three int64 and non-differentiable (saved for the
    backward, :func:`_backward`). This form (``setup_context``, vmap and jvp rules, the kernel as a custom op while
    compiling) is the one torch.func and torch.compile need; eager calls take :class:`_ProjectionEager`.
    """

    @staticmethod
    def forward(z: Tensor, w: Tensor, kl: bool, z_how: int, w_how: int, scale: float,
                triton: bool) -> tuple[Tensor, ...]:
        if torch.compiler.is_compiling():
            return _project_op(z, w, kl, z_how, w_how, scale, triton)
        return _fresh(_project_impl(z, w, kl, z_how, w_how, scale, triton), z_how, w_how)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        z, w, kl, _, w_how, scale, ctx.triton = inputs
        _, order, worder, bid = output
        ctx.mark_non_differentiable(order, worder, bid)
        ctx.save_for_backward(z if kl else None, w if kl else None, order, worder, bid)
        ctx.save_for_forward(z, w, order, worder, bid)
        ctx.kl, ctx.rows, ctx.scale, ctx.w_how = kl, (z.shape[0], w.shape[0]), scale, w_how

    @staticmethod
    def backward(ctx, g: Tensor, _g_order, _g_worder, _g_bid):
        return _backward(ctx, g, *ctx.saved_tensors)

    @staticmethod
    def jvp(ctx, dz: Tensor | None, dw: Tensor | None, _kl, _z_how, _w_how, _scale, _triton):
        """Forward-mode derivative (``torch.func.jvp``, ``jacfwd``, ``torch.func.hessian``)."""
        z, w, order, worder, bid = ctx.saved_tensors
        return _jvp_ops(dz, dw, z, w, order, _desc(worder, ctx.w_how), bid, ctx.kl, ctx.scale), None, None, None

    @staticmethod
    def vmap(info, in_dims, z: Tensor, w: Tensor, kl: bool, z_how: int, w_how: int, scale: float, triton: bool):
        """Fold the vmapped dimension into the batch, (V, B, n) -> (V·B, n); a shared unbatched row stays shared."""
        V = info.batch_size
        xs = [x if d is None else x.movedim(d, 0) for x, d in zip((z, w), in_dims[:2])]
        B = max(x.shape[-2] for x in xs)
        n = z.shape[-1]
        shared = [d is None and x.shape[0] == 1 for x, d in zip(xs, in_dims[:2])]
        flat = [x if sh else x.expand(V, B, n).reshape(V * B, n) for x, sh in zip(xs, shared)]
        mu, order, worder, bid = _Projection.apply(flat[0], flat[1], kl, z_how, w_how, scale, triton)
        orders = [o if sh else o.reshape(V, B, n) for o, sh in zip((order, worder), shared)]
        return (mu.reshape(V, B, n), *orders, bid.reshape(V, B, n)), (0, None if shared[0] else 0,
                                                                     None if shared[1] else 0, 0)


class _ProjectionEager(torch.autograd.Function):
    """:class:`_Projection` for eager calls outside torch.func transforms, returning μ alone: ``Function.apply``
    binds the arguments through ``inspect.signature`` on every call when ``setup_context`` is defined (about 50 µs,
    more than the whole projection of n = 100 items), and each extra output costs a wrapper too."""

    @staticmethod
    def forward(ctx, z: Tensor, w: Tensor, kl: bool, z_how: int, w_how: int, scale: float, triton: bool) -> Tensor:
        ctx.views = []  # int64 outputs and their numpy views: plain attributes, no autograd
        mu, ctx.order, ctx.worder, ctx.bid = _project_impl(z, w, kl, z_how, w_how, scale, triton, ctx.views)
        if kl:
            ctx.save_for_backward(z, w)
        ctx.kl, ctx.rows, ctx.scale, ctx.w_how, ctx.triton = kl, (z.shape[0], w.shape[0]), scale, w_how, triton
        return mu

    @staticmethod
    def backward(ctx, g: Tensor):
        z, w = ctx.saved_tensors if ctx.kl else (None, None)
        return _backward(ctx, g, z, w, ctx.order, ctx.worder, ctx.bid)


def _project(z: Tensor, w: Tensor, kl: bool, z_how: int = SORT, w_how: int = DESCENDING,
             scale: float = 1.0, triton: bool = False) -> Tensor:
    """μ = P(scale·z, w) (see :class:`_Projection`), through the Function that fits the context; ``triton``: the
    Triton kernels (z's device), else the CPU kernels."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return _Projection.apply(z, w, kl, z_how, w_how, scale, triton)[0]
    return _ProjectionEager.apply(z, w, kl, z_how, w_how, scale, triton)


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
            t = _CONSTANTS[key] = constant(make)
    return t


def _rho(n: int, like: Tensor, log: bool = False) -> Tensor:
    """ρ = (n, n-1, ..., 1) (or log ρ) as a (1, n) row of ``like``'s dtype and device."""
    def make():
        """ρ (or log ρ), built once per (n, dtype, device, log) and cached by :func:`_constant`."""
        rho = torch.arange(n, 0, -1, dtype=like.dtype, device=like.device).unsqueeze(0)
        return rho.log() if log else rho
    return _constant(("rho", n, like.dtype, like.device, log), make)


def _arange(n: int, row_descending: bool, device: torch.device) -> Tensor:
    """The (1, n) int64 order that reads a row already sorted descending (0, 1, ...) or ascending (n-1, ..., 0)
    in descending order."""
    return _constant(("order", n, row_descending, device), lambda: (
        torch.arange(n, device=device) if row_descending else torch.arange(n - 1, -1, -1, device=device)).unsqueeze(0))


class FastSoftSort(RankingOperator):
    """Blondel et al. (2020) soft sort / soft rank as a ranking operator (no P, no top-k membership).

    Args:
        beta: inverse temperature β = 1/ε, ε torchsort's ``regularization_strength``; a float, or a 0-d tensor that
            requires grad (a learnable β: ∂/∂β by autograd through the scaling, see the methods).
        regularization: ``"l2"`` (quadratic, P_Q) or ``"kl"`` (entropic, P_E).
        backend: ``"auto"`` (the Triton kernels of :mod:`diffrank.kernels.fast_soft_sort` on CUDA inputs, no host
            copy; the CPU kernels of :mod:`diffrank.operators.fast_soft_sort_cpu` elsewhere), ``"torch"`` (the
            non-Triton path: the CPU kernels, CUDA inputs copied to the host and back) or ``"triton"`` (the Triton
            kernels everywhere; on the CPU only under ``TRITON_INTERPRET=1``), see :mod:`diffrank.operators.backend`.
            The same projection and blocks either way (both accumulate in float64).

    Shapes: ``soft_rank(scores (B, n))`` / ``soft_sort(scores (B, n))`` → ``(B, n)``. ``forward`` and
    ``topk_membership`` raise (these operators give values, not probabilities). Exact second derivatives (both
    regularizations); ``torch.func`` (``grad``, ``jacrev``, ``vmap``) and ``torch.compile`` (the kernel is the
    operator ``torch.ops.diffrank.fast_soft_sort_project``) work.

    Raises:
        ValueError: beta <= 0, unknown regularization or backend (``"triton"`` without the triton package);
            ``forward`` / ``topk_membership`` always.
    """

    capabilities = frozenset({SOFT_SORT, SOFT_RANK})
    permutation_equivariant = True
    hard_beta = 100.0
    learnable_beta = True
    low_memory = True  # no (B, m, n) buffer but for the permutation (diffrank.operators.memory)
    paper = "Blondel, Teboul, Berthet, Djolonga, ICML 2020, §3-5, Prop. 3 (`l2` / `kl`)"
    parameter = "ε = 1/β (regularisation strength)"

    def __init__(self, beta: float | Tensor = 1.0, regularization: str = "l2", backend: str = "auto") -> None:
        super().__init__(beta)
        if regularization not in REGULARIZATIONS:
            raise ValueError(f"regularization must be one of {REGULARIZATIONS}, got {regularization!r}")
        self.regularization = regularization
        self._strength = None if isinstance(self.beta, Tensor) else 1.0 / self.beta
        self.backend = check_backend(backend)

    @property
    def regularization_strength(self) -> float:
        """ε = 1/β, torchsort's ``regularization_strength`` (for a learnable β its current value, read from the
        tensor without its graph)."""
        return 1.0 / float(self.beta.detach()) if self._strength is None else self._strength

    @regularization_strength.setter
    def regularization_strength(self, value: float) -> None:
        self._strength = float(value)

    @classmethod
    def with_strength(cls, regularization_strength: float, regularization: str = "l2",
                      backend: str = "auto") -> FastSoftSort:
        """The operator for a given ε (torchsort's ``regularization_strength``) instead of β = 1/ε.

        Raises:
            ValueError: ε not a finite number > 0 (or so small that 1/ε overflows), an unknown regularization or
                backend.
        """
        if not (isinstance(regularization_strength, numbers.Real) and math.isfinite(regularization_strength)
                and regularization_strength > 0 and math.isfinite(1.0 / regularization_strength)):
            raise ValueError(f"regularization_strength (ε = 1/β) must be a finite positive number, got "
                             f"{regularization_strength!r}")
        op = cls(1.0 / regularization_strength, regularization, backend)
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
        return _project(self._sort_z(scores, 1), scores, self.regularization == "kl", DESCENDING, SORT,
                        triton=use_triton(self.backend, scores))

    # torchsort's ascending forms, for diffrank.compat.torchsort (through RankingOperator._per_item: validated)
    def _soft_rank_ascending(self, scores: Tensor) -> Tensor:
        """``torchsort.soft_rank(θ)``: P_Q(βθ, ρ) or exp P_E(βθ, log ρ), rank 1 = the smallest."""
        return self._rank(scores, self.beta)

    def _soft_sort_ascending(self, scores: Tensor) -> Tensor:
        """``torchsort.soft_sort(θ)`` = -P(ρ/ε, sort(-θ)); for l2 that is P_Q(-ρ/ε, sort(θ)) (the projection onto
        -P(w) is the negated projection of -z onto P(w)), which needs no negation of the input or the output; θ is
        read in the order torchsort's sort of -θ gives tied values (:data:`SORT_AS_NEGATED`)."""
        if self.regularization == "kl":
            return -self._soft_sort(-scores)
        return _project(self._sort_z(scores, -1), scores, False, ASCENDING, SORT_AS_NEGATED,
                        triton=use_triton(self.backend, scores))

    def _rank(self, scores: Tensor, scale: float | Tensor) -> Tensor:
        kl = self.regularization == "kl"
        rho = _rho(scores.shape[-1], scores, log=kl)
        triton = use_triton(self.backend, scores)
        if isinstance(scale, Tensor):  # a learnable β: scaled here, for autograd
            mu = _project(scores * scale, rho, kl, triton=triton)
        else:  # scaled inside the kernel: no scaled copy, no extra node in the graph
            mu = _project(scores, rho, kl, scale=scale, triton=triton)
        return mu.exp() if kl else mu

    def _sort_z(self, scores: Tensor, sign: int) -> Tensor:
        """±ρ/ε, the point the soft sort projects: one (1, n) row shared by the batch (one sort of n items)."""
        rho = _rho(scores.shape[-1], scores)
        if isinstance(self.beta, Tensor):
            return rho * (self.beta if sign > 0 else -self.beta)
        eps = sign * self.regularization_strength
        return _constant(("z", *rho.shape, rho.dtype, rho.device, eps), lambda: rho / eps)

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, regularization={self.regularization!r}, backend={self.backend!r}"
