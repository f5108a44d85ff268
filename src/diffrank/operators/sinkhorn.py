"""SinkhornSort: differentiable sorting by entropic optimal transport (Cuturi, Teboul, Vert, NeurIPS 2019).

Parameterisation (specs/difftopk_diffsort.md §2.4, the ``sinkhorn_zto`` method of Petersen et al. 2022):

- scores are squashed to [0, 1]: x̂ = sigmoid(π/√3 · (s - mean(s)) / max(std(s), 1e-6)) (a logistic
  rescaling, as in the google-research ``soft_sort`` code);
- targets on [0, 1] ("zero to one"), in our rank order: y_r = 1 - r/(n-1), r = 0..n-1 (rank 1 = 1.0);
- uniform weights a = b = 1/n; cost C[i, r] = (x̂_i - y_r)²;
- log-domain Sinkhorn on the potentials (f, g) with ε = 1/β, annealed from ε₀ = 0.1 by ×0.95 per
  iteration down to ε (never up), stopped when the item-marginal error max_i |n·Σ_r T_ir - 1| is below
  ``tolerance`` (checked every ``check_every`` iterations once ε is reached), at most ``max_iter``
  iterations (Cuturi et al. 2019, Alg. 1 in log domain);
- P[r, i] = n · T[i, r]: rows (ranks) sum to 1 exactly (the last update is the rank-side one), columns
  (items) sum to 1 within ``tolerance``.

Gradients flow by automatic differentiation through the iterations (Cuturi et al. 2019, §3; Petersen
et al. 2022 use it this way). The top-k rows are the first k rows of the full plan: entropic OT couples
all targets, so no cheaper exact form exists (the OTT k+1-target variant is a different relaxation).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from diffrank.operators.base import RankingOperator


class SinkhornSort(RankingOperator):
    """Entropic-OT relaxed permutation (doubly stochastic up to the tolerance).

    Args:
        beta: inverse temperature; ε = 1/β is the entropic regularisation in units of the [0, 1]-squashed
            cost (squared distance).
        tolerance: stop when max_i |Σ_r P[r, i] - 1| < tolerance.
        max_iter: iteration cap (each iteration = one item-side and one rank-side update).
        epsilon_start: ε₀ of the annealing schedule (ignored when ε ≥ ε₀).
        anneal: factor per iteration (0 < anneal <= 1; 1 disables annealing).
        check_every: how often the marginal error is checked (each check syncs with the host).

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``; float16/bfloat16 inputs are computed in
    float32 and cast back.

    Raises:
        ValueError: for non-positive beta / tolerance / max_iter, or anneal outside (0, 1].
    """

    doubly_stochastic: ClassVar[bool] = True
    permutation_equivariant: ClassVar[bool] = True
    hard_beta: ClassVar[float] = 1e4

    def __init__(self, beta: float = 100.0, tolerance: float = 1e-2, max_iter: int = 2000,
                 epsilon_start: float = 0.1, anneal: float = 0.95, check_every: int = 5) -> None:
        super().__init__(beta)
        if not tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {tolerance}")
        if int(max_iter) < 1 or int(check_every) < 1:
            raise ValueError(f"max_iter and check_every must be >= 1, got {max_iter}, {check_every}")
        if not 0 < anneal <= 1:
            raise ValueError(f"anneal must be in (0, 1], got {anneal}")
        self.tolerance = float(tolerance)
        self.max_iter = int(max_iter)
        self.epsilon_start = float(epsilon_start)
        self.anneal = float(anneal)
        self.check_every = int(check_every)
        self.last_iterations = 0  # iterations used by the last call (diagnostics, e.g. Petersen et al.'s remark)

    @property
    def epsilon(self) -> float:
        """Target entropic regularisation ε = 1/β."""
        return 1.0 / self.beta

    def relaxed_permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Rows of P = n · Tᵀ from log-domain Sinkhorn (Cuturi et al. 2019). Shapes as in the class docstring."""
        out_dtype = scores.dtype
        s = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        B, n = s.shape
        if n == 1:
            p = torch.ones(B, 1, 1, dtype=s.dtype, device=s.device) + 0 * s.unsqueeze(-1)
            return p.to(out_dtype)
        std = s.std(dim=-1, keepdim=True, unbiased=False).clamp_min(1e-6)
        x = torch.sigmoid((s - s.mean(dim=-1, keepdim=True)) / std * (math.pi / math.sqrt(3.0)))
        y = 1.0 - torch.arange(n, device=s.device, dtype=s.dtype) / (n - 1)
        cost = (x.unsqueeze(-1) - y.view(1, 1, n)) ** 2  # (B, items, ranks)
        log_w = -math.log(n)
        f = torch.zeros(B, n, 1, dtype=s.dtype, device=s.device)
        g = torch.zeros(B, 1, n, dtype=s.dtype, device=s.device)
        eps_target = self.epsilon
        eps = max(eps_target, self.epsilon_start)
        it = 0
        while True:
            it += 1
            # item side, then rank side: the rank marginals are exact after the second update
            f = eps * log_w - eps * torch.logsumexp((g - cost) / eps, dim=2, keepdim=True)
            g = eps * log_w - eps * torch.logsumexp((f - cost) / eps, dim=1, keepdim=True)
            at_target = eps <= eps_target
            if at_target and (it % self.check_every == 0 or it >= self.max_iter):
                with torch.no_grad():
                    log_t = (f + g - cost) / eps
                    err = (torch.logsumexp(log_t, dim=2).exp() * n - 1).abs().max()
                if float(err) < self.tolerance or it >= self.max_iter:
                    break
            elif it >= self.max_iter:
                break
            eps = max(eps_target, eps * self.anneal)
        self.last_iterations = it
        log_p = (f + g - cost) / eps + math.log(n)  # (B, items, ranks)
        p = log_p.exp().transpose(1, 2)
        if k is not None:
            p = p[:, :k]
        return p.to(out_dtype)

    def extra_repr(self) -> str:
        """The constructor arguments that ``repr`` shows (β and the paper's own parameters)."""
        return f"beta={self.beta}, tolerance={self.tolerance}, max_iter={self.max_iter}"
