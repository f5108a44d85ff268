"""The PyTorch Sinkhorn's memory-light backward (:mod:`diffrank.operators.log_sinkhorn`, ``_RecomputedSinkhorn``):
the gradient it gives is autograd's through the unrolled iterations (SinkhornSort, Gumbel-Sinkhorn, learnable
β / τ, log masses, converged or stopped early), what it saves does not grow with the iterations, a double backward
is still exact, a forward that misses its tolerance still warns, and SOFT top-k (which runs the loop under its own
implicit backward) saves nothing per iteration either."""

from __future__ import annotations

import math

import pytest
import torch

import diffrank.operators.log_sinkhorn as ls
from diffrank.operators.gumbel_sinkhorn import gumbel_sinkhorn
from diffrank.operators.log_sinkhorn import SinkhornSchedule, log_sinkhorn
from diffrank.operators.sinkhorn import SinkhornSort
from diffrank.operators.soft_topk import SoftTopK


@pytest.fixture(autouse=True)
def recompute_small_problems(monkeypatch):
    """The recomputing backward at the small sizes of these tests (by default it starts where the unrolled graph could
    exceed 1 GiB or a plan has 2^20 entries: test_the_size_rule)."""
    monkeypatch.setattr(ls, "UNROLLED_MAX_BYTES", 0)


def test_the_size_rule(monkeypatch):
    monkeypatch.setattr(ls, "UNROLLED_MAX_BYTES", 1 << 30)
    small, large = torch.zeros(100, 16, 16), torch.zeros(16, 500, 500)
    assert not ls._unrolled_too_large(small, 2000)  # 4 x 100 KiB x 2000 < 1 GiB: the faster unrolled loop
    assert ls._unrolled_too_large(small, 20_000) and ls._unrolled_too_large(large, 20)


@pytest.fixture
def unrolled(monkeypatch):
    """A context in which log_sinkhorn differentiates the unrolled loop (the reference), and the count of calls
    that took the memory-light Function outside it."""
    calls = {"light": 0}
    real = ls._recomputes

    def counting(*inputs):
        light = real(*inputs)
        calls["light"] += light
        return light

    monkeypatch.setattr(ls, "_recomputes", counting)

    class Unrolled:
        def __enter__(self):
            monkeypatch.setattr(ls, "_recomputes", lambda *inputs: False)

        def __exit__(self, *exc):
            monkeypatch.setattr(ls, "_recomputes", counting)

    return Unrolled(), calls


def _grads(fn, inputs, seed=3):
    """``fn(*inputs)`` and the gradient of a fixed random projection of it with respect to ``inputs``."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    # materialised: ε left unused (an early stop inside the ε-scaling) has gradient 0 in both backwards
    return out.detach(), torch.autograd.grad((out * w).sum(), inputs, allow_unused=True, materialize_grads=True)


def _assert_same(light, reference, tol=1e-9):
    (out, grads), (out_ref, grads_ref) = light, reference
    torch.testing.assert_close(out, out_ref, rtol=tol, atol=tol)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=tol, atol=tol)


CONVERGED = dict(tolerance=1e-9, max_iter=20_000, check_every=5)
EARLY = dict(tolerance=None, max_iter=7)  # stopped far from the fixed point: the gradient is still the loop's


@pytest.mark.filterwarnings("error::RuntimeWarning")  # "converged" means it: the forward reaches its tolerance
@pytest.mark.parametrize("beta", [3.0, 30.0, 100.0])
@pytest.mark.parametrize("n", [8, 17])
@pytest.mark.parametrize("stop", [CONVERGED, EARLY], ids=["converged", "early"])
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed_beta", "learnable_beta"])
def test_sinkhorn_sort_gradient_is_unrolled_autograds(unrolled, beta, n, stop, learnable):
    context, calls = unrolled
    scores = torch.randn(3, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    b = torch.tensor(beta, dtype=torch.float64)

    def fn(s, b):
        return SinkhornSort(beta=b if learnable else beta, **stop)(s)

    light = _grads(fn, [scores, b]) if learnable else _grads(lambda s: fn(s, b), [scores])
    assert calls["light"] >= 1
    with context:
        reference = _grads(fn, [scores, b]) if learnable else _grads(lambda s: fn(s, b), [scores])
    _assert_same(light, reference)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("tau", [0.1, 0.5])
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed_tau", "learnable_tau"])
def test_gumbel_sinkhorn_gradient_is_unrolled_autograds(unrolled, tau, learnable):
    context, calls = unrolled
    log_alpha = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    t = torch.tensor(tau, dtype=torch.float64)
    schedule = SinkhornSchedule(max_iter=5000, tolerance=1e-10, epsilon_start=None)

    def fn(x, t=t):
        return gumbel_sinkhorn(x, t if learnable else tau, generator=torch.Generator().manual_seed(2),
                               schedule=schedule)

    inputs = [log_alpha, t] if learnable else [log_alpha]
    light = _grads(fn, inputs)
    assert calls["light"] == 1
    with context:
        reference = _grads(fn, inputs)
    _assert_same(light, reference)


def test_masked_entries_get_zero_gradient_as_in_the_unrolled_loop(unrolled):
    """A −inf log-kernel entry (a forbidden assignment) has weight 0 and gradient 0 in both backwards."""
    context, _ = unrolled
    log_alpha = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    log_alpha[:, 0, 1] = -math.inf
    fn = lambda x: gumbel_sinkhorn(x, 0.3, noise=False)  # noqa: E731
    light = _grads(fn, [log_alpha])
    with context:
        reference = _grads(fn, [log_alpha])
    _assert_same(light, reference)
    assert light[1][0][:, 0, 1].eq(0).all() and light[1][0].isfinite().all()


@pytest.mark.parametrize("cost_scale", [None, 1.0], ids=["per_row_scale", "known_scale"])
@pytest.mark.parametrize("stop", [CONVERGED, EARLY], ids=["converged", "early"])
def test_log_sinkhorn_gradients_of_cost_masses_and_epsilon_are_unrolled_autograds(unrolled, cost_scale, stop):
    """Every differentiable input at once: C, log μ (per row), log ν (shared), a learnable ε, with the ε-scaling
    start per row (the rows' largest cost) or known."""
    context, calls = unrolled
    g = torch.Generator().manual_seed(5)
    cost = torch.rand(3, 7, 4, generator=g, dtype=torch.float64)
    log_mu = torch.log_softmax(torch.randn(3, 7, generator=g, dtype=torch.float64), -1)
    log_nu = torch.log_softmax(torch.randn(1, 4, generator=g, dtype=torch.float64), -1)
    eps = torch.tensor(0.03, dtype=torch.float64)
    schedule = SinkhornSchedule(epsilon_start=1.0, anneal=0.8, **stop)

    def fn(c, lm, ln, e):
        return log_sinkhorn(c, lm, ln, e, schedule, cost_scale)[0]

    light = _grads(fn, [cost, log_mu, log_nu, eps])
    assert calls["light"] == 1
    with context:
        reference = _grads(fn, [cost, log_mu, log_nu, eps])
    _assert_same(light, reference)


def _saved_bytes(fn) -> tuple[int, int]:
    """Bytes and number of the tensors that autograd saves for the backward of ``fn()`` (forward only)."""
    total = [0, 0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        total[1] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0], total[1]


def test_saved_tensors_do_not_grow_with_the_iterations(unrolled):
    """20 and 200 iterations save the same (B, n, n) tensors; only the snapshots of the potentials (O(√iterations)
    vectors of n) differ. The unrolled loop saves about four (B, n, n) tensors per iteration, which the same
    measure sees."""
    context, _ = unrolled
    B, n = 4, 40
    plan = B * n * n * 8
    scores = torch.randn(B, n, dtype=torch.float64, requires_grad=True)

    def saved(iterations):
        return _saved_bytes(lambda: SinkhornSort(beta=100.0, tolerance=None, max_iter=iterations)(scores))

    (few, count_few), (many, count_many) = saved(20), saved(200)
    assert count_many == count_few
    assert many - few < plan / 2
    assert many < 4 * plan  # the cost, what SinkhornSort saves around the solver, and the snapshots
    with context:
        (few_ref, _), (many_ref, _) = saved(20), saved(200)
    assert many_ref - few_ref > 100 * 3 * plan


def test_soft_topk_sinkhorn_saves_nothing_per_iteration(unrolled):
    """SOFT top-k runs the loop inside its own Function (implicit differentiation of the plan, Xie et al. 2020,
    App. H): the loop runs without grad, never through the recomputing Function, and saves nothing per iteration."""
    _, calls = unrolled
    scores = torch.randn(3, 50, dtype=torch.float64, requires_grad=True)

    def saved(iterations):
        op = SoftTopK(beta=2.0, solver="sinkhorn", tolerance=None, max_iter=iterations, epsilon_start=None)
        return _saved_bytes(lambda: op.topk_membership(scores, [5]))

    assert saved(20) == saved(200)
    assert calls["light"] == 0


def test_the_backward_of_many_iterations_is_the_unrolled_one_in_float32(unrolled):
    """float32, past the scaling, hundreds of iterations in segments between snapshots."""
    context, _ = unrolled
    scores = torch.randn(2, 30, generator=torch.Generator().manual_seed(6))
    fn = lambda s: SinkhornSort(beta=50.0, tolerance=None, max_iter=300)(s)  # noqa: E731
    light = _grads(fn, [scores])
    with context:
        reference = _grads(fn, [scores])
    _assert_same(light, reference, tol=1e-5)


@pytest.mark.slow  # ~12 s each; the default suite's gradgrad cells of tests/test_torch_func.py take this path too
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed_beta", "learnable_beta"])
def test_second_derivatives_stay_exact(unrolled, learnable):
    """A recorded backward (create_graph) differentiates the recomputed iterations: gradgradcheck passes, stopped
    early or not, and its first derivative is the memory-light one."""
    _, calls = unrolled
    scores = torch.randn(2, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    b = torch.tensor(20.0, dtype=torch.float64)
    for stop in (dict(tolerance=None, max_iter=25), dict(tolerance=1e-8, max_iter=5000)):
        def fn(s, b, stop=stop):
            return SinkhornSort(beta=b if learnable else 20.0, **stop).soft_rank(s)

        inputs = [scores.clone().requires_grad_(), b.clone().requires_grad_(learnable)]
        assert torch.autograd.gradgradcheck(fn, inputs)
        out = fn(*inputs)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(8), dtype=out.dtype)
        wanted = [t for t in inputs if t.requires_grad]
        recorded = torch.autograd.grad((out * w).sum(), wanted, create_graph=True)
        light = torch.autograd.grad((fn(*inputs) * w).sum(), wanted)
        for r, g in zip(recorded, light):
            assert r.requires_grad
            torch.testing.assert_close(r.detach(), g, rtol=1e-10, atol=1e-12)
    assert calls["light"] > 0


def test_a_forward_that_misses_its_tolerance_still_warns(unrolled):
    _, calls = unrolled
    scores = torch.randn(4, 6, generator=torch.Generator().manual_seed(9), requires_grad=True)
    with pytest.warns(RuntimeWarning, match="did not converge.*after 3 iterations"):
        p = SinkhornSort(beta=100.0, max_iter=3, epsilon_start=None, check_every=1)(scores)
    p.sum().backward()
    assert calls["light"] == 1 and scores.grad.isfinite().all()
    log_alpha = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(9), requires_grad=True)
    with pytest.warns(RuntimeWarning, match="gumbel_sinkhorn did not converge"):
        gumbel_sinkhorn(log_alpha, 0.01, noise=False, schedule=SinkhornSchedule(max_iter=2, tolerance=1e-6))
    assert calls["light"] == 2


def test_without_a_gradient_to_record_the_loop_runs_alone(unrolled):
    """No input requires grad, or grad mode is off: the plain loop (nothing to save), same values."""
    _, calls = unrolled
    scores = torch.randn(3, 8, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    op = SinkhornSort(beta=30.0)
    plain = op(scores)
    with torch.no_grad():
        off = op(scores.clone().requires_grad_())
    assert calls["light"] == 0
    torch.testing.assert_close(op(scores.clone().requires_grad_()).detach(), plain, rtol=0, atol=0)
    torch.testing.assert_close(off, plain, rtol=0, atol=0)
