"""Perturbed optimizers for ranking (Berthet, Blondel, Teboul, Cuturi, Vert, Bach, NeurIPS 2020).

The hard permutation, top-k indicator, ranks and sort are maximisers of a linear objective over a polytope (the
permutation matrices, the k-subsets, the permutahedron): y*(θ) = argmax_{y ∈ C} ⟨y, θ⟩. The perturbed maximiser

    y_ε(θ) = E_Z[ y*(θ + ε Z) ],    Z with density μ(z) ∝ exp(−ν(z))

is smooth, and its Jacobian has the unbiased estimator of Berthet et al. 2020, Prop. 3.1:

    J_θ y_ε(θ) = E_Z[ y*(θ + ε Z) ∇ν(Z)ᵀ ] / ε,    ∇ν(z) = z (normal noise), 1 − e^{−z} (Gumbel noise).

So the backward of an output y (any of the four) with upstream gradient g is (1/ε) mean_s (⟨g, y*(θ + ε Z_s)⟩ −
⟨g, y*(θ)⟩) ∇ν(Z_s): the row of the Jacobian that multiplies g, which keeps the memory linear in samples × n. The
unperturbed output y*(θ) is a control variate (ours, not the paper's): it keeps the estimate unbiased, as
E[∇ν(Z)] = 0, and makes each term exactly 0 where a draw does not change the order, so the variance does not grow as
1/ε² when ε → 0 (the plain estimator's does: at β = 10⁷ it gave gradients of 10⁵ for a sort whose true one is 1). The
top-k code that circulates for Cordonnier et al. (CVPR 2021) contracts the sample index with the output's item
index instead (E[y_{kd} Z_d]: only the diagonal), which its authors retracted; tests/operators/test_perturbed.py
shows the two differ and that this estimator converges to the analytic Jacobian (Gumbel noise: Plackett-Luce
probabilities, enumerable for small n).

The four capabilities, with the convention of every operator (rows = ranks, rank 1 = largest): P̄ = E[P*(θ + εZ)]
(doubly stochastic: every sample is a permutation), top-k membership E[1{rank_j(θ + εZ) ≤ k}], soft rank
E[rank(θ + εZ)], and soft sort P̄ θ (the perturbed permutation applied to the unperturbed scores, as the other
operators' P @ s; its gradient is P̄ᵀ g plus the estimator term).

Noise: ``samples`` draws per set. In ``train()`` mode fresh noise every call (torch's global generator, so
``torch.manual_seed`` / ``lightning.seed_everything`` make a run reproducible); in ``eval()`` mode, and whenever
``seed`` is set, the same draws every call (a generator seeded with ``seed``, 0 in ``eval()``), shared by the sets
of a batch: evaluation and the functional API (whose operators are in ``eval()`` mode) are then deterministic
functions of each set alone, whatever batch or padding it comes with. The
gradient is an estimate: ``gradcheck`` against finite differences does not apply (the forward of one draw set is
piecewise constant); second derivatives raise :class:`~diffrank.operators.base.DoubleBackwardError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from diffrank.operators.base import RankingOperator, constant, refuse_double_backward
from diffrank.operators.gumbel import gumbel

NOISES = ("normal", "gumbel")


def noise_gradient(z: Tensor, noise: str) -> Tensor:
    """∇ν(z) for the noise density μ(z) ∝ exp(−ν(z)) (Berthet et al. 2020, Prop. 3.1): ``z`` for the standard
    normal, ``1 − exp(−z)`` for the standard Gumbel; same shape and dtype as ``z``."""
    return z if noise == "normal" else 1.0 - torch.exp(-z)


class _Perturbed(torch.autograd.Function):
    """The averaged output ``out`` of hard outputs y_s at the perturbed scores, whose backward is the estimator of
    Berthet et al. 2020, Prop. 3.1 with the unperturbed output as control variate (module docstring): ``inner(g)``
    gives ⟨g, y_s⟩ ``(S + 1, B)`` for the unperturbed scores (row 0) and each draw, from the orders (no per-draw
    output is stored); ``score_grad`` is ∇ν(Z_s) ``(S, B, n)``; ``direct(g)``, when given, the pathwise term
    ``(B, n)`` of an output linear in the unperturbed scores (the soft sort: P̄ᵀ g)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(scores: Tensor, out: Tensor, score_grad: Tensor, epsilon: float, inner, direct) -> Tensor:
        return out.view_as(out)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        _, _, score_grad, ctx.epsilon, ctx.inner, ctx.direct = inputs
        ctx.save_for_backward(score_grad)

    @staticmethod
    def backward(ctx, g: Tensor):
        (score_grad,) = ctx.saved_tensors
        inner = ctx.inner(g)
        grad = ((inner[1:] - inner[:1]).unsqueeze(-1) * score_grad).mean(0) / ctx.epsilon
        if ctx.direct is not None:
            grad = grad + ctx.direct(g)
        return refuse_double_backward((grad, None, None, None, None, None), "Perturbed",
                                      "a deterministic relaxation (e.g. method='neuralsort'): the perturbed "
                                      "gradient is a Monte-Carlo estimate")


class Perturbed(RankingOperator):
    """Perturbed ranking operator (Berthet et al., NeurIPS 2020, §3, Prop. 3.1), rows = ranks (rank 1 = largest).

    Args:
        beta: inverse noise scale β = 1/ε > 0 (the paper's ε, the noise scale, is 1/β): larger = closer to the
            hard result. Scores are perturbed as θ + Z/β.
        samples: draws per set S >= 1 (the paper's M); the estimator's standard error falls as 1/√S.
        noise: ``"normal"`` (Berthet et al.'s default) or ``"gumbel"`` (then top-1 membership is softmax(βθ)
            exactly, the Gumbel-max trick).
        seed: None (fresh noise in ``train()``, seed 0 in ``eval()``) or an int: the same draws at every call.

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)`` (rows sum to 1, columns too for all n rows);
    ``topk_membership`` ``(B, M, n)``; ``soft_rank`` / ``soft_sort`` ``(B, n)``. Memory O(S · B · n) for all but
    the permutation (O(B · k · n) more for its rows).

    Raises:
        ValueError: beta <= 0, samples < 1, an unknown noise; see :class:`RankingOperator` for input errors.
        TypeError: a non-integer ``samples`` or ``seed``.
        DoubleBackwardError: when a gradient of this operator is differentiated again.
    """

    doubly_stochastic = True
    hard_beta = 1e4
    twice_differentiable = False
    exact_gradient = False  # a Monte-Carlo estimate (Prop. 3.1): checked by its own tests, not gradcheck
    paper = "Berthet, Blondel, Teboul, Cuturi, Vert, Bach, NeurIPS 2020, §3, Prop. 3.1 (perturbed maximiser)"
    parameter = "ε = 1/β (noise scale)"

    def __init__(self, beta: float = 1.0, samples: int = 100, noise: str = "normal", seed: int | None = None) -> None:
        super().__init__(beta)
        for name, value in (("samples", samples), ("seed", seed)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an integer, got {value!r} of type {type(value).__name__}")
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
        self.samples, self.noise, self.seed = samples, noise, seed

    def _draw(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """The scores θ and the perturbed scores θ + εZ_s ``(S + 1, B, n)``, and ∇ν(Z_s) ``(S, B, n)``."""
        shape = (self.samples, *scores.shape)
        generator = None
        if self.seed is not None or not self.training:
            generator = torch.Generator(device=scores.device).manual_seed(0 if self.seed is None else self.seed)
            # fixed draws are shared by the sets of a batch: a set's result then depends on that set alone (not on
            # the batch it came in, nor on padding: diffrank.functional's mask)
            shape = (self.samples, 1, scores.shape[-1])
        # drawn in float32 whatever the scores' dtype: the same seed gives the same draws in float32 and float64
        # (half precision is computed in float32), so the dtypes differ only by the rounding of θ + εZ
        like = torch.empty((), dtype=torch.float32, device=scores.device)
        # outside torch.func's transforms (constant): under vmap every sample of the batch gets the draws of a call
        # on one sample, so vmap equals the loop in eval() mode (torch.randn under vmap would need a randomness flag)
        z = constant(lambda: torch.randn(shape, dtype=torch.float32, device=scores.device, generator=generator)
                     if self.noise == "normal" else gumbel(shape, like, generator)).to(scores.dtype)
        # row 0: the unperturbed scores, whose output is the control variate
        z = z.expand(self.samples, *scores.shape)
        return torch.cat([scores.detach().unsqueeze(0), scores.detach().unsqueeze(0) + z / self.beta]), \
            noise_gradient(z, self.noise)

    def _orders(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """The items in descending order of the scores (row 0) and of each draw ``(S + 1, B, n)``, and ∇ν(Z)."""
        perturbed, score_grad = self._draw(scores)
        return perturbed.argsort(dim=-1, descending=True), score_grad

    @staticmethod
    def _ranks(order: Tensor, dtype: torch.dtype) -> Tensor:
        """Ranks 1..n of every item ``(S, B, n)`` from the orders."""
        pos = torch.arange(1, order.shape[-1] + 1, dtype=dtype, device=order.device).expand(order.shape)
        return torch.zeros(order.shape, dtype=dtype, device=order.device).scatter(-1, order, pos)  # out of place: vmap

    def _estimated(self, scores: Tensor, out: Tensor, score_grad: Tensor, inner, direct=None) -> Tensor:
        """``out`` with the estimator's backward (:class:`_Perturbed`)."""
        return _Perturbed.apply(scores, out, score_grad, 1.0 / self.beta, inner, direct)

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """P̄ = E[P*(θ + εZ)] ``(B, k or n, n)``: each draw's rows one-hot at the item of that rank."""
        order, score_grad = self._orders(scores)
        S, B, n = score_grad.shape
        rows = order[..., :n if k is None else k]  # (S + 1, B, m)
        out = torch.zeros(B, rows.shape[-1], n, dtype=scores.dtype, device=scores.device).scatter_add(
            -1, rows[1:].permute(1, 2, 0), torch.full((B, rows.shape[-1], S), 1.0 / S, dtype=scores.dtype,
                                                      device=scores.device))
        # ⟨g, P*_s⟩ = Σ_r g[r, rows_s[r]]
        return self._estimated(scores, out, score_grad, lambda g: g.unsqueeze(0).expand(S + 1, -1, -1, -1).gather(
            -1, rows.unsqueeze(-1)).squeeze(-1).sum(-1))

    def _topk_membership(self, scores: Tensor, ks: Sequence[int]) -> Tensor:
        """E[1{rank_j(θ + εZ) ≤ k}] ``(B, M, n)``."""
        order, score_grad = self._orders(scores)
        ranks = self._ranks(order, scores.dtype)
        kk = torch.as_tensor(list(ks), dtype=scores.dtype, device=scores.device).view(1, 1, -1, 1)
        hard = (ranks.unsqueeze(2) <= kk).to(scores.dtype)  # (S + 1, B, M, n)
        return self._estimated(scores, hard[1:].mean(0), score_grad, lambda g: (hard * g).flatten(2).sum(-1))

    def _soft_rank(self, scores: Tensor) -> Tensor:
        """E[rank(θ + εZ)] ``(B, n)`` in [1, n]."""
        order, score_grad = self._orders(scores)
        ranks = self._ranks(order, scores.dtype)  # (S + 1, B, n)
        return self._estimated(scores, ranks[1:].mean(0), score_grad, lambda g: (ranks * g).sum(-1))

    def _soft_sort(self, scores: Tensor) -> Tensor:
        """P̄ θ ``(B, n)``: the unperturbed scores in each draw's order, averaged (descending)."""
        order, score_grad = self._orders(scores)
        S = score_grad.shape[0]
        values = scores.detach().unsqueeze(0).expand_as(order).gather(-1, order)  # (S + 1, B, n)

        def direct(g: Tensor) -> Tensor:
            """(P̄ᵀ g)_j: g at rank r goes to the item each draw put there."""
            index = order[1:].transpose(0, 1).flatten(1)  # (B, S·n)
            return torch.zeros_like(g).scatter_add(-1, index, g.repeat(1, S)) / S

        return self._estimated(scores, values[1:].mean(0), score_grad, lambda g: (values * g).sum(-1), direct)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, samples={self.samples}, noise={self.noise!r}, seed={self.seed}"

