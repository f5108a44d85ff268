"""The perturbed operator (Berthet et al. 2020): its values and its Jacobian estimator (Prop. 3.1) against the
expectation enumerated over the n! orders (Gumbel noise: the perturbed order is Plackett-Luce with log-weights βθ),
against central differences of the expectation (normal noise), and against the retracted form of the perturbed
top-k that circulates (Cordonnier et al. 2021), which contracts the item index of the output with the noise's and
converges to another matrix. The contract tests skip its gradcheck (``exact_gradient`` is False): this file is
where its gradient is checked."""

from __future__ import annotations

import itertools

import pytest
import torch

from diffrank.operators.base import DoubleBackwardError
from diffrank.operators.perturbed import Perturbed

THETA = torch.tensor([0.3, -0.2, 1.0, 0.1], dtype=torch.float64)
BETA = 1.5


def plackett_luce_p(theta: torch.Tensor, beta: float) -> torch.Tensor:
    """E[P*(θ + Gumbel/β)] ``(n, n)`` (rows = ranks), enumerated: P(order π) = Π_i e^{βθ_{π_i}} / Σ_{j >= i}
    e^{βθ_{π_j}}; differentiable in θ."""
    n = theta.shape[0]
    w = beta * theta
    rows = []
    for perm in itertools.permutations(range(n)):
        logp = sum(w[perm[i]] - torch.logsumexp(w[list(perm[i:])], 0) for i in range(n))
        rows.append(torch.exp(logp) * torch.eye(n, dtype=theta.dtype)[list(perm)])
    return torch.stack(rows).sum(0)


EXPECTATIONS = {  # capability → (the operator's call on (1, n) scores, its enumerated expectation)
    "topk_membership": (lambda op, x: op.topk_membership(x, [2])[:, 0], lambda p, t: p[:2].sum(0)),
    "soft_rank": (lambda op, x: op.soft_rank(x), lambda p, t: (torch.arange(1, 5, dtype=t.dtype)[:, None] * p).sum(0)),
    "soft_sort": (lambda op, x: op.soft_sort(x), lambda p, t: p @ t),
    "permutation": (lambda op, x: op(x, 2).flatten(1), lambda p, t: p[:2].flatten()),
}


def _jacobian(f, theta):
    return torch.autograd.functional.jacobian(f, theta)


@pytest.mark.parametrize("capability", sorted(EXPECTATIONS))
def test_values_and_jacobian_estimate_the_enumerated_expectation(capability):
    call, expected = EXPECTATIONS[capability]
    op = Perturbed(beta=BETA, samples=200_000, noise="gumbel", seed=1)
    got = call(op, THETA[None])[0]
    want = expected(plackett_luce_p(THETA, BETA), THETA)
    torch.testing.assert_close(got, want, rtol=0, atol=0.01)
    jac = _jacobian(lambda t: call(op, t[None])[0], THETA)
    jac_want = _jacobian(lambda t: expected(plackett_luce_p(t, BETA), t), THETA)
    assert jac_want.abs().max() > 0.2  # a real Jacobian to estimate
    torch.testing.assert_close(jac, jac_want, rtol=0, atol=0.04)


def test_top1_membership_with_gumbel_noise_is_the_softmax():
    op = Perturbed(beta=BETA, samples=200_000, noise="gumbel", seed=2)
    torch.testing.assert_close(op.topk_membership(THETA[None], [1])[0, 0], torch.softmax(BETA * THETA, 0),
                               rtol=0, atol=0.005)


def test_normal_noise_jacobian_matches_central_differences_and_is_symmetric():
    """Normal noise (no closed form): the estimate against central differences of independent large-sample means;
    the membership is the gradient of the smoothed max over k-subsets, so its Jacobian is symmetric."""
    op = Perturbed(beta=BETA, samples=400_000, noise="normal", seed=3)
    f = EXPECTATIONS["topk_membership"][0]
    jac = _jacobian(lambda t: f(op, t[None])[0], THETA)
    h, columns = 0.1, []
    for j in range(4):
        e = torch.zeros(4, dtype=THETA.dtype)
        e[j] = h
        columns.append((f(Perturbed(BETA, 400_000, seed=10 + j), (THETA + e)[None])[0]
                        - f(Perturbed(BETA, 400_000, seed=20 + j), (THETA - e)[None])[0]) / (2 * h))
    torch.testing.assert_close(jac, torch.stack(columns, 1), rtol=0, atol=0.03)
    torch.testing.assert_close(jac, jac.T, rtol=0, atol=0.02)


def test_the_retracted_transposed_estimator_differs():
    """Cordonnier et al.'s code: grad_d = (1/ε) E[Σ_k g_kd y_kd ∇ν(Z)_d] (the output's item index contracted with
    the noise's); ours: (1/ε) E[⟨g, y⟩ ∇ν(Z)]. On the top-2 rows the first converges to the analytic vector-Jacobian
    product, the second does not."""
    op = Perturbed(beta=BETA, samples=200_000, noise="gumbel", seed=4)
    g = torch.tensor([[0.5, -1.0, 2.0, 0.3], [1.0, 0.2, -0.7, 1.5]], dtype=torch.float64)
    x = THETA[None].clone().requires_grad_()
    (ours,) = torch.autograd.grad(op(x, 2), x, g[None])
    t = THETA.clone().requires_grad_()
    (analytic,) = torch.autograd.grad(plackett_luce_p(t, BETA)[:2], t, g)
    order, score_grad = op._orders(THETA[None])  # the same draws
    one_hot = torch.nn.functional.one_hot(order[1:, ..., :2], 4).to(THETA.dtype)  # (S, 1, 2, 4); row 0: unperturbed
    retracted = (g * one_hot * score_grad.unsqueeze(2)).sum(2).mean(0) * BETA  # (1, 4)
    assert (ours[0] - analytic).abs().max() < 0.05
    assert (retracted[0] - analytic).abs().max() > 0.3


def test_soft_sort_gradient_tends_to_the_hard_sorts():
    x = THETA[None].clone().requires_grad_()
    g = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    Perturbed(beta=1e7, samples=50, seed=0).soft_sort(x).backward(g)
    order = THETA.argsort(descending=True)
    torch.testing.assert_close(x.grad[0, order], g[0], rtol=0, atol=1e-6)


def test_draws_follow_the_mode_and_the_seed():
    op = Perturbed(beta=1.0, samples=8)
    x = torch.randn(3, 6, dtype=torch.float64)
    assert torch.equal(op.eval().soft_rank(x), op.soft_rank(x))  # eval(): seed 0
    torch.manual_seed(0)
    a = op.train().soft_rank(x)
    assert not torch.equal(a, op.soft_rank(x))  # train(): fresh draws
    seeded = Perturbed(beta=1.0, samples=8, seed=5).train()
    assert torch.equal(seeded.soft_rank(x), seeded.soft_rank(x))
    assert torch.equal(op.eval().soft_rank(x.float()).double(), op.soft_rank(x).float().double()) or \
        (op.eval().soft_rank(x.float()).double() - op.soft_rank(x)).abs().max() <= 1 / 8  # one near tie at most
    torch.testing.assert_close(op.eval()(x).sum(-2), torch.ones(3, 6, dtype=x.dtype))  # doubly stochastic


def test_second_derivative_is_refused():
    x = THETA[None].clone().requires_grad_()
    (grad,) = torch.autograd.grad(Perturbed(samples=16, seed=0).soft_rank(x).square().sum(), x, create_graph=True)
    with pytest.raises(DoubleBackwardError, match="Perturbed has no second derivative"):
        grad.sum().backward()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"samples": 0}, ValueError, "samples must be >= 1"),
    ({"samples": 2.5}, TypeError, "samples must be an integer"),
    ({"seed": "1"}, TypeError, "seed must be an integer"),
    ({"noise": "uniform"}, ValueError, "noise must be one of"),
    ({"beta": -1.0}, ValueError, "beta"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        Perturbed(**kwargs)
