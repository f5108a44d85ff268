"""The stochastic operators: Gumbel-Sinkhorn (Mena et al., ICLR 2018) and stochastic NeuralSort (Grover et al.,
ICLR 2019, §4). Without noise they are Sinkhorn / NeuralSort; with noise, Gumbel-Sinkhorn is the Sinkhorn
normalisation of the perturbed kernel (checked against plain alternating normalisation) and stochastic NeuralSort's
hard samples follow the Plackett-Luce law (checked against the exact marginals by enumeration); noise follows the
module's mode and is reproducible from a seed or a generator.
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from diffrank import functional as F
from diffrank.operators import available, load
from diffrank.operators.gumbel import gumbel
from diffrank.operators.gumbel_sinkhorn import GumbelSinkhorn, gumbel_sinkhorn
from diffrank.operators.log_sinkhorn import SinkhornSchedule
from diffrank.operators.neuralsort_stochastic import NeuralSortStochastic
from diffrank.operators.sinkhorn import SinkhornSort

STOCHASTIC = ("gumbel_sinkhorn", "neuralsort_stochastic")


def _scores(B=3, n=5, seed=0):
    return torch.randn(B, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_every_other_operator_ignores_the_mode():
    """The registry tests run operators in eval mode (helpers.load_deterministic): that changes no other operator."""
    s = _scores()
    for name in available():
        if name in STOCHASTIC or name == "perturbed":  # its mode picks fresh or fixed draws (test_perturbed.py)
            continue
        op = load(name)
        call = op.soft_rank if "soft_rank" in op.capabilities else (lambda x, o=op: o.topk_membership(x, [2]))
        a = call(s)
        op.eval()
        torch.testing.assert_close(call(s), a, atol=0, rtol=0)


def test_gumbel_sinkhorn_without_noise_is_sinkhorn():
    s = _scores()
    ref = SinkhornSort(beta=30.0)
    for op in (GumbelSinkhorn(beta=30.0, noise=False), GumbelSinkhorn(beta=30.0).eval(),
               GumbelSinkhorn(beta=30.0, noise_scale=0.0).train()):
        torch.testing.assert_close(op(s), ref(s), atol=0, rtol=0)
        torch.testing.assert_close(op.soft_sort(s), ref.soft_sort(s), atol=0, rtol=0)
        torch.testing.assert_close(op.topk_membership(s, [1, 3]), ref.topk_membership(s, [1, 3]), atol=0, rtol=0)


def _sinkhorn_normalise(log_k, iters=5000):
    """Alternating column / row normalisation of exp(log_k) (Sinkhorn 1964), rows last: ``(..., n, n)``."""
    p = torch.softmax(log_k, dim=-1)
    for _ in range(iters):
        p = p / p.sum(-2, keepdim=True)
        p = p / p.sum(-1, keepdim=True)
    return p


def test_gumbel_sinkhorn_is_the_sinkhorn_operator_of_the_perturbed_kernel():
    """P = S(log α + σ g) with log α = −β·C (SinkhornSort's cost), the noise drawn from the generator."""
    s, beta, sigma = _scores(B=2, n=4), 5.0, 0.7
    op = GumbelSinkhorn(beta=beta, noise_scale=sigma, noise=True, samples=3, tolerance=1e-10, max_iter=20000,
                        generator=torch.Generator().manual_seed(3))
    p = op(s)
    assert p.shape == (3, 2, 4, 4)
    g = gumbel((3, 2, 4, 4), s, torch.Generator().manual_seed(3))  # the same draw
    log_k = -beta * SinkhornSort._cost(s) + sigma * g  # (S, B, items, ranks)
    want = _sinkhorn_normalise(log_k.transpose(-1, -2))  # P has rows = ranks
    torch.testing.assert_close(p, want, atol=1e-7, rtol=0)
    assert not torch.allclose(p[0], p[1])  # independent samples


def test_gumbel_sinkhorn_function():
    la = torch.randn(2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 30.0  # any offset
    tight = SinkhornSchedule(max_iter=20000, tolerance=1e-12, check_every=5, epsilon_start=None)
    torch.testing.assert_close(gumbel_sinkhorn(la, 0.5, noise=False, schedule=tight), _sinkhorn_normalise(la / 0.5),
                               atol=1e-9, rtol=0)
    default = gumbel_sinkhorn(la, 0.5, noise=False)  # stops at column sums within 1e-3
    torch.testing.assert_close(default.sum(-2), torch.ones(2, 4, dtype=la.dtype), atol=1e-3, rtol=0)
    p = gumbel_sinkhorn(la, 0.5, samples=3, generator=torch.Generator().manual_seed(0), schedule=tight)
    want = _sinkhorn_normalise((la + gumbel((3, 2, 4, 4), la, torch.Generator().manual_seed(0))) / 0.5)
    assert p.shape == (3, 2, 4, 4)
    torch.testing.assert_close(p, want, atol=1e-9, rtol=0)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 2, 4, dtype=la.dtype))
    with pytest.raises(ValueError, match=r"\(B, n, n\)"):
        gumbel_sinkhorn(la[:, :3])
    with pytest.raises(ValueError, match="tau"):
        gumbel_sinkhorn(la, 0.0)


def test_stochastic_neuralsort_without_noise_is_neuralsort():
    s = _scores()
    ref = load("neuralsort", beta=2.0)
    for op in (NeuralSortStochastic(beta=2.0, noise=False), NeuralSortStochastic(beta=2.0).eval()):
        torch.testing.assert_close(op(s), ref(s), atol=0, rtol=0)
        torch.testing.assert_close(op(s, k=2), ref(s, k=2), atol=0, rtol=0)
        torch.testing.assert_close(op.soft_rank(s), ref.soft_rank(s), atol=0, rtol=0)


def test_one_sample_at_zero_noise_is_neuralsort(monkeypatch):
    """A noisy call whose Gumbel draw is 0 everywhere gives NeuralSort of the scores themselves."""
    import diffrank.operators.neuralsort_stochastic as module

    monkeypatch.setattr(module, "gumbel", lambda shape, like, generator=None: like.new_zeros(shape))
    s = _scores()
    op = NeuralSortStochastic(beta=2.0, noise=True)
    torch.testing.assert_close(op(s), load("neuralsort", beta=2.0)(s), atol=0, rtol=0)


def _plackett_luce_marginals(w):
    """Exact Pr(item j at rank r) of PL(w) for a small n, by enumerating the n! orders: ``(n, n)`` rows = ranks."""
    n = len(w)
    m = torch.zeros(n, n, dtype=torch.float64)
    for order in itertools.permutations(range(n)):
        prob, left = 1.0, float(sum(w))
        for j in order:
            prob *= w[j] / left
            left -= w[j]
        for r, j in enumerate(order):
            m[r, j] += prob
    return m


def test_hard_samples_follow_plackett_luce():
    """Mean of the hard samples = the PL marginals within 3 standard errors (Grover et al. 2019, §4, Prop. 5)."""
    log_w = torch.tensor([[1.0, 0.2, -0.6]], dtype=torch.float64)
    want = _plackett_luce_marginals(log_w[0].exp().tolist())
    torch.manual_seed(0)
    samples = 20000
    op = NeuralSortStochastic(beta=1.0, hard=True, samples=samples).train()
    p = op(log_w)[:, 0]  # (S, n, n)
    assert set(p.unique().tolist()) == {0.0, 1.0}
    torch.testing.assert_close(p.sum(-1), torch.ones(samples, 3, dtype=p.dtype))
    torch.testing.assert_close(p.sum(-2), torch.ones(samples, 3, dtype=p.dtype))
    mean = p.mean(0)
    se = (want * (1 - want) / samples).sqrt()
    assert ((mean - want).abs() <= 3 * se).all(), (mean, want, se)
    # the test can fail: the uniform law (no weights) is far outside
    assert ((mean - 1 / 3).abs() > 3 * se).any()


def test_straight_through_gradient_is_neuralsorts():
    s = _scores().requires_grad_()
    w = torch.randn(3, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    hard = NeuralSortStochastic(beta=2.0, hard=True, noise=False)
    out = hard(s)
    torch.testing.assert_close(out.detach(), F.permutation_matrix(s.detach(), method="neuralsort", hard=True,
                                                                  beta=2.0), atol=0, rtol=0)
    (g_hard,) = torch.autograd.grad((out * w).sum(), s)
    (g_soft,) = torch.autograd.grad((load("neuralsort", beta=2.0)(s) * w).sum(), s)
    torch.testing.assert_close(g_hard, g_soft)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_noise_follows_the_mode_and_the_seed(name):
    s = _scores()
    op = load(name)
    assert op.training and op.noisy
    torch.manual_seed(5)
    a = op(s)
    torch.manual_seed(5)
    torch.testing.assert_close(op(s), a, atol=0, rtol=0)  # reproducible from the global seed
    assert not torch.allclose(op(s), a)  # a fresh draw differs
    det = op.eval()(s)
    torch.testing.assert_close(op(s), det, atol=0, rtol=0)
    assert not torch.allclose(a, det)
    op.noise = True
    assert op.noisy  # forced on in eval
    g1, g2 = (load(name, generator=torch.Generator().manual_seed(9)) for _ in range(2))
    torch.testing.assert_close(g1(s), g2(s), atol=0, rtol=0)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_samples_add_a_leading_dimension(name):
    s = _scores(B=2, n=4).requires_grad_()
    op = load(name, samples=3, beta=3.0)
    shapes = {"forward": (3, 2, 4, 4), "k": (3, 2, 2, 4), "soft_sort": (3, 2, 4), "soft_rank": (3, 2, 4),
              "topk_membership": (3, 2, 2, 4)}
    outs = {"forward": op(s), "k": op(s, k=2), "soft_sort": op.soft_sort(s), "soft_rank": op.soft_rank(s),
            "topk_membership": op.topk_membership(s, [1, 2])}
    for key, out in outs.items():
        assert out.shape == shapes[key], key
    p = outs["forward"]
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 2, 4, dtype=p.dtype))
    assert not torch.allclose(p[0], p[1])
    (grad,) = torch.autograd.grad(p.square().sum(), s)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    op.eval()  # no noise: the same shape, identical samples
    p = op(s)
    assert p.shape == (3, 2, 4, 4) and torch.equal(p[0], p[2])
    assert op(s[:0]).shape == (3, 0, 4, 4)
    # a loss over a (B, n, n) target broadcasts over the samples
    from diffrank.losses.sorting import SortingBCELoss

    values = torch.randn(2, 4, dtype=torch.float64)
    for form in ("bce", "ce", "ce_rows"):
        many = load(name, samples=3, beta=3.0, generator=torch.Generator().manual_seed(4))
        one = load(name, beta=3.0, generator=torch.Generator().manual_seed(4))
        per_sample = SortingBCELoss(one, form=form)(s.repeat(3, 1), values.repeat(3, 1))  # the same draws, stacked
        torch.testing.assert_close(SortingBCELoss(many, form=form)(s, values), per_sample)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_bad_settings(name):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="samples"):
            load(name, samples=bad)
    with pytest.raises(ValueError, match="noise"):
        load(name, noise="yes")
    with pytest.raises(TypeError, match="generator"):
        load(name, generator=0)
    with pytest.raises(ValueError, match="samples"):
        F.soft_rank(_scores(), method=name, samples=2)


def test_bad_noise_scale():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise_scale"):
            GumbelSinkhorn(noise_scale=bad)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_noisy_gradcheck_with_a_fixed_draw(name):
    """With a fixed draw (a fresh generator of one seed per call) the noisy operator is a smooth function."""
    s = _scores(B=2, n=4).requires_grad_()
    opts = {"tolerance": None, "max_iter": 60} if name == "gumbel_sinkhorn" else {}

    def f(x):
        return load(name, beta=2.0, noise=True, samples=2, generator=torch.Generator().manual_seed(1), **opts)(x)

    assert torch.autograd.gradcheck(f, (s,))


def test_gumbel_sinkhorn_refuses_nan_and_plus_inf_logits_but_keeps_minus_inf_masks():
    """A NaN or +inf in log_alpha turned the whole result into NaN without an error; they raise, naming log_alpha,
    while −inf (a forbidden entry) still gives a zero there. Under vmap the check cannot read values and is skipped."""
    for bad in (float("nan"), float("inf")):
        la = torch.tensor([[[0.0, bad], [1.0, 0.0]]])
        with pytest.raises(ValueError, match=r"log_alpha contains NaN or \+inf"):
            gumbel_sinkhorn(la, noise=False)
    la = torch.randn(1, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    la[0, 0, 1] = -math.inf
    p = gumbel_sinkhorn(la, noise=False)
    assert p[0, 0, 1] == 0 and torch.isfinite(p).all()
    with pytest.raises(ValueError, match="log_alpha is on the meta device"):
        gumbel_sinkhorn(torch.empty(1, 3, 3, device="meta"), noise=False)


def test_gumbel_sinkhorn_tensor_tau_stays_in_the_graph():
    """A tensor τ that requires grad (an nn.Parameter) had tau.grad None: float(τ) cut it from the graph. It is
    differentiated now (gradcheck in τ at a fixed number of iterations) and checked under its name."""
    la = torch.randn(2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fixed = SinkhornSchedule(max_iter=30, tolerance=None, epsilon_start=None)
    tau = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gumbel_sinkhorn(la, t, noise=False, schedule=fixed), (tau,))
    param = torch.nn.Parameter(torch.tensor(0.7))
    gumbel_sinkhorn(la.float(), param, noise=False).pow(2).sum().backward()
    assert param.grad is not None and torch.isfinite(param.grad)
    for bad in (0.0, -1.0, float("nan"), "1", torch.tensor([1.0, 2.0]),
                torch.tensor(-0.5, requires_grad=True), torch.tensor(1.0, device="meta")):
        with pytest.raises(ValueError, match="tau"):
            gumbel_sinkhorn(la, bad, noise=False)


def test_gumbel_sinkhorn_warns_when_the_columns_miss_the_tolerance():
    """At τ = 0.05 the default 200 iterations leave column sums 0.02 from 1 (the docstring promises 1e-3): a
    RuntimeWarning says so and what to change, as GumbelSinkhorn's class warns; a converged call does not warn."""
    torch.manual_seed(1)
    la = torch.randn(4, 8, 8, dtype=torch.float64) * 5
    converge = r"gumbel_sinkhorn did not converge: column-sum error .*\(tau=0\.05, n=8\).*raise max_iter"
    with pytest.warns(RuntimeWarning, match=converge):
        p = gumbel_sinkhorn(la, 0.05, noise=False)
    assert (p.sum(-2) - 1).abs().max() > 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = gumbel_sinkhorn(la / 5, 1.0, noise=False)
    assert (p.sum(-2) - 1).abs().max() < 1e-3


def test_gumbel_sinkhorn_names_a_bad_generator_schedule_or_noise_scale():
    """generator='cpu' failed inside torch.rand ('rand() received an invalid combination of arguments'); the function
    now checks its arguments as the class does."""
    la = torch.randn(1, 3, 3)
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got str"):
        gumbel_sinkhorn(la, generator="cpu")
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        gumbel(la.shape, la, generator=0)
    with pytest.raises(TypeError, match="schedule must be a SinkhornSchedule"):
        gumbel_sinkhorn(la, schedule={"max_iter": 10})
    for bad in ("1", -1.0):
        with pytest.raises(ValueError, match="noise_scale"):
            gumbel_sinkhorn(la, noise_scale=bad)
        with pytest.raises(ValueError, match="noise_scale"):
            GumbelSinkhorn(noise_scale=bad)
