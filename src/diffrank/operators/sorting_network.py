"""Relaxed comparator networks as ranking operators: :class:`ComparatorNetwork` (odd-even, bitonic, splitter).

One operator class serves the four network configs (``configs/operator/``): ``diffsort_odd_even`` and
``diffsort_bitonic`` (differentiable sorting networks, Petersen et al., ICML 2021; thesis §3.2) with
diffsort's defaults, ``difftopk_bitonic`` and ``difftopk_splitter`` (differentiable top-k networks,
Petersen et al., ICML 2022, §3 and App. B) with difftopk's. The networks themselves are built in
:mod:`diffrank.operators.networks` (the bitonic one for every n: docs/conventions.md, "Bitonic networks for
every n (−∞ sentinels)"). P equals diffsort's ``DiffSortNet('odd_even' | 'bitonic', n)`` (bitonic: n a power
of two) and the k rows equal difftopk's ``DiffTopkNet`` output after the orientation map of
docs/conventions.md, "Orientation against diffsort / difftopk" (tested for every sigmoid). For other n the
bitonic network deliberately differs from the reference, which does not sort for 708 sizes n <= 1024.

A layer of comparators (hi, lo) acts on a vector x of wire values as (Petersen et al. 2021, Eq. 1)

    α = f(β (x_hi - x_lo)),   x'_hi = α x_hi + (1-α) x_lo,   x'_lo = (1-α) x_hi + α x_lo.

With the layer's wire permutation ``partner`` (hi ↔ lo, idle wires fixed, so their difference is 0) and
per-wire weight w = 1 - α this is one gather and one lerp for every wire at once:

    x' = x + w ⊙ (x[partner] - x).

No selection matrices, no matmuls: O(B·n) per layer for the values. The layer's mixing matrix M_t
(output wire × input wire) is symmetric and doubly stochastic, and P = M_T ⋯ M_1 (rows = output wires,
columns = items), so

- full P: start from I and apply the same gather + lerp to the *rows* of a (B, n, n) matrix: O(L·B·n²);
- any m rows W·P (top-k rows, top-k membership, soft ranks): the bidirectional evaluation of Petersen
  et al. 2022 (Eq. 3): run the values forward keeping each layer's w (B, n), then push the
  (B, m, n) matrix Y = W from the output side back to the input, Y ← Y M_t for t = T … 1, which is the
  same gather + lerp on the *columns* of Y. Memory O(L·B·n) for the weights plus O(L·B·m·n) saved for
  the backward pass, never O(L·B·n²).

Layers whose pairs are a strided pattern (odd-even, power-of-two bitonic: ``Layer.block``) skip the
gather and work on (nb, 2, d) views in place. The whole network is one autograd node (:class:`_Net`)
with a hand-written backward pass (closed-form sigmoid slopes); :func:`reference_forward` is the same
computation in plain autograd ops, and the tests check values and gradients of one against the other. A backward
that is itself recorded (``create_graph=True``, ``torch.func``) differentiates :func:`reference_forward` instead
(:func:`differentiable_vjp`), so second derivatives are exact on every path (Newton losses, Hessians); a learnable
β (a tensor that requires grad) runs :func:`reference_forward` directly. ``torch.func.vmap`` folds the mapped
dimension into the batch; ``torch.compile`` runs the Function with graph breaks.

Half-precision inputs are computed in float32 (α, values and P) and the result is cast back (by
:class:`~diffrank.operators.base.RankingOperator`): hundreds of chained lerps in float16 / bfloat16 would
lose the precision the relaxation is meant to keep.

Cost per call (L layers): full P O(L·B·n²); soft-sorted values O(L·B·n); k rows, top-k membership and soft
ranks O(L·B·m·n) for m rows, never a (B, n, n) matrix (difftopk's dense path needs O(L·B·n²), 15 GB at
n = 1000, B = 64). The splitter selection network for n = 1000, k = 5 has 22 layers / 5 085 comparators
where the bitonic sorter has 55 / 27 268.

``backend`` (:mod:`diffrank.operators.backend`): with ``"auto"`` on CUDA or ``"triton"``,
float32 computations with n <= 4096 run the fused Triton kernels of ``src/diffrank/kernels/networks.py`` (one launch for
the values and the weights of all layers, one for the rows, full P as the rows of I); float64 and larger n
run the PyTorch path below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from diffrank.operators._vmap import fold_vmap
from diffrank.operators.backend import check_backend, guarded_call, use_triton
from diffrank.operators.base import PERMUTATION, TOPK_MEMBERSHIP, RankingOperator, beta_repr, check_k, constant
from diffrank.operators.memory import DENSE_BUFFERS, DenseMemoryError
from diffrank.operators.networks import Network, build
from diffrank.operators.sigmoids import check_art_lambda, check_sigmoid, swap_slope, swap_weight

# a beta at which P of scores spaced >= 0.5 apart is within 1e-3 of the hard permutation for n <= 8
# (operator contract): 1 - α ≈ e^{-β/2} for the exponential tails, ≈ 1/(c β) for the algebraic ones
HARD_BETA = {"logistic": 50.0, "logistic_phi": 50.0, "gaussian": 50.0,
             "reciprocal": 1e6, "cauchy": 1e6, "optimal": 1e5}


def _pairs(y: Tensor, block: tuple[int, int, int], dim: int) -> tuple[Tensor, Tensor]:
    """Views of the first and second wire of every comparator of a strided layer, (…, nb, d, …)."""
    off, nb, d = block
    v = y.narrow(dim, off, 2 * nb * d).unflatten(dim, (nb, 2, d))
    return v.select(dim + 1, 0), v.select(dim + 1, 1)


def _direction(layer, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(nb, d) +1 where a strided layer's first wire is its ``hi`` wire, -1 where it is ``lo`` (cached)."""
    key = ("dir", torch.device(device), dtype)
    out = layer._cache.get(key)
    if out is None:
        _, sign = layer.tensors(device, dtype)
        out = constant(lambda: _pairs(sign.unsqueeze(0), layer.block, 1)[0][0].contiguous())
        layer._cache[key] = out
    return out


def _mix(z: Tensor, layer, w: Tensor, dim: int) -> Tensor:
    """One layer of the P / rows chain in place on ``z`` (wires along ``dim``: 1 for P, 2 for rows); returns the
    partner differences the backward needs (for a strided layer, those of its comparators only)."""
    wx = w.unsqueeze(-1) if dim == 1 else w.unsqueeze(1)
    if layer.block is not None:
        zf, zs = _pairs(z, layer.block, dim)
        dz = zs - zf
        step = dz * wx
        zf += step
        zs -= step
    else:
        partner, _ = layer.tensors(z.device, z.dtype)
        dz = z.index_select(dim, partner) - z
        z.addcmul_(wx, dz)
    return dz


#: above this many elements (L x the chain's B·n² or B·m·n) the P / rows chain is checkpointed, not saved
CHECKPOINT_ELEMENTS = 2 ** 25


def _segment(L: int, elements: int) -> int:
    """Layers per checkpoint of a P / rows chain of ``elements`` per layer: 1 (every layer's differences saved,
    no recomputation) while L x elements <= :data:`CHECKPOINT_ELEMENTS`, else ⌈√L⌉ (⌈L/S⌉ snapshots and S
    recomputed layers)."""
    return 1 if L * elements <= CHECKPOINT_ELEMENTS else math.isqrt(L - 1) + 1


def _replay(snaps: Sequence[Tensor], layers: Sequence, ws: Sequence[Tensor], dim: int, S: int):
    """The chain's partner differences in reverse chain order: saved ones (S = 1), or recomputed segment by
    segment from the snapshots the forward kept (one at the start of every S layers)."""
    if S == 1:
        yield from reversed(snaps)
        return
    for j in range(len(snaps) - 1, -1, -1):
        z = snaps[j].clone()
        deltas = [_mix(z, layers[t], ws[t], dim) for t in range(j * S, min(len(layers), (j + 1) * S))]
        del z
        while deltas:
            yield deltas.pop()


def _walk(x: Tensor, net: Network, beta: float, sigmoid: str, art_lambda: float, mode: str,
          y0: Tensor | None) -> tuple[Tensor, ...]:
    """The PyTorch forward of :class:`_Net`: the network walked layer by layer on a copy of ``x`` ``(B, n)``;
    returns the output, then per layer Δ, then per layer w, then the snapshots of P / rows (see :class:`_Net`)."""
    x = x.clone(memory_format=torch.contiguous_format)
    B, n = x.shape
    p = torch.eye(n, dtype=x.dtype, device=x.device).repeat(B, 1, 1) if mode == "full" else None
    L = len(net.layers)
    S = _segment(L, B * n * (n if mode == "full" else y0.shape[1] if mode == "rows" else 0))
    xd, ws, snaps = [], [], []
    for t, layer in enumerate(net.layers):
        if layer.block is not None:
            first, second = _pairs(x, layer.block, 1)
            delta = second - first
            w = 1.0 - swap_weight(_direction(layer, x.device, x.dtype) * -delta, beta, sigmoid, art_lambda)
            step = w * delta
            first += step
            second -= step
        else:
            partner, sign = layer.tensors(x.device, x.dtype)
            delta = x.index_select(1, partner) - x
            w = 1.0 - swap_weight(sign * -delta, beta, sigmoid, art_lambda)
            x.addcmul_(w, delta)
        if p is not None:
            if S > 1 and t % S == 0:
                snaps.append(p.clone())
            dp = _mix(p, layer, w, 1)
            if S == 1:
                snaps.append(dp)
        xd.append(delta)
        ws.append(w)
    out = x if mode == "values" else p
    if mode == "rows":
        # a copy even when y0 already has B rows: the chain below updates y in place
        y = y0.expand(B, -1, -1).clone(memory_format=torch.contiguous_format)
        for i, (layer, w) in enumerate(zip(reversed(net.layers), reversed(ws))):  # layer T first
            if S > 1 and i % S == 0:
                snaps.append(y.clone())
            dy = _mix(y, layer, w, 2)
            if S == 1:
                snaps.append(dy)
        out = y
    return (out, *xd, *ws, *snaps)


class _Net(torch.autograd.Function):
    """The whole relaxed network in one autograd node: values, and optionally full P or rows W·P; with
    ``kernel=True`` through the fused launches of :mod:`diffrank.kernels.networks` (values or rows, float32),
    else in PyTorch (:func:`_walk`).

    Forward, per layer (strided layers on views of the wires, others through the wire permutation):
    Δ = x_second - x_first, α = f(β·(x_hi - x_lo)), w = 1 - α, first += w·Δ, second -= w·Δ (the update
    is symmetric in the two wires; the direction only enters α). ``mode``:

    - ``"values"``: returns the output values (B, n);
    - ``"full"``: also mixes the rows of P (B, n, n), starting from I, layer by layer; returns P;
    - ``"rows"``: after the values, pushes ``y0`` (B, m, n) through the layers from the output side
      (Petersen et al. 2022, Eq. 3); returns the rows.

    Backward: the layer matrices are symmetric, so gradients of P / rows go through the same layers in
    the opposite order, giving dL/dw = -Σ (G_second - G_first)·Δ_P per comparator; then the values are
    walked back with the closed-form slope of the sigmoid (:func:`swap_slope`). Saved: per layer Δ and w
    of the values (O(L·B·n)) and the Δ of P / rows (O(L·B·n²) for full P, O(L·B·m·n) for rows) while that is
    at most :data:`CHECKPOINT_ELEMENTS`; above, only a snapshot of the chain every S = ⌈√L⌉ layers, from
    which the backward recomputes one segment's Δ at a time (activation checkpointing): O(√L·B·n²) for full P
    (n = 1 024, odd-even: 2.0 GiB saved without, see docs/gpu.md), for one more pass of the chain.

    Second derivatives are exact: a backward that is itself recorded (``create_graph=True``, ``torch.func``)
    recomputes the network in plain autograd ops (:func:`differentiable_vjp`) instead of the fused walk, whose
    in-place updates autograd cannot differentiate. For ``torch.func`` the forward takes no ``ctx`` (its
    intermediates are extra, non-differentiable outputs) and ``vmap`` folds the mapped dimension into the batch
    (:func:`fold_vmap`): every row is an independent network evaluation. Forward mode (``torch.func.jvp``,
    ``jacfwd``, ``torch.func.hessian``) is the plain-autograd network's JVP (:meth:`jvp`; under ``torch.func`` only:
    PyTorch does not nest forward-mode levels of ``torch.autograd.forward_ad``).
    """

    twice_differentiable = True  # read by diffrank.losses.newton (the backward is differentiable, see above)

    @staticmethod
    def forward(x: Tensor, net: Network, beta: float, sigmoid: str, art_lambda: float, mode: str,
                y0: Tensor | None, kernel: bool) -> tuple[Tensor, ...]:
        if kernel:
            from diffrank.kernels.networks import network_forward

            return network_forward(x, net, beta, sigmoid, art_lambda, mode, y0)
        return _walk(x, net, beta, sigmoid, art_lambda, mode, y0)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        x, net, beta, sigmoid, art_lambda, mode, y0, ctx.kernel = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)  # no zero gradients for the intermediates
        ctx.save_for_backward(x, y0, *output[1:])
        ctx.save_for_forward(x, y0)
        ctx.n_extra = len(output) - 1
        ctx.net, ctx.beta, ctx.sigmoid, ctx.art_lambda, ctx.mode = net, beta, sigmoid, art_lambda, mode
        B, n = x.shape
        ctx.segment = _segment(len(net.layers), B * n * (n if mode == "full" else y0.shape[1] if mode == "rows"
                                                          else 0))

    @staticmethod
    def vmap(info, in_dims, x, net, beta, sigmoid, art_lambda, mode, y0, kernel):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return fold_vmap(info, in_dims, _Net.apply, (x, net, beta, sigmoid, art_lambda, mode, y0, kernel),
                         rows=(0, 6))

    @staticmethod
    def jvp(ctx, x_t: Tensor | None, *_):
        """Forward mode (``torch.func.jvp`` / ``jacfwd`` / ``hessian``): the plain-autograd network's JVP."""
        x, y0 = ctx.saved_tensors[:2]
        out_t = torch.func.jvp(lambda xr: reference_forward(ctx.net, xr, ctx.beta, ctx.sigmoid, ctx.art_lambda,
                                                             ctx.mode, y0), (x,), (x_t,))[1]
        return (out_t, *(None,) * ctx.n_extra)

    @staticmethod
    def backward(ctx, g: Tensor | None, *_):
        """The VJP: recorded (grad mode on) the exact, differentiable one; else the kernels' backward, or the
        layers walked back with the saved Δ, w and snapshots (:func:`_rows_weight_grads`,
        :func:`_full_layer_backward`, :func:`_values_layer_backward`)."""
        none = (None,) * 7
        if g is None:
            return (None, *none)
        net, mode = ctx.net, ctx.mode
        saved = ctx.saved_tensors
        if torch.is_grad_enabled():  # the backward is recorded: exact second derivatives
            return (differentiable_vjp(net, saved[0], ctx.beta, ctx.sigmoid, ctx.art_lambda, mode, saved[1], g),
                    *none)
        if ctx.kernel:
            from diffrank.kernels.networks import network_backward

            w, d = saved[2:]
            return (network_backward(g, w, d, saved[1], net, ctx.beta, ctx.sigmoid, ctx.art_lambda, mode), *none)
        layers = net.layers
        L = len(layers)
        xd, ws, snaps = saved[2:L + 2], saved[L + 2:2 * L + 2], saved[2 * L + 2:]
        g = g.contiguous().clone()
        gws: list[Tensor | None] = [None] * L
        if mode == "rows":
            gws = _rows_weight_grads(g, layers, ws, snaps, ctx.segment)
        gp = g if mode == "full" else None
        if mode in ("rows", "full"):
            gx = torch.zeros(g.shape[0], net.n, dtype=g.dtype, device=g.device)
        else:
            gx = g
        deltas = _replay(snaps, layers, ws, 1, ctx.segment) if gp is not None else None
        for t in range(L - 1, -1, -1):
            layer, w = layers[t], ws[t]
            # full P is walked back together with the values
            gw = _full_layer_backward(layer, gp, w, next(deltas)) if gp is not None else gws[t]
            gx = _values_layer_backward(layer, gx, gw, w, xd[t], ctx.beta, ctx.sigmoid, ctx.art_lambda)
        return (gx, *none)


def _rows_weight_grads(g: Tensor, layers, ws, snaps, segment) -> list[Tensor]:
    """Rows mode of :class:`_Net`'s backward: the rows chain ran t = T-1 … 0, so it is walked back t = 0 … T-1
    (each layer matrix is symmetric), turning ``g`` ``(B, m, n)`` in place; returns each layer's weight gradient."""
    gws = []
    deltas = _replay(snaps, layers[::-1], ws[::-1], 2, segment)
    for layer, w in zip(layers, ws):
        dy = next(deltas)
        if layer.block is not None:
            gf, gs = _pairs(g, layer.block, 2)
            e = gs - gf
            gws.append(-torch.linalg.vecdot(e, dy, dim=1))
            step = e * w.unsqueeze(1)
            gf += step
            gs -= step
        else:
            partner, _ = layer.tensors(g.device, g.dtype)
            gws.append(torch.linalg.vecdot(g, dy, dim=1))
            g.addcmul_(w.unsqueeze(1), g.index_select(2, partner) - g)
    return gws


def _full_layer_backward(layer, gp: Tensor, w: Tensor, dp: Tensor) -> Tensor:
    """One layer of full P walked back in :class:`_Net`'s backward: ``gp`` ``(B, n, n)`` turned in place, given
    the replayed P gradient term ``dp``; returns the layer's weight gradient."""
    if layer.block is not None:
        gf, gs = _pairs(gp, layer.block, 1)
        e = gs - gf
        gw = -torch.linalg.vecdot(e, dp, dim=-1)
        step = e * w.unsqueeze(-1)
        gf += step
        gs -= step
        return gw
    partner, _ = layer.tensors(gp.device, gp.dtype)
    gw = torch.linalg.vecdot(gp, dp, dim=-1)
    gp.addcmul_(w.unsqueeze(-1), gp.index_select(1, partner) - gp)
    return gw


def _values_layer_backward(layer, gx: Tensor, gw: Tensor | None, w: Tensor, delta: Tensor, beta: float,
                           sigmoid: str, art_lambda: float) -> Tensor:
    """One layer of the values walked back in :class:`_Net`'s backward: the gradient ``gx`` ``(B, n)`` before the
    layer from the one after it, the weight gradient ``gw`` (None: none) and the saved Δ and w."""
    if layer.block is not None:
        direction = _direction(layer, gx.device, gx.dtype)
        gf, gs = _pairs(gx, layer.block, 1)
        gdiff = gf - gs
        # w = 1 - f(-dir·Δ): dw/dΔ = dir·f'(-dir·Δ). (gdiff·Δ)·f' overflows float32 at Δ ~ 1e26 where
        # f' = 0 (inf · 0 = NaN); Δ·f' is bounded (≤ ~1 for every sigmoid), so it is formed first
        slope = swap_slope(direction * -delta, beta, sigmoid, art_lambda)
        g_slope = gdiff * (delta * slope) if gw is None else gw * slope + gdiff * (delta * slope)
        g_delta = g_slope * direction + gdiff * w
        gf -= g_delta
        gs += g_delta
        return gx
    partner, sign = layer.tensors(gx.device, gx.dtype)
    # per wire: x' = x + w·diff, diff = x[partner] - x, w = 1 - f(-sign·diff); Δ·f' first, as above
    slope = swap_slope(sign * -delta, beta, sigmoid, art_lambda)
    g_slope = gx * (delta * slope) if gw is None else gw * slope + gx * (delta * slope)
    g_diff = g_slope * sign + gx * w
    return gx - g_diff + g_diff.index_select(1, partner)


def _saved_per_set(net: Network) -> int:
    """The values per set that :class:`_Net`'s forward keeps for every layer, the differences Δ and the weights w
    (a strided layer's of its c comparators, 2c; another's of every wire, 2n): a lower bound of its memory, cached
    on the network (an odd-even network of n wires has n layers, so this is about n² at once)."""
    out = net._cache.get("saved_per_set")
    if out is None:
        out = net._cache["saved_per_set"] = sum(2 * layer.size if layer.block is not None else 2 * net.n
                                                for layer in net.layers)
    return out


def differentiable_vjp(net: Network, x: Tensor, beta: float | Tensor, sigmoid: str, art_lambda: float, mode: str,
                       y0: Tensor | None, g: Tensor) -> Tensor:
    """``gᵀ ∂out/∂x`` of the network as a differentiable function of ``x`` and ``g`` (the exact double backward of
    :class:`_Net` and of the fused kernels): the network recomputed in plain autograd ops
    (:func:`reference_forward`) under ``torch.func.vjp``, which composes with the outer autograd graph and with
    ``torch.func`` transforms (``jacrev`` maps the backward over a batch of ``g``, where ``torch.autograd.grad``
    cannot run).

    Args:
        net, x, beta, sigmoid, art_lambda, mode, y0: as :func:`run_network` (``x`` the saved input, in its graph).
        g: the gradient of the output (shape of the output).

    Returns:
        ``(B, n)`` gradient with respect to ``x``, itself differentiable.
    """
    return torch.func.vjp(lambda xr: reference_forward(net, xr, beta, sigmoid, art_lambda, mode, y0), x)[1](g)[0]


def run_network(net: Network, x: Tensor, beta: float | Tensor, sigmoid: str, art_lambda: float, mode: str = "values",
                y0: Tensor | None = None) -> Tensor:
    """Evaluate the relaxed network (see :class:`_Net`), in the dtype of ``x`` (float32 / float64).

    Args:
        net: the network on n wires.
        x: ``(B, n)`` scores, one per track.
        beta, sigmoid, art_lambda: the relaxed swap (:mod:`diffrank.operators.sigmoids`); a tensor β that
            requires grad runs :func:`reference_forward` (differentiable in β).
        mode: ``"values"`` → ``(B, n)`` track values; ``"full"`` → P ``(B, n, n)`` (rows = tracks);
            ``"rows"`` → ``y0 · P`` ``(B, m, n)`` for ``y0`` ``(1 or B, m, n)`` indexed by output track.

    Returns:
        The tensor described by ``mode``, differentiable w.r.t. ``x``.
    """
    if not net.layers:
        B, n = x.shape
        if mode == "values":
            return x.clone()
        if mode == "full":
            return torch.eye(n, dtype=x.dtype, device=x.device).repeat(B, 1, 1)
        return y0.expand(B, -1, -1).clone()
    if isinstance(beta, Tensor):  # a learnable β: plain autograd ops give ∂/∂β
        return reference_forward(net, x, beta, sigmoid, art_lambda, mode, y0)
    return _Net.apply(x, net, beta, sigmoid, art_lambda, mode, y0, False)[0]


# error_free: off, Kim et al.'s per-swap straight-through (True = "swaps"), or one over the network's output
ERROR_FREE = (False, True, "swaps", "output")


def _error_free(hard: Tensor, soft: Tensor) -> Tensor:
    """A swap layer's output whose value is ``hard`` exactly and whose gradient is that of ``soft`` (Kim et al.
    2024, §3: sg(hard − soft) + soft, written so that the forward adds an exact 0 to ``hard``)."""
    return hard.detach() + (soft - soft.detach())


def reference_forward(net: Network, x: Tensor, beta: float, sigmoid: str, art_lambda: float,
                      mode: str = "values", y0: Tensor | None = None, error_free: bool = False) -> Tensor:
    """The same computation as :func:`run_network` in plain autograd ops (gathers and lerps per wire).

    Slower and heavier (every op is a graph node); kept as the executable definition the fused
    implementation is tested against, including its gradients; run by ``ComparatorNetwork(...,
    twice_differentiable=True)``, for a learnable β, by the recorded backward of the fused paths
    (:func:`differentiable_vjp`), and for the error-free swaps.

    ``error_free=True``: the error-free differentiable swap of Kim, Yoon, Cho (ICLR 2024, §3): every layer outputs
    the exact conditional swap of its (exact) inputs, max on the ``hi`` wire and min on the ``lo`` wire, with the
    gradient of the relaxed swap at those inputs, sg(swap(z) − swap̃(z)) + swap̃(z), for the wire values and for the
    rows of P alike (the authors' ``use_ste`` code does the same per layer). The values are then the hard network's
    (the sorted scores, for a sorting network) and P the hard permutation, with no softening error; the gradient
    is the chain of the relaxed swaps' Jacobians along the exact trajectory (for one layer, the relaxed network's
    gradient). ``mode="rows"`` is then ``y0 · P`` of the full P (O(L·B·n²)).
    """
    if error_free and mode == "rows":
        return y0 @ reference_forward(net, x, beta, sigmoid, art_lambda, "full", None, True)
    B, n = x.shape
    p = torch.eye(n, dtype=x.dtype, device=x.device).expand(B, n, n) if mode == "full" else None
    ws = []
    for layer in net.layers:
        partner, sign = layer.tensors(x.device, x.dtype)
        x_partner = x.index_select(1, partner)
        diff = x_partner - x
        w = 1.0 - swap_weight(sign * -diff, beta, sigmoid, art_lambda)
        ws.append(w)
        if error_free:
            swap = (sign * -diff < 0).detach()  # hi holds the smaller value (lo the larger): exchange; ties stay
            if p is not None:
                p_partner = p.index_select(1, partner)
                p = _error_free(torch.where(swap.unsqueeze(-1), p_partner, p), p + w.unsqueeze(-1) * (p_partner - p))
            x = _error_free(torch.where(swap, x_partner, x), x + w * diff)
            continue
        if p is not None:
            p = p + w.unsqueeze(-1) * (p.index_select(1, partner) - p)
        x = x + w * diff
    if mode == "values":
        return x
    if mode == "full":
        return p
    y = y0.expand(B, -1, -1)
    for layer, w in zip(reversed(net.layers), reversed(ws)):
        partner, _ = layer.tensors(y.device, y.dtype)
        y = y + w.unsqueeze(1) * (y.index_select(2, partner) - y)
    return y


def network_kernel(net: Network, x: Tensor, beta: float, sigmoid: str, art_lambda: float, mode: str = "values",
                   y0: Tensor | None = None) -> Tensor:
    """The relaxed network with the fused kernels of :mod:`diffrank.kernels.networks`: same contract as
    :func:`run_network` (Petersen et al. 2021, Eq. 1; rows by the bidirectional evaluation of Petersen et al. 2022,
    Eq. 3).

    Args:
        net: a :class:`~diffrank.operators.networks.Network` on n wires with at least one layer.
        x: ``(B, n)`` float32 scores on CUDA (or the CPU under ``TRITON_INTERPRET=1``), n <=
            :data:`diffrank.kernels.networks.MAX_N`.
        beta, sigmoid, art_lambda: the relaxed swap (:mod:`diffrank.operators.sigmoids`), validated by the caller.
        mode: ``"values"`` → ``(B, n)`` track values; ``"rows"`` → ``y0 · P`` ``(B, m, n)`` for ``y0``
            ``(1 or B, m, n)`` indexed by output track (full P: ``y0`` = I). Differentiable w.r.t. ``x``.

    Returns:
        float32 tensor of the shape above.

    Raises:
        ValueError: an unsupported shape / dtype (see :func:`diffrank.kernels.networks.supports`), an empty
            network, or an unknown mode.
    """
    from diffrank.kernels import networks as kernels

    if x.dim() != 2 or x.shape[1] != net.n or not kernels.supports(net.n, x.dtype):
        raise ValueError(f"the network kernels need (B, {net.n}) float32 scores with n <= {kernels.MAX_N}, "
                         f"got {tuple(x.shape)} {x.dtype}")
    if not net.layers:
        raise ValueError("the network kernels need a network with at least one layer")
    if mode not in ("values", "rows") or (mode == "rows") != (y0 is not None):
        raise ValueError(f"mode must be 'values' or 'rows' (the latter with y0), got {mode!r}")
    if y0 is not None and (y0.dim() != 3 or y0.shape[0] not in (1, x.shape[0]) or y0.shape[2] != net.n):
        raise ValueError(f"y0 must be (1 or {x.shape[0]}, m, {net.n}), got {tuple(y0.shape)}")
    return _Net.apply(x, net, float(beta), sigmoid, float(art_lambda), mode, y0, True)[0]


NETWORKS = ("odd_even", "bitonic", "splitter_selection")


class ComparatorNetwork(RankingOperator):
    """A relaxed comparator network as a ranking operator; rows = ranks (rank 1 = largest), columns = items.

    The network is built per (n, k) from the input's shape at call time (cached), with its index tensors
    cached per device, so one operator instance serves any n and any device. The defaults are diffsort's library
    values, those of ``configs/operator/diffsort_bitonic.yaml`` (the class's canonical config).

    Args:
        beta: inverse temperature β > 0 (diffsort's ``steepness``, difftopk's ``inverse_temperature``;
            the reference-code scale, see :mod:`diffrank.operators.sigmoids`).
        sigmoid: ``"logistic"``, ``"logistic_phi"``, ``"gaussian"``, ``"reciprocal"``, ``"cauchy"``,
            ``"optimal"``.
        art_lambda: λ ∈ [0, 1] of the activation replacement trick (``logistic_phi`` only).
        network: ``"odd_even"`` (odd-even transposition, n layers), ``"bitonic"`` (Batcher's bitonic
            sorter, ⌈log2 n⌉(⌈log2 n⌉+1)/2 layers, every n) or ``"splitter_selection"`` (Petersen et al.
            2022, App. B: exact only for the top k, built for k = max(ks)).
        backend: ``"auto"`` (the fused Triton kernels on CUDA inputs, PyTorch elsewhere), ``"torch"`` (never
            the kernels) or ``"triton"`` (always, where the kernels apply: float32 work with n <= 4096; on the
            CPU only under ``TRITON_INTERPRET=1``). Same values and gradients up to float32 rounding.
        error_free: the error-free differentiable swaps of Kim, Yoon, Cho (ICLR 2024, §3): every comparator outputs
            the exact max / min of its inputs, with the relaxed swap's gradient there (straight-through per swap,
            :func:`reference_forward`). The soft-sorted values are then the sorted scores exactly, P the hard
            permutation matrix, top-k memberships 0 / 1 and soft ranks the ranks, while gradients flow through the
            relaxed swaps (β and the sigmoid still shape them). Runs the plain autograd ops (not the fused
            Function or kernels); top-k rows, membership and soft ranks are formed from the full P (O(L·B·n²)).
            A double backward runs, but differentiates the surrogate gradient with the exact trajectory held fixed
            (no finite-difference derivative of it, as for any straight-through estimator). ``"output"``: one
            straight-through over the whole network instead: the same exact forward, and exactly the relaxed
            network's gradient (its swaps at their relaxed, drifted inputs; any backend, the fused kernels too).
            The two agree for one layer; deeper, Kim et al.'s per-swap form evaluates each swap's slope at the exact
            values (§3). ``True`` is the same as ``"swaps"``. Default False.
        twice_differentiable: run the network in plain autograd ops (:func:`reference_forward`) instead of the
            fused Function / kernels; same values, O(L·B·n²) saved for full P and slower. Every path gives exact
            second derivatives (the fused backward is differentiable, :class:`_Net`), so this is only needed for
            forward-mode AD (``torch.func.jvp`` / ``jacfwd``); the name is kept for the thesis Table 7.3 configs.
            Default False.

    A learnable β (``beta`` a 0-d tensor that requires grad; ``learnable_beta`` is True) runs the plain autograd
    ops too: they give ∂/∂β.

    Capabilities: the sorting networks provide all four; the splitter network only ``"topk_membership"``:
    its rows depend on the k it was built for, so they are not the top rows of one relaxed permutation
    (P, soft sort or soft ranks would silently mean "the network built with k = n"). :meth:`topk_rows`
    gives the k top rows of any network built for k (for the splitter: difftopk's
    ``DiffTopkNet('splitter_selection', n, k)`` output).

    Attributes: ``doubly_stochastic`` True for the sorting networks (every layer matrix is doubly
    stochastic); ``permutation_equivariant`` False (a network compares fixed wires); ``hard_beta`` per
    sigmoid (:data:`HARD_BETA`).

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``; ``topk_rows(scores, k)`` → ``(B, k, n)``.

    Raises:
        ValueError: beta <= 0, an unknown sigmoid (the message lists the known ones), λ outside [0, 1], an
            unknown network, an unknown backend or ``"triton"`` without the triton package.
        RuntimeError: at call time, ``backend="triton"`` on a CPU tensor without ``TRITON_INTERPRET=1``.
    """

    permutation_equivariant = False
    learnable_beta = True
    canonical = "diffsort_bitonic"  # its values are the constructor defaults
    paper = {  # per config: four configs target this class
        "diffsort_bitonic": "Petersen, Borgelt, Kuehne, Deussen, ICML 2021 "
                            "(bitonic network, every n: docs/conventions.md)",
        "diffsort_odd_even": "Petersen, Borgelt, Kuehne, Deussen, ICML 2021, Eq. 1-2 (odd-even transposition network)",
        "difftopk_bitonic": "Petersen, Kuehne, Borgelt, Deussen, ICML 2022, §3, Eq. 3 (bidirectional top-k rows)",
        "difftopk_splitter": "Petersen, Kuehne, Borgelt, Deussen, ICML 2022, App. B (splitter selection network)",
    }
    parameter = {
        "diffsort_bitonic": "β (steepness; for `sigmoid=reciprocal` the thesis' β is β/4; thesis Table 3.8)",
        "diffsort_odd_even": "β (steepness; for `sigmoid=reciprocal` the thesis' β is β/4; thesis Table 3.8)",
        "difftopk_bitonic": "β (steepness, difftopk's `inverse_temperature`)",
        "difftopk_splitter": "β (steepness, difftopk's `inverse_temperature`)",
    }

    def __init__(self, beta: float | Tensor = 10.0, sigmoid: str = "cauchy", art_lambda: float = 0.25,
                 network: str = "bitonic", backend: str = "auto", twice_differentiable: bool = False,
                 error_free: bool | str = False) -> None:
        super().__init__(beta)
        self.backend = check_backend(backend)
        self.plain_autograd = bool(twice_differentiable)
        if error_free not in ERROR_FREE:
            raise ValueError(f"error_free must be one of False, True ('swaps') or 'output', got {error_free!r}")
        self.error_free = "swaps" if error_free is True else error_free
        if network not in NETWORKS:
            raise ValueError(f"network must be one of {NETWORKS}, got {network!r}")
        self.sigmoid = check_sigmoid(sigmoid)
        self.art_lambda = check_art_lambda(art_lambda)
        self.network = network
        self.hard_beta = HARD_BETA[self.sigmoid]
        sorts = network != "splitter_selection"
        self.doubly_stochastic = sorts
        if not sorts:
            self.capabilities = frozenset({TOPK_MEMBERSHIP})

    def topk_rows(self, scores: Tensor, k: int) -> Tensor:
        """The k top rows of the relaxed permutation of the network built for k (bidirectional, Eq. 3).

        For the sorting networks this is ``forward(scores, k)``; for the splitter network the rows that
        difftopk's sparse splitter returns.

        Args:
            scores: ``(B, n)`` floating tensor.
            k: 1 <= k <= n.

        Returns:
            ``(B, k, n)`` in the dtype of ``scores``; rows sum to 1, columns to <= 1.

        Raises:
            ValueError / TypeError: bad scores or k.
        """
        n = self._check_call(TOPK_MEMBERSHIP, "topk_rows", scores)
        k = check_k(k, n)
        return guarded_call(self, self._permutation, self._compute_input(scores), k).to(scores.dtype)

    def _kernel(self, x: Tensor) -> bool:
        """Whether this call runs the fused Triton kernels (backend, device, dtype and n permitting)."""
        if not use_triton(self.backend, x):
            return False
        from diffrank.kernels.networks import supports

        return supports(x.shape[1], x.dtype)

    def _run(self, net: Network, x: Tensor, mode: str, y0: Tensor | None = None) -> Tensor:
        if self.error_free == "output":  # the hard network's result, the relaxed network's gradient
            with torch.no_grad():
                hard = reference_forward(net, x, self.beta, self.sigmoid, self.art_lambda, mode, y0, True)
            return _error_free(hard, self._relaxed(net, x, mode, y0))
        if self.plain_autograd or self.error_free or isinstance(self.beta, Tensor):
            return reference_forward(net, x, self.beta, self.sigmoid, self.art_lambda, mode, y0, bool(self.error_free))
        return self._relaxed(net, x, mode, y0)

    def _relaxed(self, net: Network, x: Tensor, mode: str, y0: Tensor | None = None) -> Tensor:
        """The relaxed network on the fused path (kernels or :func:`run_network`), or plain autograd ops where
        those are asked for (``twice_differentiable``, a learnable β)."""
        if self.plain_autograd or isinstance(self.beta, Tensor):
            return reference_forward(net, x, self.beta, self.sigmoid, self.art_lambda, mode, y0)
        if net.layers and self._kernel(x):
            if mode == "full":  # P = I·M_T ⋯ M_1: the rows of the identity through the bidirectional pass
                mode, y0 = "rows", torch.eye(net.n, dtype=x.dtype, device=x.device).unsqueeze(0)
            return network_kernel(net, x, self.beta, self.sigmoid, self.art_lambda, mode, y0)
        return run_network(net, x, self.beta, self.sigmoid, self.art_lambda, mode, y0)

    def _rows(self, x: Tensor, k: int | None, w_out: Tensor) -> Tensor:
        """``w_out`` ``(m, n)`` rows over output ranks → ``(B, m, n)`` rows W·P over items (bidirectional),
        through the network built for k."""
        net = build(self.network, x.shape[1], k)
        w_out = w_out.to(device=x.device, dtype=x.dtype)
        perm = net.out_perm_tensor(x.device)
        y = w_out if perm is None else torch.zeros_like(w_out).index_copy(1, perm, w_out)
        return self._run(net, x, "rows", y.unsqueeze(0))

    def _permutation(self, x: Tensor, k: int | None) -> Tensor:
        """All n rows of P from the forward pass on (B, n, n), or the top k by bidirectional evaluation."""
        n = x.shape[1]
        if k is not None:
            return self._rows(x, k, torch.eye(k, n, device=x.device))
        net = build(self.network, n)
        p = self._run(net, x, "full")
        perm = net.out_perm_tensor(x.device)
        return p if perm is None else p.index_select(1, perm)

    def _topk_membership(self, x: Tensor, ks: list[int]) -> Tensor:
        """Σ_{r<k} P[r, j] for each k in one bidirectional pass from the indicator rows (Petersen et al.
        2022, Eq. 2 and 3), through the network built for max(ks)."""
        # built on the device (the k's from a cached index): no host-to-device copy per call; the index is a cached
        # constant, built outside torch.func transforms (base.constant)
        rows = self._rows_index(ks, x.device)
        w_out = torch.arange(x.shape[1], device=x.device).unsqueeze(0) <= rows.unsqueeze(1)
        return self._rows(x, max(ks), w_out)

    def _dense_rows(self, capability: str, n: int, k: int | Sequence[int] | None) -> int | None:
        """The rows m of the ``(B, m, n)`` buffers a call holds at once (for :meth:`_check_memory`): the top-k forms
        ``max(ks)`` rows of P (bidirectional evaluation, :meth:`_topk_membership`), a permutation its n or k rows;
        and every call keeps each layer's differences and weights for the backward pass (:class:`_Net`), O(L·n)
        values per set, as many rows as that holds: about n / 3 for the odd-even network (L = n layers), a few for
        the bitonic one (L = O(log² n)). The larger of the two, or None when both are zero."""
        return max(self._rows_and_depth(capability, n, k)) or None

    def _rows_and_depth(self, capability: str, n: int, k: int | Sequence[int] | None) -> tuple[int, int]:
        """(rows of P the call forms, rows' worth of the layers' saved values) of :meth:`_dense_rows`."""
        if capability == TOPK_MEMBERSHIP:
            rows, net_k = max(k), max(k)
        else:
            rows, net_k = super()._dense_rows(capability, n, k) or 0, k if capability == PERMUTATION else None
        return rows, _saved_per_set(build(self.network, n, net_k)) // (DENSE_BUFFERS * n)

    def _check_memory(self, capability: str, method: str, scores: Tensor, k: int | Sequence[int] | None) -> None:
        """:meth:`~diffrank.operators.base.RankingOperator._check_memory`, with the network's depth in the message
        when its layers are what does not fit (the odd-even network has n layers).

        Raises:
            DenseMemoryError: the buffers do not fit (:mod:`diffrank.operators.memory`).
        """
        try:
            super()._check_memory(capability, method, scores, k)
        except DenseMemoryError as e:
            n = scores.shape[1]
            rows, depth = self._rows_and_depth(capability, n, k)
            if depth <= rows:
                raise
            layers = build(self.network, n, max(k) if capability == TOPK_MEMBERSHIP else None).num_layers
            hint = (f". The rows are the network's depth: {type(self).__name__}(network={self.network!r}) keeps two "
                    f"(B, <= n) tensors per layer for the backward pass, and that network has {layers} layers at "
                    f"n = {n}" + (f" (network='bitonic' has {build('bitonic', n).num_layers})"
                                  if self.network == "odd_even" else ""))
            raise DenseMemoryError(str(e) + hint) from None

    def _soft_sort(self, x: Tensor) -> Tensor:
        """The network's output wires (= P @ s), without forming P: O(L·B·n)."""
        net = build(self.network, x.shape[1])
        out = self._run(net, x, "values")
        perm = net.out_perm_tensor(x.device)
        return out if perm is None else out.index_select(1, perm)

    def _soft_rank(self, x: Tensor) -> Tensor:
        """Σ_r r·P[r, j] (1 = largest) from one bidirectional pass with the row (1, …, n)."""
        return self._rows(x, None, torch.arange(1, x.shape[1] + 1, device=x.device).unsqueeze(0)).squeeze(1)

    def extra_repr(self) -> str:
        return (f"beta={beta_repr(self.beta)}, sigmoid={self.sigmoid!r}, art_lambda={self.art_lambda}, "
                f"network={self.network!r}, backend={self.backend!r}"
                + (", twice_differentiable=True" if self.plain_autograd else "")
                + (f", error_free={self.error_free!r}" if self.error_free else ""))
