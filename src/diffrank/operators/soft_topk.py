"""SOFT top-k (Xie, Dai, Chen, Dai, Zhao, Zha, Wei, Pfister; NeurIPS 2020): top-k as entropic optimal transport.

The n scores (mass 1/n each) are transported onto the anchors y = (0, 1) with masses (k/n, (n-k)/n)
under the squared cost C_ij = (x_i - y_j)²; the soft indicator is A = n Γ^ε[:, 0] (paper §2, eq. (3)-(4)).
The paper selects the k *smallest* x; diffrank wants the largest scores, so x = -s (exact: the 2-anchor
plan depends on x only through 2x/ε up to a shift). ε = 1/β.

- Forward (``solver="newton"``, default for top-k): with two anchors the plan is fixed by one scalar
  dual variable (:func:`_two_anchor_newton`), solved by safeguarded Newton steps: the same plan as
  Sinkhorn's fixed point, in tens of iterations instead of thousands on near-hard plans (an
  implementation choice, not in the paper; ``solver="sinkhorn"`` runs the paper's algorithm below).
- Forward (``solver="sinkhorn"``, and the sorted variant): the shared log-domain Sinkhorn (paper §3,
  Alg. 1 in log form; :mod:`diffrank.operators.log_sinkhorn`, whose ε schedule and stopping rule apply),
  the anchor-side update last, so Σ_i A_i = k exactly after every iteration. The official code has no
  tolerance and runs exactly 200 iterations (``tolerance: null, max_iter: 200, epsilon_start: null``
  reproduces it). By default ε is reached by ε-scaling from ``epsilon_start`` × the largest row-shifted
  cost: near-hard plans otherwise need thousands of iterations (at β = 100, 10 000 plain iterations leave
  an error of 2e-4; ε-scaling converges to 1e-6 in ~45; scores 10 apart at β = 10: 2 000 plain
  iterations leave 0.75, ε-scaling converges in 90). The plan is computed in float64
  on row-shifted costs (C_ij - min_j C_ij, which leaves Γ unchanged): in float32 the exponents (f + g - C)/ε
  of raw logits reach 1e6 and Γ is noise. Stopping at ``max_iter`` above the tolerance warns.
- Backward: implicit differentiation of the KKT conditions, the closed form of the paper's Alg. 4
  (App. H, Thm 3): O(n m² + m³) per row, no Sinkhorn iterate is stored; for two anchors (top-k) its 1×1
  Schur complement is written without cancellation, so numerically hard plans get their exact 0 gradient
  instead of a singular solve. It is the derivative of the
  converged plan, so it matches finite differences only as well as the forward has converged.
- Cost normalisation (the official code, ``soft_topk.py``): it divides C by its batch-global max (detached), which
  makes a row's output depend on the other rows and the gradient ignore the max. ``"none"`` (default)
  keeps C in raw score units; ``"batch"`` reproduces the official code; ``"row"`` uses each row's max.

- Triton (``backend``): :mod:`diffrank.kernels.soft_topk` fuses the Newton solve (one program per sample and
  k, all iterations on chip) and its implicit-differentiation backward; same plan, same stopping rule, same
  float64 arithmetic. It covers ``solver="newton"`` only: ``solver="sinkhorn"`` and :func:`soft_topk_sorted`
  (m > 2 anchors, no 1-D dual) always run the PyTorch path.

The sorted variant (App. B; anchors 0..k, masses 1/n for the first k and (n-k)/n for the last) is
:func:`soft_topk_sorted`: rows = ranks 1..k (largest first), each row sums to 1. It is a different OT
problem for each k, so its k rows are *not* the first k rows of a full relaxed permutation; the operator
therefore declares only ``"topk_membership"``.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import torch
from torch import Tensor

from diffrank.operators._vmap import fold_vmap
from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import TOPK_MEMBERSHIP, RankingOperator, check_beta, check_k, check_scores, compute_dtype
from diffrank.operators.log_sinkhorn import SinkhornSchedule, log_sinkhorn

COST_NORMALIZATIONS = ("none", "batch", "row")
SOLVERS = ("newton", "sinkhorn")


def _two_anchor_newton(C: Tensor, log_nu: Tensor, eps: float, max_iter: int) -> tuple[Tensor, int, float]:
    """The same entropic OT plan as Sinkhorn for two anchors, by a safeguarded Newton solve of its 1-D dual.

    With uniform μ = 1/n and f eliminated, Γ_i0 = σ(z_i + Δ)/n, Γ_i1 = σ(-(z_i + Δ))/n, z_i = (C_i1 - C_i0)/ε,
    and the anchor marginal fixes the scalar Δ = (g_0 - g_1)/ε: Σ_i σ(z_i + Δ) = n ν_0 (= k). The left side
    is increasing in Δ, so Newton steps kept inside a shrinking bracket (bisection when a step leaves it or
    did not halve the residual) converge in tens of iterations where Sinkhorn's alternating updates need
    thousands on near-hard plans.
    Item marginals are exact by construction; iterations stop when |Σ_i σ(z_i + Δ) - k| < 1e-13 n (float64
    rounding; quadratic convergence makes the last digits cheap) or the bracket has collapsed.

    Args:
        C: ``(R, n, 2)`` float64 row-shifted costs; log_nu: ``(R, 2)``; eps: ε; max_iter: iteration cap.

    Returns:
        ``(Γ (R, n, 2), iterations, final max_r |Σ_i A_i - k|)``.
    """
    R, n, _ = C.shape
    z = (C[..., 1] - C[..., 0]) / eps
    target = log_nu[:, 0].exp() * n  # k per row
    zs = z.sort(dim=-1, descending=True).values
    idx = target.floor().long().clamp(1, n - 1)
    delta = -(zs.gather(-1, (idx - 1).unsqueeze(-1)) + zs.gather(-1, idx.unsqueeze(-1))).squeeze(-1) / 2
    lo, hi = -zs[:, 0] - 40.0, -zs[:, -1] + 40.0  # Σσ < k at lo and > k at hi (σ(±40) ≈ 4e-18)
    it, err, thr = 0, float("inf"), 1e-13 * n
    prev = torch.full_like(delta, float("inf"))  # |phi| of the previous iteration
    while it < max_iter:
        sig = torch.sigmoid(z + delta.unsqueeze(-1))
        phi = sig.sum(-1) - target
        it += 1
        err = float(phi.abs().max())
        # a row is done when its sum is exact to rounding or its bracket has collapsed; done rows stay put
        done = (phi.abs() < thr) | ((hi - lo) <= 1e-15 * (1 + delta.abs()))
        if bool(done.all()):
            break
        hi = torch.where(phi > 0, delta, hi)
        lo = torch.where(phi > 0, lo, delta)
        step = delta - phi / (sig * (1 - sig)).sum(-1)
        # Newton only while it halves |phi|: between two steep sigmoids (near-tied scores at a large β) it
        # ping-pongs inside the bracket, which then shrinks by 1e-3 per iteration; bisection does not stall
        inside = torch.isfinite(step) & (step >= lo) & (step <= hi) & (phi.abs() <= 0.5 * prev)
        prev = phi.abs()
        delta = torch.where(done, delta, torch.where(inside, step, (lo + hi) / 2))
    h = z + delta.unsqueeze(-1)
    return torch.stack([torch.sigmoid(h), torch.sigmoid(-h)], dim=-1) / n, it, err


def _implicit_vjp(gam: Tensor, eps: float, grad_gam: Tensor) -> Tensor:
    """∂L/∂C from ∂L/∂Γ by implicit differentiation (Xie et al. 2020, Alg. 4 / App. H Thm 3), in float64.

    Rearranged from Alg. 4 so that nothing cancels (same derivative, other order of operations). With f
    eliminated, Γ_ij = μ_i P_ij, P_i = softmax_j((g_j - C_ij)/ε); the anchor marginals fix g up to a
    constant. With J_i = diag(P_i) - P_i P_iᵀ, u_i = ∂L/∂Γ_i, and H = Σ_i μ_i J_i (whose leading
    (m-1)×(m-1) block is Alg. 4's K = diag(ν̄) - Γ̄ᵀ diag(μ)⁻¹ Γ̄):

        q̄ = H̄⁻¹ v̄,  v = Σ_i μ_i J_i u_i,  q_m = 0,   ∂L/∂C_ij = -(1/ε) Γ_ij ((u_i - q)_j - P_iᵀ(u_i - q)).

    H's diagonal is formed as Σ_i Γ_ij (Σ_{l≠j} P_il) with exclusive sums, not ν_j - Σ_i Γ_ij²/μ_i, whose
    two terms agree to every digit on numerically hard plans (far-apart scores at a large β): there
    Alg. 4 as written hits a singular K (or turns rounding into O(1) gradients) while the exact
    derivative is 0, which this form returns. Where H̄ still cannot be solved, its pseudo-inverse
    (saturated directions carry no derivative). For two anchors (top-k) it reduces to
    ∂L/∂C_i1 = -∂L/∂C_i0 = w_i (u_i0 - u_i1 - ū)/ε with w_i = Γ_i0 Γ_i1 / μ_i.

    Args:
        gam: ``(R, n, m)`` converged plan (its own row and column sums stand for μ and ν, equal at the
            fixed point); eps: ε; grad_gam: ``(R, n, m)``.

    Returns:
        ``(R, n, m)`` gradient with respect to the cost matrix, dtype of ``gam``.
    """
    out_dtype = gam.dtype
    gam, u = gam.double(), grad_gam.double()
    m = gam.shape[-1]
    r = gam.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    p = gam / r  # (R, n, m), rows sum to 1
    # Σ_{l≠j} P_il from exclusive prefix + suffix sums (all terms >= 0: no cancellation)
    before = torch.cumsum(p, -1) - p
    after = torch.flip(torch.cumsum(torch.flip(p, [-1]), -1), [-1]) - p
    excl = (before.clamp_min(0) + after.clamp_min(0))
    h = -torch.einsum("rij,ril->rjl", gam, p)
    h.diagonal(dim1=-2, dim2=-1).copy_((gam * excl).sum(-2))
    ju = p * (u - (p * u).sum(-1, keepdim=True))  # J_i u_i
    v = (r * ju).sum(-2)  # (R, m)
    hb, vb = h[..., : m - 1, : m - 1], v[..., : m - 1].unsqueeze(-1)
    if m == 2:  # top-k: a 1×1 system, its pseudo-inverse without a host read (vmappable, twice differentiable)
        pos = hb > 0
        qb = torch.where(pos, vb / torch.where(pos, hb, 1.0), 0.0)
    else:
        qb, info = torch.linalg.solve_ex(hb, vb)
        bad = info != 0
        if bool(bad.any()):
            qb = torch.where(bad.view(-1, 1, 1), torch.linalg.pinv(hb, hermitian=True) @ vb, qb)
    q = torch.cat([qb.squeeze(-1), qb.new_zeros(qb.shape[0], 1)], dim=-1).unsqueeze(-2)  # (R, 1, m)
    uq = u - q
    grad_z = gam * (uq - (p * uq).sum(-1, keepdim=True))
    return (-grad_z / eps).to(out_dtype)


class _SoftTopKOT(torch.autograd.Function):
    """Γ (float64) of the entropic OT between x (masses 1/n) and anchors y (masses ν); forward solve, backward Alg. 4.

    The backward is torch ops on the saved plan Γ, which is this Function's output: a recorded backward
    (``create_graph=True``, ``torch.func``) differentiates Γ through the implicit derivative again, so second
    derivatives are exact (those of the converged plan; as the first ones, they match finite differences as well as
    the forward has converged). For ``torch.func`` the forward takes no ``ctx``, ``vmap`` folds the mapped dimension
    into the rows, and ``info`` (a ``SimpleNamespace``, not a pytree: it reaches the forward unchanged) receives
    the iterations.
    """

    twice_differentiable = True  # read by diffrank.losses.newton

    @staticmethod
    def forward(x: Tensor, y: Tensor, log_nu: Tensor, eps: float, norm: Tensor, schedule: SinkhornSchedule,
                solver: str, info: SimpleNamespace) -> Tensor:
        R, n = x.shape
        # float64 whatever the input: at small ε the exponents (f + g - C)/ε reach 1e4-1e6 and float32's
        # ulp there (1e-3-0.1) turns Γ into noise. Each row of C is shifted by its minimum, which leaves Γ
        # unchanged (absorbed by f) and makes the entries O(|x|) instead of O(x²).
        C = _shifted_cost(x, y, norm)
        if solver == "newton" and C.shape[-1] == 2:
            gam, it, err = _two_anchor_newton(C, log_nu.double(), eps, schedule.max_iter)
            what = "the Newton solve stopped with |Σ A - k|"
        else:
            log_gam, it, err = log_sinkhorn(C, C.new_full((1, n), -math.log(n)), log_nu.double(), eps, schedule)
            gam = log_gam.exp()
            what = "Sinkhorn stopped with the item-marginal error"
        info.iterations = it
        if schedule.tolerance is not None and not err < schedule.tolerance:
            warnings.warn(f"SOFT top-k: {what} {err:.2e} > tolerance {schedule.tolerance:g} after {it} iterations "
                          f"(ε = {eps:g}); raise max_iter or lower beta", RuntimeWarning, stacklevel=2)
        return gam

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        x, y, log_nu, eps, norm = inputs[:5]
        ctx.eps = eps
        ctx.save_for_backward(x, y, output, norm)

    @staticmethod
    def vmap(info, in_dims, x, y, log_nu, eps, norm, schedule, solver, stats):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return fold_vmap(info, in_dims, _SoftTopKOT.apply, (x, y, log_nu, eps, norm, schedule, solver, stats),
                         rows=(0, 2, 4))

    @staticmethod
    def backward(ctx, grad_gam: Tensor):
        x, y, gam, norm = ctx.saved_tensors
        grad_c = _implicit_vjp(gam, ctx.eps, grad_gam)  # float64
        # the row shift C - min_j C_ij does not change Γ, so it adds nothing to the derivative
        grad_x = (grad_c * 2 * (x.double().unsqueeze(-1) - y.double().unsqueeze(-2)) / norm.double()).sum(-1)
        return grad_x.to(x.dtype), None, None, None, None, None, None, None


class _SoftTopKNewton(torch.autograd.Function):
    """A[b, m] = σ(z_b + Δ_bm) with Σ_i A = k_m by the fused Newton kernel
    (:func:`diffrank.kernels.soft_topk.newton_forward`); backward by the implicit function theorem
    (:func:`~diffrank.kernels.soft_topk.newton_backward`).

    For ``torch.func`` the forward takes no ``ctx`` (Δ is an extra, non-differentiable output), ``vmap`` folds the
    mapped dimension into the batch and ``info`` is a ``SimpleNamespace`` (not a pytree). A recorded backward
    (``create_graph=True``, ``torch.func``) is the same formula in torch ops on the output, σ' = A (1 - A), which
    autograd differentiates through this Function again: exact second derivatives.
    """

    twice_differentiable = True  # read by diffrank.losses.newton

    @staticmethod
    def forward(scores: Tensor, ks: Tensor, scale: Tensor, max_iter: int, info: SimpleNamespace
                ) -> tuple[Tensor, Tensor]:
        from diffrank.kernels.soft_topk import newton_forward

        a, delta, info.iterations, info.error = newton_forward(scores, ks, scale, max_iter)
        return a, delta

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        scores, _, scale = inputs[:3]
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(scores, scale, output[1], output[0])

    @staticmethod
    def vmap(info, in_dims, scores, ks, scale, max_iter, stats):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch of rows, one call."""
        return fold_vmap(info, in_dims, _SoftTopKNewton.apply, (scores, ks, scale, max_iter, stats), rows=(0, 2))

    @staticmethod
    def backward(ctx, grad_a: Tensor | None, _=None):
        if grad_a is None:
            return None, None, None, None, None
        s, scale, delta, a = ctx.saved_tensors
        if torch.is_grad_enabled():  # recorded: the implicit derivative in torch ops on A (differentiable)
            w = (a * (1 - a)).double()
            g = grad_a.double()
            gbar = (w * g).sum(-1, keepdim=True) / w.sum(-1, keepdim=True).clamp_min(1e-300)
            ds = (2 * scale.double().view(-1, 1, 1) * w * (g - gbar)).sum(1)
            return ds.to(s.dtype), None, None, None, None
        from diffrank.kernels.soft_topk import newton_backward

        return newton_backward(s, scale, delta, a, grad_a), None, None, None, None


def soft_topk_newton(scores: Tensor, ks: Tensor, eps: float, norm: Tensor, max_iter: int,
                     info: dict | None = None) -> Tensor:
    """SOFT top-k memberships A = n Γ^ε[:, 0] (Xie et al. 2020, eq. (4)) by the fused two-anchor Newton solve of
    :mod:`diffrank.kernels.soft_topk`.

    Args:
        scores: ``(B, n)`` float32 / float64 on CUDA (or the CPU under ``TRITON_INTERPRET=1``), finite;
            validated by the caller.
        ks: ``(M,)`` targets, integers in [1, n - 1] (k = n is all ones: the caller's business).
        eps: entropic regularisation ε = 1/β > 0.
        norm: ``(B,)`` cost normalisation (max cost of the row or batch, or ones), treated as a constant.
        max_iter: Newton iteration cap.
        info: if given, receives ``"iterations"`` (the largest count over rows) and ``"error"`` (the largest
            final |Σ_i A_i - k|).

    Returns:
        ``(B, M, n)`` of the scores' dtype (computed in float64); row m sums to k_m to the solver's
        tolerance. Differentiable in the scores (implicit differentiation, App. H).

    Raises:
        Nothing of its own: the caller (:class:`SoftTopK`) validates the inputs and warns when the solve stops above
        its tolerance.
    """
    scale = (1.0 / (eps * norm.double().reshape(-1))).contiguous()
    stats = SimpleNamespace()
    a = _SoftTopKNewton.apply(scores, ks, scale, max_iter, stats)[0]
    if info is not None:
        info["iterations"], info["error"] = stats.iterations, stats.error
    return a


def _shifted_cost(x: Tensor, y: Tensor, norm: Tensor) -> Tensor:
    """Row-shifted float64 costs C_ij - min_j C_ij of C_ij = (x_i - y_j)² / norm, ``(R, n, m)``.

    Formed as (y* - y_j)(2 x_i - y_j - y*) / norm with y* the anchor nearest to x_i, never through x²: for
    |x| >= 1e8 the difference of two squares of size x² loses every digit in float64 (scores of 1e16 put
    the top-1 mass on the wrong item).
    """
    xd, yd = x.double().unsqueeze(-1), y.double().unsqueeze(-2)
    yy = yd.expand(*xd.shape[:-1], yd.shape[-1])
    nearest = yy.gather(-1, (xd - yy).abs().argmin(-1, keepdim=True))
    return (nearest - yy) * (2 * xd - yy - nearest) / norm.double()


def _cost_norm(x: Tensor, y: Tensor, mode: str) -> Tensor:
    with torch.no_grad():
        if mode == "none":
            return x.new_ones(x.shape[0], 1, 1)
        c = (x.unsqueeze(-1) - y.unsqueeze(-2)) ** 2
        if mode == "batch":
            return c.amax().clamp_min(torch.finfo(x.dtype).tiny).expand(x.shape[0], 1, 1)
        return c.amax(dim=(-1, -2), keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)


def _check_options(cost_normalization: str, solver: str) -> None:
    if cost_normalization not in COST_NORMALIZATIONS:
        raise ValueError(f"cost_normalization must be one of {COST_NORMALIZATIONS}, got {cost_normalization!r}")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")


def soft_topk_sorted(scores: Tensor, k: int, beta: float, max_iter: int = 2000, tolerance: float | None = 1e-6,
                     check_every: int = 10, cost_normalization: str = "none", epsilon_start: float | None = 1.0,
                     anneal: float = 0.9, solver: str = "sinkhorn") -> Tensor:
    """Sorted SOFT top-k (Xie et al. 2020, App. B): soft rows of the top-k ranks, largest first.

    Anchors k, k-1, ..., 0 on the scores with masses 1/n (k times) and (n-k)/n; row r = n Γ[:, r] is the soft
    assignment of rank r + 1. Rows sum to 1 (exactly, the anchor update is last); columns sum to <= 1
    up to the tolerance.

    Args:
        scores: ``(B, n)`` floating, finite.
        k: integer in [1, n].
        beta: inverse temperature, ε = 1/β.
        max_iter, tolerance, check_every, cost_normalization, epsilon_start, anneal, solver: as in
            :class:`SoftTopK` (``solver="newton"`` applies to k = 1 only, the two-anchor case).

    Returns:
        ``(B, k, n)`` (rows = ranks 1..k, columns = items), dtype of ``scores``.

    Raises:
        TypeError / ValueError: bad scores, k, beta or settings.
    """
    check_scores(scores)
    B, n = scores.shape
    k = check_k(k, n)
    eps = 1.0 / check_beta(beta)
    schedule = SinkhornSchedule(max_iter, tolerance, check_every, epsilon_start, anneal)
    _check_options(cost_normalization, solver)
    # largest first through reversed anchors (k, k-1, ..., 0) on the scores themselves, as in the paper's
    # appendix listing; with cost normalisation this differs from anchors 0..k on -scores (other max C)
    x = scores.to(compute_dtype(scores.dtype))
    m = k + 1 if k < n else n
    y = torch.arange(m - 1, -1, -1, dtype=x.dtype, device=x.device)
    nu = torch.full((m,), 1.0 / n, dtype=x.dtype, device=x.device)
    if k < n:
        nu[-1] = (n - k) / n
    log_nu = nu.log().expand(B, m).contiguous()
    norm = _cost_norm(x, y, cost_normalization)
    gam = _SoftTopKOT.apply(x, y, log_nu, eps, norm, schedule, solver, SimpleNamespace()).to(x.dtype)
    return (n * gam[..., :k]).transpose(-1, -2).to(scores.dtype)


class SoftTopK(RankingOperator):
    """SOFT top-k membership by entropic OT (Xie et al., NeurIPS 2020), largest scores, ε = 1/β.

    Args:
        beta: inverse temperature; ε = 1/β is the entropic regularisation in units of the (normalised)
            squared cost. The paper's defaults: ε = 0.1 (β = 10); kNN: ε = 1e-3 (MNIST), 1e-5 (CIFAR-10).
        max_iter: iteration cap (official: 200, always all of them).
        tolerance: stop once max_i |n Σ_j Γ_ij - 1| < tolerance; ``None`` runs exactly ``max_iter``.
        check_every: iterations between marginal checks (each check synchronises with the host).
        cost_normalization: ``"none"`` | ``"batch"`` (official: C / max C over the batch, detached) | ``"row"``.
        epsilon_start: ε-scaling start as a fraction of the largest row-shifted cost (the convention of
            :mod:`diffrank.operators.log_sinkhorn`); ``None`` = off (official).
        anneal: ε-scaling factor per iteration, in (0, 1).
        solver: ``"newton"`` (default): the same plan from a safeguarded Newton solve of the two-anchor dual
            (tens of iterations; exact item marginals; uses ``max_iter`` and ``tolerance`` only);
            ``"sinkhorn"``: the paper's log-domain Sinkhorn (Alg. 1), with the settings above. The two agree
            to the tolerance; the backward is the same.
        backend: ``"auto"`` (fused Triton kernels of :mod:`diffrank.kernels.soft_topk` on CUDA inputs, PyTorch
            elsewhere) | ``"torch"`` | ``"triton"`` (CPU only under ``TRITON_INTERPRET=1``). The kernels
            implement ``solver="newton"``; with ``"sinkhorn"``, ``"auto"`` runs PyTorch.

    Shapes: ``topk_membership(scores (B, n), ks)`` → ``(B, len(ks), n)``; each row sums to k exactly.
    ``last_iterations`` holds the solver iterations used by the last call.

    Raises:
        ValueError: bad beta or settings, an unknown backend, or ``backend="triton"`` with
            ``solver="sinkhorn"``; ``forward`` (no relaxed permutation, see module docstring).
    """

    capabilities = frozenset({TOPK_MEMBERSHIP})
    permutation_equivariant = True
    hard_beta = 100.0
    low_memory = True  # no (B, m, n) buffer but for the permutation (diffrank.operators.memory)
    paper = "Xie et al., NeurIPS 2020, Eq. 3-4, Alg. 1, App. H"
    parameter = "ε = 1/β (entropic regularisation)"

    def __init__(self, beta: float = 10.0, max_iter: int = 2000, tolerance: float | None = 1e-6,
                 check_every: int = 10, cost_normalization: str = "none", epsilon_start: float | None = 1.0,
                 anneal: float = 0.9, solver: str = "newton", backend: str = "auto") -> None:
        super().__init__(beta)
        _check_options(cost_normalization, solver)
        self.backend = check_backend(backend)
        if backend == "triton" and solver != "newton":
            raise ValueError("backend='triton' implements solver='newton' only (the Sinkhorn iterations run in "
                             "PyTorch); use backend='auto' or 'torch'")
        self.schedule = SinkhornSchedule(max_iter, tolerance, check_every, epsilon_start, anneal)
        self.cost_normalization = cost_normalization
        self.solver = solver
        self.last_iterations = 0

    def _topk_membership(self, scores: Tensor, ks: list[int]) -> Tensor:
        """SOFT top-k indicator A = n Γ^ε[:, 0] for each k (Xie et al. 2020, eq. (4)); k = n gives all ones."""
        B, n = scores.shape
        x = -scores
        y = torch.tensor([0.0, 1.0], dtype=x.dtype, device=x.device)
        out = x.new_ones(B, len(ks), n)
        partial = [i for i, k in enumerate(ks) if k < n]
        if not partial:
            return out
        M = len(partial)
        if self.solver == "newton" and use_triton(self.backend, scores):
            return out.index_copy(1, torch.tensor(partial, device=x.device), self._triton_newton(
                scores, [ks[i] for i in partial], x, y))
        # float64 marginals: k/n rounded to float32 leaves a target the saturated plan of far-apart scores
        # cannot meet (Newton then stops at |Σ A - k| = 0.5)
        kt = torch.tensor([ks[i] for i in partial], dtype=torch.float64, device=x.device)
        log_nu = torch.stack([torch.log(kt / n), torch.log((n - kt) / n)], dim=-1)  # (M, 2)
        xr = x.unsqueeze(1).expand(B, M, n).reshape(B * M, n)
        norm = _cost_norm(x, y, self.cost_normalization).repeat_interleave(M, dim=0)
        info = SimpleNamespace()
        gam = _SoftTopKOT.apply(xr, y, log_nu.repeat(B, 1), 1.0 / self.beta, norm, self.schedule, self.solver, info)
        self.last_iterations = info.iterations
        a = (n * gam[..., 0]).view(B, M, n).to(x.dtype)
        return out.index_copy(1, torch.tensor(partial, device=x.device), a)

    def _triton_newton(self, scores: Tensor, ks: list[int], x: Tensor, y: Tensor) -> Tensor:
        """``(B, len(ks), n)`` memberships for ks < n from the fused Newton kernel; warns like the PyTorch path."""
        norm = _cost_norm(x, y, self.cost_normalization).reshape(-1)
        kt = torch.tensor(ks, dtype=torch.float64, device=x.device)
        info: dict = {}
        a = soft_topk_newton(scores, kt, 1.0 / self.beta, norm, self.schedule.max_iter, info)
        self.last_iterations = info["iterations"]
        tol = self.schedule.tolerance
        if tol is not None and not info["error"] < tol:
            warnings.warn(f"SOFT top-k: the Newton solve stopped with |Σ A - k| {info['error']:.2e} > tolerance "
                          f"{tol:g} after {info['iterations']} iterations (ε = {1.0 / self.beta:g}); raise max_iter "
                          "or lower beta", RuntimeWarning, stacklevel=3)
        return a

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, solver={self.solver!r}, cost_normalization={self.cost_normalization!r}, "
                f"backend={self.backend!r}, {self.schedule}")
