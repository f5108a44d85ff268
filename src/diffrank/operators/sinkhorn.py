"""SinkhornSort: differentiable sorting by entropic optimal transport (Cuturi, Teboul, Vert, NeurIPS 2019).

Parameterisation (the ``sinkhorn_zto`` method of Petersen et al. 2022, §5; the google-research ``soft_sort``
code it names):

- scores are squashed to [0, 1]: x̂ = sigmoid(π/√3 · (s - mean(s)) / std(s)) (a logistic
  rescaling, as in the google-research ``soft_sort`` code);
- targets on [0, 1] ("zero to one"), in our rank order: y_r = 1 - r/(n-1), r = 0..n-1 (rank 1 = 1.0);
- uniform weights a = b = 1/n; cost C[i, r] = (x̂_i - y_r)² (Cuturi et al. 2019, §2);
- the plan T by the shared log-domain Sinkhorn (:mod:`diffrank.operators.log_sinkhorn`: ε = 1/β, the ε
  schedule and stopping rule documented there), items first and ranks last;
- P[r, i] = n · T[i, r]: rows (ranks) sum to 1 exactly (the last update is the rank-side one), columns
  (items) sum to 1 within ``tolerance``.

Gradients are those of automatic differentiation through the iterations (Cuturi et al. 2019, §3; Petersen et
al. 2022 use it this way), computed in eager autograd by recomputing the iterations in the backward, so that its
memory is a few (B, n, n) buffers whatever the iteration count (:mod:`diffrank.operators.log_sinkhorn`, "Gradient
and memory"; autograd through the unrolled loop keeps about four per iteration). With ``backend`` ``"triton"`` (or
``"auto"`` on CUDA) and n <= 64 (float32; 32 in float64: :func:`diffrank.kernels.sinkhorn.fused_size`, set by the
compiled register budgets) the iterations run in the fused kernel of ``src/diffrank/kernels/sinkhorn.py`` (one
program per sample, cost and potentials on chip), and so does the backward, a reverse sweep through the same
iterations (:mod:`diffrank.operators.log_sinkhorn`); beyond it the PyTorch loop runs. The top-k rows are the
first k rows of the full plan: entropic OT couples all targets, so no cheaper exact form exists (the OTT
k+1-target variant is a different relaxation).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import RankingOperator, beta_repr
from diffrank.operators.log_sinkhorn import SinkhornSchedule, log_sinkhorn

# largest u·β (unit roundoff of the compute dtype × β) at which the plan's marginals still converge: measured on
# random scores, float32 converges at β = 1e6 (u·β = 0.06) and never at 1e7 (0.6)
MAX_ROUNDING = 0.1


class SinkhornSort(RankingOperator):
    """Entropic-OT relaxed permutation (doubly stochastic up to the tolerance).

    Args:
        beta: inverse temperature; ε = 1/β is the entropic regularisation in units of the [0, 1]-squashed
            cost (squared distance). A 0-d tensor that requires grad is learnable (:attr:`learnable_beta`):
            autograd through the iterations at ε gives ∂/∂β (the ε-scaling iterations before do not depend on
            β); each call then reads its value once for the schedule, and runs the PyTorch loop (the fused
            kernel takes a fixed β).
        tolerance: stop when max_i |Σ_r P[r, i] - 1| < tolerance; ``None`` = always ``max_iter`` iterations.
        max_iter: iteration cap (each iteration = one item-side and one rank-side update).
        epsilon_start: ε-scaling start as a fraction of the cost scale, which is 1 here (the costs lie in
            [0, 1]); ``None`` = plain Sinkhorn at ε. The google-research code starts at ε₀ = 0.1.
        anneal: ε-scaling factor per iteration, in (0, 1) (google-research: 0.95).
        check_every: how often the marginal error is checked (each check syncs with the host).
        backend: ``"auto"`` (the fused Triton Sinkhorn kernel on CUDA inputs, PyTorch elsewhere), ``"torch"``
            or ``"triton"`` (see :mod:`diffrank.operators.backend`); the kernel serves n <= 64 (float32) / 32
            (float64), larger n runs PyTorch whatever the backend. Same iterations, result and gradient.

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``. ``last_iterations`` holds the iterations
    used by the last call (diagnostics: Petersen et al. 2022 remark that late training needs more).

    Second derivatives are exact on the PyTorch path (a recorded backward differentiates the recomputed
    iterations); the fused kernel refuses a double backward (:class:`~diffrank.operators.base.DoubleBackwardError`).
    Under ``torch.compile`` the convergence check is a host read, so with a tolerance the iterations run eagerly
    (one graph break); ``tolerance=None`` (exactly ``max_iter`` iterations) compiles with ``fullgraph=True``. Under
    ``torch.func.vmap`` the check covers every vmapped sample (the result equals the stacked eager call).

    Raises:
        ValueError: for a non-positive beta, an unknown backend or a setting outside its range (see
            :class:`~diffrank.operators.log_sinkhorn.SinkhornSchedule`); at the call, a β beyond the compute
            dtype's range (u·β > :data:`MAX_ROUNDING`: float32 above β ≈ 1.7e6, float64 above ≈ 9e14).

    Warns:
        RuntimeWarning: the item marginals are still above ``tolerance`` after ``max_iter`` iterations.
    """

    doubly_stochastic = True
    permutation_equivariant = True
    hard_beta = 1e4
    learnable_beta = True
    paper = "Cuturi, Teboul, Vert, NeurIPS 2019, §2-3 (the `sinkhorn_zto` form of Petersen et al. 2022, §5)"
    parameter = "ε = 1/β (entropic regularisation, on scores squashed to [0, 1])"

    def __init__(self, beta: float | Tensor = 100.0, tolerance: float | None = 1e-2, max_iter: int = 2000,
                 epsilon_start: float | None = 0.1, anneal: float = 0.95, check_every: int = 5,
                 backend: str = "auto") -> None:
        super().__init__(beta)
        self.backend = check_backend(backend)
        self.schedule = SinkhornSchedule(max_iter, tolerance, check_every, epsilon_start, anneal)
        self.last_iterations = 0

    def _dense_rows(self, capability: str, n: int, k: int | Sequence[int] | None) -> int | None:
        """All n rows whatever k: the transport plan and its cost matrix are ``(B, n, n)`` before the top rows are
        cut (:meth:`~diffrank.operators.base.RankingOperator._dense_rows`)."""
        return None if super()._dense_rows(capability, n, k) is None else n

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Rows of P = n · Tᵀ from log-domain Sinkhorn (Cuturi et al. 2019). Shapes as in the class docstring."""
        self._check_range(scores)
        if scores.shape[1] == 1:
            return torch.ones_like(scores).unsqueeze(-1) + 0 * scores.unsqueeze(-1)
        return self._plan(self._cost(scores), k)

    def _check_range(self, scores: Tensor) -> None:
        """Refuse a β beyond the compute dtype's range (see the class docstring, Raises)."""
        unit = torch.finfo(scores.dtype).eps / 2
        beta = float(self.beta.detach()) if isinstance(self.beta, Tensor) else self.beta
        if unit * beta > MAX_ROUNDING:
            # the log-domain plan (f + g - C) / ε rounds f, g, C (all O(1)) to u and divides by ε = 1/β: its
            # entries carry errors of u·β, and past ~0.1 the marginals stop converging (rows summing to 186 at
            # β = 1e9 in float32, no error raised, before this check)
            raise ValueError(f"beta={beta:g} is out of {str(scores.dtype).removeprefix('torch.')}'s range for "
                             f"{type(self).__name__}: the log-domain plan carries rounding errors of u·β = "
                             f"{unit * beta:.2g} (u = {unit:.2g}), so its marginals cannot converge; use "
                             f"beta <= {MAX_ROUNDING / unit:.3g}, or float64 scores")

    @staticmethod
    def _cost(scores: Tensor) -> Tensor:
        """The cost C[i, r] = (x̂_i − y_r)² ``(B, items, ranks)`` in [0, 1] of scores ``(B, n)``, n >= 2 (module
        docstring: squashed points x̂, targets y_r = 1 − r/(n−1))."""
        n = scores.shape[1]
        # standardised without a floor on std (one of 1e-6 squashed every set spread by less to 0.5: a uniform P
        # whatever β) and without squaring raw scores (1e20 overflows float32): divide by the largest |s - mean|
        # first, which the result does not depend on. A set of equal scores maps to 0 with finite gradients.
        centred = scores - scores.mean(dim=-1, keepdim=True)
        m = centred.abs().amax(dim=-1, keepdim=True).detach()
        c = centred / torch.where(m > 0, m, torch.ones_like(m))
        var = c.square().mean(dim=-1, keepdim=True)
        std = torch.where(var > 0, var, torch.ones_like(var)).sqrt()
        x = torch.sigmoid(c / std * (math.pi / math.sqrt(3.0)))
        y = 1.0 - torch.arange(n, device=scores.device, dtype=scores.dtype) / (n - 1)
        return (x.unsqueeze(-1) - y.view(1, 1, n)) ** 2

    def _plan(self, cost: Tensor, k: int | None) -> Tensor:
        """Rows of P = n · Tᵀ ``(R, k or n, n)`` for a cost ``(R, items, ranks)`` whose entries are O(1) (the ε
        schedule takes 1 as the cost scale); warns when the item marginals miss the tolerance."""
        n = cost.shape[-1]
        learnable = isinstance(self.beta, Tensor)
        log_w = cost.new_full((1, n), -math.log(n))
        # the squashed points and the targets lie in [0, 1], so the cost scale of the ε schedule is 1
        log_t, self.last_iterations, err = log_sinkhorn(cost, log_w, log_w, 1.0 / self.beta, self.schedule, 1.0,
                                                        kernel=not learnable and use_triton(self.backend, cost))
        tolerance = self.schedule.tolerance
        if tolerance is not None and not err < tolerance:  # also NaN: the check itself overflowed
            beta = float(self.beta.detach()) if learnable else self.beta
            warnings.warn(f"{type(self).__name__} did not converge: item-marginal error {err:.2e} > tolerance "
                          f"{tolerance:g} after {self.last_iterations} iterations (beta={beta:g}, n={n}); rows of P "
                          "may not sum to 1: raise max_iter or lower beta", RuntimeWarning, stacklevel=4)
        p = (log_t + math.log(n)).exp().transpose(1, 2)
        return p if k is None else p[:, :k]

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, {self.schedule}, backend={self.backend!r}"
