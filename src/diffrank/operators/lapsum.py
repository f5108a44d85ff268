"""LapSum (Struski, Bednarczyk, Podolak, Tabor, ICML 2025): soft top-k, rank, sort and permutation.

Every operator is built from one scalar function, the sum of Laplace CDFs centred on the scores
(paper §3.1):

    Lap_s(x) = Σ_j F_α(x - s_j),  F_α(x) = F(x / α),  F(x) = ½eˣ (x <= 0), 1 - ½e⁻ˣ (x > 0).

diffrank uses the paper's "largest first" direction only, α < 0, and the inverse temperature β of the
contract: **α = -1/β, τ = |α| = 1/β** (the paper's best α = -1.5 for CIFAR-100 is β = 2/3; its default
α = -1 is β = 1). Internally everything lives in the scaled coordinate u = x/α = -βx, where Lap is
increasing and the knots u_i = -β s_(i) are ascending (scores sorted descending).

- Soft top-k (§3.3, Thm 3.3): p_i = F_α(b - s_i) with b = Lap_s⁻¹(k); Σ_i p_i = k exactly for any
  real k ∈ (0, n]: ``topk_membership`` takes real k (floats, or tensors that may require grad); the
  functional form is ``diffrank.functional.topk_membership(x, k, method="lapsum", beta=β)``, and the k
  *smallest* (α > 0) are its value on -x (p(s, k, +α) = p(-s, k, -α)).
- Soft rank (§3.2, Thm 3.2): R_i = Lap_s(s_i) + ½ = 1 + Σ_{j≠i} F(β(s_j - s_i)); rank 1 = largest.
- Soft sort (§3.2): sort_i = Lap_s⁻¹(i - ½), descending.
- Soft permutation (§3.4, Def. 3.5): P[j, i] = F_α(b_j - s_i) - F_α(b_{j-1} - s_i), b_j = Lap_s⁻¹(j);
  doubly stochastic (Thm 3.6), rows = ranks, columns = items.

Lap_s⁻¹ is evaluated in closed form (§4.1, eq. (4); the official tutorial notebook's vectorised form):
one sort, knot values from ``logcumsumexp`` (every exponent <= 0, so nothing overflows), a
``searchsorted`` per target, then the root of a quadratic in e^u. Forward O(n log n).

Backward passes are closed-form VJPs in custom ``torch.autograd.Function``s (App. C.2),
never autodiff through the forward: top-k O(M n), rank O(n log n) (prefix sums of e^{±u}·v in log space
instead of the official O(n²) loop), inverse / sort O(n log n) (sweep over merged sorted thresholds and
knots). Half-precision inputs are computed in float32 and cast back (by :class:`RankingOperator`).

Second derivatives are exact: a backward that is itself recorded (``create_graph=True``, ``torch.autograd.functional
.hessian``, ``torch.func``) evaluates the same closed forms in differentiable PyTorch operations (``_*_vjp_graph``;
O(M n) or O(n²) memory per row), with the thresholds entering through :class:`_LapSumInverse`, whose own backward is
such a form again (implicit differentiation of Σ_j F(β(s_j - b)) = w). A tensor β that requires grad is learnable:
every quantity depends on β·s only (the soft sort and :meth:`LapSum.inverse` are that divided by β), so the scores
are multiplied by β before the β = 1 computation and ∂L/∂β = ⟨s, ∂L/∂(βs)⟩ (the closed form of the official ∂α).
Every custom Function has ``setup_context`` and a vmap rule (the vmapped dimension folds into the rows) but the eager
CPU top-k (:class:`_LapSumTopKNumba`, which transforms and ``torch.compile`` never reach); under ``torch.compile`` the
numba code gives way to the PyTorch forms, so dynamo never traces into numba.

The CPU top-k (float32 and float64) runs in numba (:mod:`diffrank.operators.lapsum_cpu`): one call forward, one
backward; for k <= n/8 it selects the 2k + 2 largest scores instead of sorting the row.

Triton (``backend``): :mod:`diffrank.kernels.lapsum` computes the knot sums as fused forward / reverse scans
of linear recurrences, the inverse by a binary search and the same closed form, the top-k membership and
its VJP, the soft-rank VJP and the inverse's VJP (soft sort / permutation backward) as scans again.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from diffrank._shared import unsort
from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import TOPK_MEMBERSHIP, Check, RankingOperator, beta_repr, raise_failed

_NUMBA_DTYPES = (torch.float32, torch.float64)
_DENSE_MAX_TARGETS = 32  # below this many thresholds per row, the (B, M, n) dense VJP is cheaper than the sweep


def _laplace_cdf(x: Tensor) -> Tensor:
    """F(x) for the standard Laplace law, from e^{-|x|} only (no overflow)."""
    e = torch.exp(-x.abs())
    return torch.where(x <= 0, 0.5 * e, 1.0 - 0.5 * e)


_LOG2 = math.log(2.0)


def log_laplace_cdf(x: Tensor) -> Tensor:
    """log F(x) for the standard Laplace law without underflow: x - log 2 (x <= 0), log1p(-½e^{-x}) (x > 0).

    Args:
        x: any shape, floating; ±inf allowed (log F(-inf) = -inf, log F(inf) = 0).

    Returns:
        log F(x), same shape and dtype; its gradient is finite everywhere (each branch sees a clamped input).
    """
    return torch.where(x <= 0, x - _LOG2, torch.log1p(-0.5 * torch.exp(-x.clamp_min(0))))


def log_interval_mass(lo: Tensor, hi: Tensor) -> Tensor:
    """log(F(hi) - F(lo)) for lo < hi (F the standard Laplace CDF) without cancellation or underflow, as the
    official ``logCDF`` of LapSum's permutation loss (Struski et al. 2025, §3.4): both ends on one side of 0 use
    ``expm1`` of their difference. lo = -inf or hi = +inf give log F(hi) and log(1 - F(lo)).

    Args:
        lo, hi: broadcastable, lo < hi elementwise (ends may be infinite: constants without gradient).

    Returns:
        The log mass, finite where the mass is positive; gradients finite (every branch sees clamped inputs).
    """
    tail = torch.log(-torch.expm1(lo - hi))  # log(1 - e^{lo - hi}) <= 0
    mid = torch.log(-torch.expm1(-hi.clamp_min(0)) - torch.expm1(lo.clamp_max(0))) - _LOG2
    return torch.where(hi <= 0, hi - _LOG2 + tail, torch.where(lo >= 0, -lo - _LOG2 + tail, mid))


def _exclusive_cumlse(u: Tensor) -> Tensor:
    """L[c] = log Σ_{j<c} e^{u_j} for c = 0..n (L[0] = -inf); shape (B, n + 1)."""
    pad = torch.full_like(u[..., :1], -math.inf)
    return torch.logcumsumexp(torch.cat([pad, u], dim=-1), dim=-1)


def _exclusive_revlse(u: Tensor) -> Tensor:
    """R[c] = log Σ_{j>=c} e^{-u_j} for c = 0..n (R[n] = -inf); shape (B, n + 1)."""
    pad = torch.full_like(u[..., :1], -math.inf)
    return torch.cat([torch.logcumsumexp((-u).flip(-1), dim=-1).flip(-1), pad], dim=-1)


def _thresholds(u: Tensor, w: Tensor) -> Tensor:
    """Closed-form Lap⁻¹ in u-space (paper §4.1, eq. (4)).

    Args:
        u: ``(B, n)`` knots u_i = -β s_(i), ascending.
        w: ``(B, M)`` targets in (0, n); w >= n gives +inf.

    Returns:
        ``(B, M)`` t with Σ_j F(t - u_j) = w.
    """
    n = u.shape[-1]
    lse_le = torch.logcumsumexp(u, dim=-1)  # log Σ_{j<=i} e^{u_j}
    lse_ge = torch.logcumsumexp((-u).flip(-1), dim=-1).flip(-1)  # log Σ_{j>=i} e^{-u_j}
    log_b = lse_le - u  # log B_i, B_i = 1 + Σ_{j<i} e^{u_j - u_i}
    log_a = u + lse_ge  # log A_i, A_i = 1 + Σ_{j>i} e^{u_i - u_j}
    idx = torch.arange(n, dtype=u.dtype, device=u.device)
    knots = idx + 0.5 + 0.5 * (torch.exp(log_a) - torch.exp(log_b))  # Lap(u_i), 0-based i
    c = torch.searchsorted(knots.contiguous(), w.contiguous())  # #knots below w
    e = w - c.to(w.dtype)
    lo = (c - 1).clamp(0, n - 1)
    hi = c.clamp(0, n - 1)
    u_lo, u_hi = u.gather(-1, lo), u.gather(-1, hi)
    lb_lo, la_hi = log_b.gather(-1, lo), log_a.gather(-1, hi)
    # log z, z = |e| + sqrt(e² + q), q = A_{i+1} B_i e^{u_i - u_{i+1}}, in log space: q underflows for knots
    # more than ~100 (float32) / ~745 (float64) apart. z = √q (r + sqrt(r² + 1)), r = |e|/√q
    half_log_q = 0.5 * (la_hi + lb_lo + (u_lo - u_hi))
    log_abs_e = torch.log(e.abs())
    log_r = log_abs_e - half_log_q
    log_z = torch.where(log_r > 20, math.log(2.0) + log_abs_e, half_log_q + torch.asinh(torch.exp(log_r.clamp_max(20))))
    # the two roots of the quadratic are algebraically equal; each branch avoids a cancellation
    t_mid = torch.where(e > 0, u_hi + log_z - la_hi, u_lo - log_z + lb_lo)
    t_left = u[..., :1] + torch.log(2 * w) - log_a[..., :1]
    t_right = u[..., -1:] - torch.log((2 * (n - w)).clamp_min(0)) + log_b[..., -1:]
    return torch.where(c == 0, t_left, torch.where(c == n, t_right, t_mid))


def _inverse_vjp(t: Tensor, u: Tensor, v: Tensor) -> Tensor:
    """Σ_i v_i ∂t_i/∂u_l with ∂t_i/∂u_l = softmax_l(-|t_i - u_l|) (paper App. C.2).

    Args:
        t: ``(B, M)`` finite thresholds; u: ``(B, n)`` ascending knots; v: ``(B, M)`` upstream.

    Returns:
        ``(B, n)`` gradient with respect to u, in the sorted order of u.
    """
    if t.shape[-1] <= _DENSE_MAX_TARGETS:
        pi = torch.softmax(-(t.unsqueeze(-1) - u.unsqueeze(-2)).abs(), dim=-1)
        return (v.unsqueeze(-1) * pi).sum(-2)
    # O((n + M) log) sweep: split |t - u| by the side of u_l each t_i lies on, prefix LSE in log space,
    # and the sign of v carried by two log-magnitude streams
    t, order = t.sort(dim=-1)
    v = v.gather(-1, order)
    lcum, rrev = _exclusive_cumlse(u), _exclusive_revlse(u)
    cnt_t = torch.searchsorted(u.contiguous(), t.contiguous(), right=True)  # #u_l <= t_i
    log_norm = torch.logaddexp(lcum.gather(-1, cnt_t) - t, rrev.gather(-1, cnt_t) + t)  # N_i
    cnt_u = torch.searchsorted(t.contiguous(), u.contiguous(), right=True)  # #t_i <= u_l
    out = torch.zeros_like(u)
    for sign, mag in ((1.0, v.clamp_min(0)), (-1.0, (-v).clamp_min(0))):
        lm = torch.log(mag)
        left = _exclusive_cumlse(t - log_norm + lm)  # Σ_{i<c} v_i e^{t_i - N_i}
        right = _exclusive_revlse(t + log_norm - lm)  # Σ_{i>=c} v_i e^{-t_i - N_i}
        out = out + sign * (torch.exp(left.gather(-1, cnt_u) - u) + torch.exp(right.gather(-1, cnt_u) + u))
    return out


def _sorted_knots(scores: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """Knots u = -β s sorted ascending (scores descending) and the sort permutation."""
    s_sorted, order = scores.sort(dim=-1, descending=True)
    return -beta * s_sorted, order


def _numba_ok(x: Tensor) -> bool:
    """Whether the numba kernels may run on ``x``: a CPU tensor outside ``torch.compile``'s tracing (dynamo cannot
    trace into numba; the PyTorch path then computes the same values) and not a functorch-wrapped tensor (no data;
    a transform's own call of the custom Functions unwraps it)."""
    return x.is_cpu and not torch.compiler.is_compiling() and not torch._C._functorch.is_functorch_wrapped_tensor(x)


def _presigned(cls: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """Class decorator of the custom Functions: with ``setup_context``, ``Function.apply`` binds its arguments through
    ``inspect.signature(cls.forward)`` on every call (~25 µs, as much as the whole top-k at n = 10³); inspect returns
    a ``__signature__`` attribute as it is, so it is computed once here."""
    cls.forward.__signature__ = inspect.signature(cls.forward)
    return cls


def _vmap_rows(fn: type[torch.autograd.Function], info, in_dims: tuple, *args):
    """The vmap rule of LapSum's custom Functions: every tensor argument holds one row per set (``(B, ...)``) and
    rows are independent, so the vmapped dimension folds into the rows, ``(V, B, ...) → (V·B, ...)``, for one call
    of ``fn``, and unfolds from every output. Non-tensor arguments (β, a list of ks, flags) pass through."""
    V = info.batch_size
    flat = []
    for a, d in zip(args, in_dims):
        if isinstance(a, Tensor):
            a = a.movedim(d, 0) if d is not None else a.expand(V, *a.shape)
            a = a.reshape(V * a.shape[1], *a.shape[2:])
        flat.append(a)
    out = fn.apply(*flat)
    if isinstance(out, tuple):
        return tuple(o.reshape(V, -1, *o.shape[1:]) for o in out), (0,) * len(out)
    return out.reshape(V, -1, *out.shape[1:]), 0


# -- differentiable VJPs: the closed forms of App. C.2 in PyTorch operations, for a backward that is itself
# differentiated (create_graph=True, torch.func): the thresholds enter through _LapSumInverse, whose own backward is
# one of these again, so every order of derivative is exact (no Gauss-Newton truncation)


def _inverse_vjp_graph(s: Tensor, b: Tensor, beta: float, v: Tensor, w_grad: bool) -> tuple[Tensor, Tensor | None]:
    """VJP of b = Lap_s⁻¹(w) in score units (Σ_j F(β(s_j - b_m)) = w_m), by implicit differentiation:
    ∂b_m/∂s_l = π_ml = softmax_l(-β|s_l - b_m|) and ∂b_m/∂w_m = -1/(β S_m), S_m = ½ Σ_l e^{-β|s_l - b_m|}.

    Args:
        s: ``(B, n)``; b: ``(B, M)`` finite (carrying its graph when it is the Function's saved output);
        beta: β; v: ``(B, M)`` upstream; w_grad: whether to return the gradient for w.

    Returns:
        ``(grad_s (B, n), grad_w (B, M) or None)``; O(B M n) memory.
    """
    z = -(beta * (s.unsqueeze(-2) - b.unsqueeze(-1))).abs()
    grad_s = (v.unsqueeze(-1) * torch.softmax(z, dim=-1)).sum(-2)
    grad_w = -2.0 / beta * v * torch.exp(-torch.logsumexp(z, dim=-1)) if w_grad else None
    return grad_s, grad_w


def _topk_vjp_graph(s: Tensor, k: Tensor, beta: float, v: Tensor) -> tuple[Tensor, Tensor]:
    """VJP of p = F(β(s - Lap⁻¹(k))) (Thm 3.3) in differentiable operations: with π = softmax(-|x|) and
    βS = ½β Σ e^{-|x|}, ∂L/∂s_l = Σ_m βS π_l (v_l - ⟨v, π⟩), ∂L/∂k = ⟨v, π⟩ (rows with k >= n: p ≡ 1, zero).

    Args:
        s: ``(B, n)``; k: ``(B, M)`` of the dtype of s; beta: β; v: ``(B, M, n)``.

    Returns:
        ``(grad_s (B, n), grad_k (B, M))``.
    """
    n = s.shape[-1]
    live = k < n
    b = _LapSumInverse.apply(s, torch.where(live, k, n / 2), beta, False)[0]
    z = -(beta * (s.unsqueeze(-2) - b.unsqueeze(-1))).abs()
    pi = torch.softmax(z, dim=-1)
    vpi = (v * pi).sum(-1, keepdim=True)
    beta_s = 0.5 * beta * torch.exp(torch.logsumexp(z, dim=-1, keepdim=True))
    grad_s = torch.where(live.unsqueeze(-1), beta_s * pi * (v - vpi), 0.0).sum(-2)
    return grad_s, torch.where(live, vpi.squeeze(-1), 0.0)


def _rank_vjp_graph(s: Tensor, beta: float, v: Tensor) -> Tensor:
    """VJP of R_i = 1 + Σ_{j≠i} F(β(s_j - s_i)) (Thm 3.2) in differentiable operations:
    g_l = ½β Σ_i e^{-β|s_i - s_l|} (v_i - v_l); O(B n²) memory."""
    e = torch.exp(-beta * (s.unsqueeze(-1) - s.unsqueeze(-2)).abs())
    return 0.5 * beta * (e * (v.unsqueeze(-2) - v.unsqueeze(-1))).sum(-1)


@_presigned
class _LapSumInverse(torch.autograd.Function):
    """b[b, m] = Lap_s⁻¹(w_bm) in score units (α = -1/β): Σ_j F(β(s_j - b)) = w; ∂b_m/∂s_l = softmax_l(-β|b_m - s_l|),
    ∂b_m/∂w_m = -1/(β S_m) (App. C.2). Returns ``(b, *aux)`` (only b differentiable): aux is empty on the PyTorch
    path and, with ``kernel`` (:func:`diffrank.kernels.lapsum.inverse_forward`), what the kernel's VJP reads.
    First-order backward: the O((n + M) log) sweep, or the kernel's per-gap sums and two scans; a recorded backward
    (create_graph, torch.func; for the kernel also a w that requires grad) takes :func:`_inverse_vjp_graph`,
    differentiable to every order."""

    @staticmethod
    def forward(scores: Tensor, w: Tensor, beta: float, kernel: bool = False) -> tuple[Tensor, ...]:
        if kernel:
            from diffrank.kernels.lapsum import inverse_forward

            return inverse_forward(scores, w, beta)
        if _numba_ok(scores):
            t = _lapsum_cpu().thresholds(scores, beta, w)
        else:
            t = _thresholds(_sorted_knots(scores, beta)[0], w)
        return (-t / beta,)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        scores, _, ctx.beta, _ = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(scores, *output)

    @staticmethod
    def vmap(info, in_dims, scores, w, beta, kernel):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return _vmap_rows(_LapSumInverse, info, in_dims, scores, w, beta, kernel)

    @staticmethod
    def backward(ctx, grad_b: Tensor, *_aux):
        scores, b, *aux = ctx.saved_tensors
        beta = ctx.beta
        dense = not aux and b.shape[-1] <= _DENSE_MAX_TARGETS
        if torch.is_grad_enabled() or ctx.needs_input_grad[1] or dense:
            grad_s, grad_w = _inverse_vjp_graph(scores, b, beta, grad_b, ctx.needs_input_grad[1])
            return grad_s, grad_w, None, None
        if aux:  # the kernel's forward
            from diffrank.kernels.lapsum import inverse_backward

            return inverse_backward(*aux, beta, grad_b), None, None, None
        u, order = _sorted_knots(scores, beta)
        return unsort(_inverse_vjp(-beta * b, u, grad_b), order), None, None, None


@_presigned
class _LapSumTopK(torch.autograd.Function):
    """p[b, m, i] = F(t_bm + β s_bi), t = Lap⁻¹(k_bm) (paper eq. (5)), the PyTorch closed form (any device, torch.func
    transforms, torch.compile), or with ``kernel`` the Triton launch :func:`diffrank.kernels.lapsum.topk_forward`;
    returns ``(p, t)`` (t not differentiable); ``k`` ``(B, M)`` of the scores' dtype. First-order VJP in O(M n) (the
    kernel's: one launch); a recorded backward (create_graph, torch.func) takes :func:`_topk_vjp_graph`, so second
    derivatives are exact."""

    @staticmethod
    def forward(scores: Tensor, k: Tensor, beta: float, kernel: bool = False) -> tuple[Tensor, Tensor]:
        if kernel:
            from diffrank.kernels.lapsum import topk_forward

            return topk_forward(scores, k, beta)
        n = scores.shape[-1]
        full = k >= n
        w = torch.where(full, torch.full_like(k, n / 2), k)
        if _numba_ok(scores):  # the numba inverse alone (values-only sort, O(n) knot recurrences): the same t to 1e-13
            t = _lapsum_cpu().thresholds(scores, beta, w)
        else:
            t = _thresholds(_sorted_knots(scores, beta)[0], w)
        x = t.unsqueeze(-1) + beta * scores.unsqueeze(-2)
        return torch.where(full.unsqueeze(-1), torch.ones_like(x), _laplace_cdf(x)), t

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        scores, k, ctx.beta, ctx.kernel = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # no zeros for t: only p has a gradient
        ctx.save_for_backward(scores, output[1], k)

    @staticmethod
    def vmap(info, in_dims, scores, k, beta, kernel):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return _vmap_rows(_LapSumTopK, info, in_dims, scores, k, beta, kernel)

    @staticmethod
    def backward(ctx, grad_p: Tensor, _grad_t: None):
        scores, t, k = ctx.saved_tensors
        beta = ctx.beta
        if torch.is_grad_enabled():
            grad_s, grad_k = _topk_vjp_graph(scores, k.to(scores.dtype), beta, grad_p)
            grad_k = grad_k.to(k.dtype)
        elif ctx.kernel:
            from diffrank.kernels.lapsum import topk_backward

            grad_s, grad_k = topk_backward(scores, k, t, beta, grad_p)
            grad_k = grad_k.to(k.dtype)
        else:
            x = t.unsqueeze(-1) + beta * scores.unsqueeze(-2)
            ex = torch.exp(-x.abs()) * (k < scores.shape[-1]).unsqueeze(-1)
            total = ex.sum(-1, keepdim=True)
            pi = ex / total.clamp_min(torch.finfo(ex.dtype).tiny)  # π = softmax(-|x|), ∂p/∂k
            vpi = (grad_p * pi).sum(-1, keepdim=True)  # ⟨v, π⟩
            # ∂p_i/∂s_l = β R (δ_il π_i - π_i π_l), R = ½ Σ e^{-|x|}: symmetric, zero row sums
            grad_s = (0.5 * beta * total * pi * (grad_p - vpi)).sum(-2)
            grad_k = vpi.squeeze(-1)
        return grad_s, grad_k if ctx.needs_input_grad[1] else None, None, None


class _LapSumTopKNumba(torch.autograd.Function):
    """:class:`_LapSumTopK` for eager CPU scores in numba (:mod:`diffrank.operators.lapsum_cpu`): forward and
    first-order VJP in one call each, float32 / float64 computed in float64; ``k`` a list of ks (one row for every
    set) or a ``(B, M)`` tensor. A recorded backward (create_graph) takes :func:`_topk_vjp_graph`, as there.

    The one Function here without ``setup_context``: with it, every ``apply`` binds its arguments through ``inspect``
    (~10 µs, a third of the whole top-k at n = 10³). It is reached only where :func:`_numba_ok` holds, i.e. never under
    torch.func transforms (their tensors are wrapped) nor ``torch.compile``, which take :class:`_LapSumTopK`."""

    @staticmethod
    def forward(ctx, scores: Tensor, k: Tensor | list[float], beta: float) -> Tensor:
        p, ctx.state = _lapsum_cpu().topk_forward(scores, k, beta)
        ctx.beta, ctx.k_list = beta, None if isinstance(k, Tensor) else k
        # the backward reads the scores and p through numpy views: saved for autograd's check that neither was
        # modified in place in between (p is the output: saving it costs no memory)
        ctx.save_for_backward(scores, p, k if isinstance(k, Tensor) else None)
        return p

    @staticmethod
    def backward(ctx, grad_p: Tensor):
        scores, p, k = ctx.saved_tensors
        if torch.is_grad_enabled():
            if k is None:
                k = torch.tensor(ctx.k_list, dtype=scores.dtype).expand(scores.shape[0], -1)
            grad_s, grad_k = _topk_vjp_graph(scores, k, ctx.beta, grad_p)
        else:
            grad_s, grad_k = _lapsum_cpu().topk_backward(ctx.state, grad_p, ctx.beta)
        return grad_s, grad_k if ctx.needs_input_grad[1] else None, None


def _lapsum_cpu():
    """:mod:`diffrank.operators.lapsum_cpu`, imported on first use (its kernels load the ahead-of-time module or
    numba)."""
    global _CPU
    if _CPU is None:
        from diffrank.operators import lapsum_cpu

        _CPU = lapsum_cpu
    return _CPU


_CPU = None


@_presigned
class _LapSumRank(torch.autograd.Function):
    """R_i = 1 + Σ_{j≠i} F(β(s_j - s_i)) in O(n log n); returns ``(R, u, order, A + B)`` (only R differentiable), or
    with ``kernel`` :func:`diffrank.kernels.lapsum.rank_forward`'s ``(R, s_sorted, order, A + B - 2)``; first-order
    VJP in O(n log n) (the kernel's: the same scans), a recorded backward :func:`_rank_vjp_graph` (paper Thm 3.2,
    App. C.2)."""

    @staticmethod
    def forward(scores: Tensor, beta: float, kernel: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if kernel:
            from diffrank.kernels.lapsum import rank_forward

            return rank_forward(scores, beta)
        n = scores.shape[-1]
        u, order = _sorted_knots(scores, beta)
        a = torch.exp(u + _exclusive_revlse(u)[..., 1:])  # Σ_{j>i} e^{u_i - u_j}
        b = torch.exp(_exclusive_cumlse(u)[..., :-1] - u)  # Σ_{j<i} e^{u_j - u_i}
        pos = torch.arange(1, n + 1, dtype=u.dtype, device=u.device)
        return unsort(pos + 0.5 * (a - b), order), u, order, a + b

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        scores, ctx.beta, ctx.kernel = inputs
        _, u, order, ab = output
        ctx.mark_non_differentiable(u, order, ab)
        ctx.save_for_backward(scores, u, order, ab)

    @staticmethod
    def vmap(info, in_dims, scores, beta, kernel):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return _vmap_rows(_LapSumRank, info, in_dims, scores, beta, kernel)

    @staticmethod
    def backward(ctx, grad_r: Tensor, *_aux):
        scores, u, order, ab = ctx.saved_tensors  # with the kernel, u holds the descending scores
        if torch.is_grad_enabled():
            return _rank_vjp_graph(scores, ctx.beta, grad_r), None, None
        if ctx.kernel:
            from diffrank.kernels.lapsum import rank_backward

            return rank_backward(u, order, ab, ctx.beta, grad_r), None, None
        v = grad_r.gather(-1, order)
        # g_l = (β/2) [Σ_{j<l} e^{u_j-u_l} v_j + Σ_{j>l} e^{u_l-u_j} v_j - v_l (a_l + b_l)]
        acc = -v * ab
        for sign, mag in ((1.0, v.clamp_min(0)), (-1.0, (-v).clamp_min(0))):
            lm = torch.log(mag)
            below = torch.exp(_exclusive_cumlse(u + lm)[..., :-1] - u)
            above = torch.exp(_exclusive_revlse(u - lm)[..., 1:] + u)
            acc = acc + sign * (below + above)
        return unsort(0.5 * ctx.beta * acc, order), None, None


def _topk(scores: Tensor, k: Tensor, beta: float, backend: str) -> Tensor:
    """LapSum soft top-k membership with real-valued k (Struski et al. 2025, Thm 3.3, eq. (3)), as used by
    :meth:`LapSum.topk_membership` (public form: ``diffrank.functional.topk_membership(x, k, method="lapsum")``).

    p_bmi = F_α(Lap_s⁻¹(k_bm) - s_bi), α = -1/β; Σ_i p_bmi = k_bm exactly. A k that requires grad receives
    ∂L/∂k = ⟨v, π⟩ (π = softmax(-|x|), App. C.2).

    Args:
        scores: ``(B, n)`` validated scores (finite, float32 / float64).
        k: ``(B, M)`` validated ks in (0, n], dtype of ``scores``.
        beta: inverse temperature β = 1/|α| > 0.
        backend: ``"auto"`` | ``"torch"`` | ``"triton"``: the Triton kernel of :mod:`diffrank.kernels.lapsum`
            or the PyTorch path (:class:`_LapSumTopK`; eager CPU scores take :class:`_LapSumTopKNumba` in
            :meth:`LapSum._topk_membership` instead).

    Returns:
        ``(B, M, n)``, dtype of ``scores``.
    """
    return _LapSumTopK.apply(scores, k, beta, use_triton(backend, scores))[0]


class LapSum(RankingOperator):
    """LapSum soft top-k / rank / sort / permutation (Struski et al., ICML 2025), α = -1/β.

    Args:
        beta: inverse temperature β = 1/|α| > 0 (paper grid α ∈ {-1.5, -1, -0.5, -0.2, -0.1}): a number, or a 0-d
            tensor that may require grad (a learnable temperature, as the paper trains α in its soft-permutation
            experiment, §5.2 and App. D): ``beta.grad`` then fills.
        backend: ``"auto"`` (the Triton kernels of :mod:`diffrank.kernels.lapsum` on CUDA inputs, PyTorch
            elsewhere; the top-k of CPU scores in numba) | ``"torch"`` | ``"triton"`` (CPU only under
            ``TRITON_INTERPRET=1``). Every method runs in kernels, forward and backward.

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)`` doubly stochastic (rows = ranks,
    rank 1 = largest); ``topk_membership(scores, ks)`` → ``(B, M, n)`` with row sums exactly k, for real
    ks (see :meth:`_check_ks`); ``soft_rank`` / ``soft_sort`` → ``(B, n)``.

    Derivatives: first-order backward passes are the closed forms of App. C.2 (O(n log n) or O(M n) per row); a
    backward that is itself differentiated (``create_graph=True``, ``torch.autograd.functional.hessian``,
    ``torch.func``) runs the same closed forms in differentiable operations, so Hessians are exact (O(M n) or O(n²)
    memory per row). ∂/∂β: every LapSum quantity depends on the scores through β·s only (the soft sort is
    Lap⁻¹ / β), so a tensor β multiplies the scores before the β = 1 operator and ∂L/∂β = ⟨s, ∂L/∂(βs)⟩
    (minus ⟨v, sort⟩/β for the soft sort): exact, to every order. Custom Functions have ``setup_context`` and a
    vmap rule (rows fold into the batch); under ``torch.compile`` the numba paths give way to the PyTorch ones.

    Raises:
        ValueError: for a non-positive beta or an unknown backend; see :class:`RankingOperator` for input
            errors.
    """

    doubly_stochastic = True
    permutation_equivariant = True
    hard_beta = 100.0
    learnable_beta = True
    low_memory = True  # no (B, m, n) buffer but for the permutation (diffrank.operators.memory)
    paper = "Struski, Bednarczyk, Podolak, Tabor, ICML 2025, §3 (Thm 3.2 rank, Thm 3.3 top-k, Def. 3.5 P; real k)"
    parameter = "α = −1/β (Laplace scale, negative = largest first)"

    def __init__(self, beta: float | Tensor = 1.0, backend: str = "auto") -> None:
        super().__init__(beta)
        self.backend = check_backend(backend)

    def extra_repr(self) -> str:
        """β and the backend."""
        return f"beta={beta_repr(self.beta)}, backend={self.backend!r}"

    def _scaled(self, s: Tensor) -> tuple[Tensor, float]:
        """``(s, β)``, or ``(β s, 1)`` for a tensor β (kept in the caller's graph: ∂/∂β by the chain rule)."""
        if isinstance(self.beta, Tensor):
            return s * self.beta.to(s), 1.0
        return s, self.beta

    def inverse(self, scores: Tensor, w: Tensor) -> Tensor:
        """b = Lap_s⁻¹(w) in score units: the b with Σ_j F(β(s_j - b)) = w, decreasing in w (paper §4.1, eq. (4);
        α = -1/β). The thresholds behind every LapSum quantity: top-k memberships are F(β(s - Lap⁻¹(k))), the
        soft sort is Lap⁻¹(i - ½), P's rows are interval masses between Lap⁻¹(j - 1) and Lap⁻¹(j).

        Args:
            scores: ``(B, n)`` floating (validated as for every method).
            w: targets, a tensor ``(M,)`` (shared by the rows) or ``(B, M)``, every value in (0, n); may require
                grad (∂b/∂w = -1/(β S), S = ½ Σ_l e^{-β|s_l - b|}).

        Returns:
            ``(B, M)`` of the dtype of ``scores``, differentiable in scores, w and a tensor β, to every order.

        Raises:
            TypeError / ValueError: bad scores, a w that is not a floating tensor of shape ``(M,)`` or ``(B, M)``, or
                (one host synchronisation, with the scores' finiteness) a w outside (0, n).
        """
        n = self._check_call(TOPK_MEMBERSHIP, "inverse", scores)
        B = scores.shape[0]
        if not isinstance(w, Tensor) or not w.is_floating_point():
            raise TypeError(f"w must be a floating tensor, got {type(w).__name__}")
        if w.dim() not in (1, 2) or w.dim() == 2 and w.shape[0] != B or w.numel() == 0:
            raise ValueError(f"w must have shape (M,) or (B, M) = ({B}, M), got {tuple(w.shape)}")
        w = w.to(scores.device)
        check = ((torch.isfinite(w) & (w > 0) & (w < n)).all(), ValueError(f"w must satisfy 0 < w < n = {n}"))
        if B == 0:
            raise_failed([check])
            return self._empty(scores, w.shape[-1]) + 0 * w.sum()
        x = self._compute_input(scores, [check])
        s, beta = self._scaled(x)
        b = self._inverse(s, w.to(s.dtype).expand(B, w.shape[-1]), beta)
        return (b / self.beta.to(b) if isinstance(self.beta, Tensor) else b).to(scores.dtype)

    def _inverse(self, s: Tensor, w: Tensor, beta: float) -> Tensor:
        """b = Lap_s⁻¹(w) in score units, ``(B, M)``, from the kernel or the PyTorch path."""
        return _LapSumInverse.apply(s, w, beta, use_triton(self.backend, s))[0]

    def _permutation(self, s: Tensor, k: int | None) -> Tensor:
        """Rows of P[j, i] = F(x_j,i) - F(x_{j-1},i), x_j,i = β(s_i - b_j), b_j = Lap⁻¹(j) (Def. 3.5)."""
        B, n = s.shape
        r = n if k is None else k
        m = min(r, n - 1)  # b_n = -inf: F(x_n) ≡ 1
        zero = s.new_zeros(B, 1, n)
        if m == 0:
            return (s.new_ones(B, 1, n) if r == n else zero)[:, :r] + 0 * s.unsqueeze(1)  # in s's graph (zero gradient)
        s, beta = self._scaled(s)
        w = torch.arange(1, m + 1, dtype=s.dtype, device=s.device).expand(B, m)
        b = self._inverse(s, w, beta)
        x = beta * (s.unsqueeze(-2) - b.unsqueeze(-1))  # (B, m, n), increasing in j
        full = r == n
        cdf = torch.cat([zero, _laplace_cdf(x)] + ([s.new_ones(B, 1, n)] if full else []), dim=-2)
        lo, hi = cdf[:, :-1], cdf[:, 1:]  # F at b_0 ≡ 0, ..., b_r
        # stable interval masses (official diffCDF): both arguments on one side of 0 use expm1
        x_all = torch.cat([torch.full_like(zero, -math.inf), x] + ([torch.full_like(zero, math.inf)] if full else []),
                          dim=-2)
        x_lo, x_hi = x_all[:, :-1], x_all[:, 1:]
        d = (x_lo - x_hi).clamp_max(0)
        d = torch.where(torch.isfinite(d), d, torch.full_like(d, -math.inf))
        neg = -0.5 * torch.exp(x_hi.clamp_max(0)) * torch.expm1(d)
        pos = -0.5 * torch.exp(-x_lo.clamp_min(0)) * torch.expm1(d)
        return torch.where(x_hi <= 0, neg, torch.where(x_lo >= 0, pos, hi - lo))
    def _check_ks(self, ks: float | Sequence[float] | Tensor, n: int,
                  scores: Tensor) -> tuple[list[float] | Tensor, list[Check]]:
        """Real-valued k (paper §3.3): a real number, a sequence of them, or a tensor of shape ``()``,
        ``(M,)`` or ``(B, M)`` (per-row ks; may require grad); every value in (0, n].

        Raises:
            TypeError: a k that is not real.
            ValueError: an empty ks, a tensor of another shape or on the meta device, or (with the scores'
                finiteness, one host synchronisation) a k outside (0, n].
        """
        if isinstance(ks, Tensor):
            out_of_range = ValueError(f"k must satisfy 0 < k <= n = {n}")
            if ks.dtype == torch.bool or ks.is_complex():
                raise TypeError(f"k must be a real tensor, got dtype {ks.dtype}")
            if ks.is_meta:
                raise ValueError("k is on the meta device: it has a shape but no values; pass numbers or a tensor "
                                 "with values")
            if ks.dim() > 2 or ks.dim() == 2 and ks.shape[0] != scores.shape[0] or ks.numel() == 0:
                raise ValueError(f"k must be a tensor of shape (), (M,) or (B, M) = ({scores.shape[0]}, M), "
                                 f"got shape {tuple(ks.shape)}")
            ks = ks.to(scores.device).reshape(-1) if ks.dim() == 0 else ks.to(scores.device)
            return ks, [((torch.isfinite(ks) & (ks > 0) & (ks <= n)).all(), out_of_range)]
        ks = list(ks) if type(ks) is list or not isinstance(ks, numbers.Number) else [ks]
        if not ks:
            raise ValueError("ks must be a non-empty sequence of real numbers")
        for k in ks:
            if type(k) is not float and type(k) is not int and (isinstance(k, bool) or not isinstance(k, numbers.Real)):
                raise TypeError(f"k must be a real number, got {k!r}")
            if not 0 < k <= n:  # NaN fails too
                raise ValueError(f"k must satisfy 0 < k <= n = {n}, got k = {k}")
        return [float(k) for k in ks], []

    def _numba_topk(self, s: Tensor) -> bool:
        """Whether the top-k of these scores runs :class:`_LapSumTopKNumba`: float32 / float64 CPU scores, no
        Triton kernel, not under ``torch.compile`` (see :func:`_numba_ok`). It computes in float64 (float32
        results rounded once), one call forward and one backward: the PyTorch path's ~20 tensor operations cost
        more than the arithmetic at n <= 10³."""
        # the cheap tests first: this runs twice a call (validation asks _hook_checks_finite)
        return (self.backend != "triton" and s.dtype in _NUMBA_DTYPES and _numba_ok(s)
                and not use_triton(self.backend, s))

    def _hook_checks_finite(self, capability: str, scores: Tensor) -> bool:
        """The CPU top-k tests the scores for NaN / inf in its numba pass (:func:`lapsum_cpu.topk_forward`)."""
        return capability == TOPK_MEMBERSHIP and self._numba_topk(scores)

    def _topk_membership(self, s: Tensor, ks: list[float] | Tensor) -> Tensor:
        """Soft top-k memberships p = F_α(Lap⁻¹(k) - s) for each k (Thm 3.3); rows sum to k exactly."""
        numba = self._numba_topk(s)
        s, beta = self._scaled(s)
        B = s.shape[0]
        if isinstance(ks, Tensor):
            kt = ks.to(s.dtype).expand(B, ks.shape[-1])
        elif numba:
            kt = ks  # a list: numba takes it as it is (no tensor to build)
        else:
            kt = torch.tensor(ks, dtype=s.dtype, device=s.device).expand(B, len(ks))
        if numba:
            return _LapSumTopKNumba.apply(s, kt, beta)
        return _topk(s, kt, beta, self.backend)

    def _soft_rank(self, s: Tensor) -> Tensor:
        """Soft ranks R_i = 1 + Σ_{j≠i} F(β(s_j - s_i)) (Thm 3.2; rank 1 = largest, Σ R = n(n+1)/2)."""
        s, beta = self._scaled(s)
        return _LapSumRank.apply(s, beta, use_triton(self.backend, s))[0]

    def _soft_sort(self, s: Tensor) -> Tensor:
        """Soft sort, descending: sort_i = Lap_s⁻¹(i - ½) (§3.2 "soft orderings"); not sum-preserving."""
        B, n = s.shape
        w = (torch.arange(n, dtype=s.dtype, device=s.device) + 0.5).expand(B, n)
        scaled, beta = self._scaled(s)
        b = self._inverse(scaled, w, beta)
        return b / self.beta.to(b) if isinstance(self.beta, Tensor) else b
