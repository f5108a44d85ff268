"""Error-free differentiable swaps (Kim, Yoon, Cho, ICLR 2024, §3) of the comparator networks (``error_free=True``):
the forward is the hard network exactly (the relaxed network's values drift from the inputs, diffsort issue #7), the
gradient is the relaxed swaps' along the exact trajectory, checked against the authors' per-layer form
X_t = sg(M_hard X_{t-1} − M_t X_{t-1}) + M_t X_{t-1} built here from one-layer relaxed networks (the fused path)."""

from __future__ import annotations

import pytest
import torch

from diffrank.operators import load
from diffrank.operators.networks import Network, build, hard_evaluate
from diffrank.operators.sorting_network import ComparatorNetwork, run_network

FULL = ["diffsort_odd_even", "diffsort_bitonic", "difftopk_bitonic"]


def _x(B, n, seed=0, dtype=torch.float64):
    return torch.randn(B, n, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _hard_p(x):
    order = x.argsort(dim=1, descending=True)
    return torch.zeros(*x.shape, x.shape[1], dtype=x.dtype).scatter_(2, order.unsqueeze(-1), 1.0)


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize("n", [2, 5, 8, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_is_the_hard_sort(name, n, dtype):
    x = _x(3, n, seed=n, dtype=dtype) * 5
    op = load(name, error_free=True)
    relaxed = load(name).soft_sort(x)
    want = torch.sort(x, dim=1, descending=True).values
    torch.testing.assert_close(op.soft_sort(x), want, atol=1e-6, rtol=0)
    assert (relaxed - want).abs().max() > 1e-3  # the relaxed network drifts: the test can fail
    torch.testing.assert_close(op(x), _hard_p(x), atol=1e-6, rtol=0)
    torch.testing.assert_close(op(x, k=2), _hard_p(x)[:, :2], atol=1e-6, rtol=0)
    ranks = x.argsort(1, descending=True).argsort(1).to(dtype) + 1
    torch.testing.assert_close(op.soft_rank(x), ranks, atol=1e-6, rtol=0)
    torch.testing.assert_close(op.topk_membership(x, [1, 3 if n >= 3 else 2])[:, 0], (ranks <= 1).to(dtype))


def test_splitter_top_k_is_exact():
    x = _x(3, 20, seed=3)
    op = load("difftopk_splitter", error_free=True)
    ranks = x.argsort(1, descending=True).argsort(1) + 1
    torch.testing.assert_close(op.topk_membership(x, [1, 5]), torch.stack([(ranks <= k).double() for k in (1, 5)], 1))


def _authors_form(net: Network, x: torch.Tensor, beta: float, sigmoid: str):
    """Values and P of the error-free network, layer by layer as the authors write it: the exact swap forward, the
    gradient of the relaxed one-layer network (fused path, :func:`run_network`) at the exact inputs."""
    B, n = x.shape
    p = torch.eye(n, dtype=x.dtype).expand(B, n, n)
    for layer in net.layers:
        one = Network(net.kind, n, n, (layer,))
        x_hard = hard_evaluate(one, x.detach())
        x_soft = run_network(one, x, beta, sigmoid, 0.25, "values")
        m = run_network(one, x, beta, sigmoid, 0.25, "full")  # M_t at the exact inputs x_{t-1}
        p_soft = m @ p
        p = (torch.where(m.detach() > 0.5, 1.0, 0.0).to(x.dtype) @ p).detach() + (p_soft - p_soft.detach())
        x = x_hard.detach() + (x_soft - x_soft.detach())
    perm = net.out_perm_tensor(x.device)
    return (x, p) if perm is None else (x[:, perm], p[:, perm])


@pytest.mark.parametrize("network", ["odd_even", "bitonic"])
@pytest.mark.parametrize("sigmoid", ["cauchy", "logistic"])
@pytest.mark.parametrize("n", [2, 6, 8])
def test_gradient_is_the_relaxed_swaps_along_the_exact_path(network, sigmoid, n):
    x = _x(2, n, seed=1).requires_grad_()
    op = ComparatorNetwork(beta=2.0, sigmoid=sigmoid, network=network, error_free=True)
    want_values, want_p = _authors_form(build(network, n), x, 2.0, sigmoid)
    wv = torch.randn(2, n, dtype=x.dtype, generator=torch.Generator().manual_seed(4))
    wp = torch.randn(2, n, n, dtype=x.dtype, generator=torch.Generator().manual_seed(5))
    (gv,) = torch.autograd.grad((op.soft_sort(x) * wv).sum(), x)
    (gv_want,) = torch.autograd.grad((want_values * wv).sum(), x, retain_graph=True)  # want_p shares the graph
    torch.testing.assert_close(gv, gv_want)
    (gp,) = torch.autograd.grad((op(x) * wp).sum(), x)
    (gp_want,) = torch.autograd.grad((want_p * wp).sum(), x)
    torch.testing.assert_close(gp, gp_want)
    assert gv.abs().sum() > 0 and gp.abs().sum() > 0
    relaxed = ComparatorNetwork(beta=2.0, sigmoid=sigmoid, network=network)
    (gv_relaxed,) = torch.autograd.grad((relaxed.soft_sort(x) * wv).sum(), x)
    (gp_relaxed,) = torch.autograd.grad((relaxed(x) * wp).sum(), x)
    if n == 2:  # one comparator: its inputs are the scores, so the gradient is the relaxed network's
        torch.testing.assert_close(gv, gv_relaxed)
        torch.testing.assert_close(gp, gp_relaxed)
    else:  # deeper: the relaxed network evaluates its later swaps at drifted values, the error-free one at exact ones
        assert not torch.allclose(gv, gv_relaxed)


def test_second_derivatives_and_options():
    x = _x(2, 5).requires_grad_()
    op = ComparatorNetwork(beta=2.0, error_free=True)
    # a double backward runs (plain autograd ops); it differentiates the surrogate gradient with the hard trajectory
    # held fixed, so it is no finite-difference derivative of the first one (no gradgradcheck)
    (g,) = torch.autograd.grad((op.soft_sort(x) * torch.arange(5.0, dtype=x.dtype)).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.square().sum(), x)
    assert torch.isfinite(h).all()
    assert "error_free='swaps'" in repr(op)
    with pytest.raises(ValueError, match="error_free"):
        ComparatorNetwork(error_free="yes")
    beta = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    out = ComparatorNetwork(beta=beta, error_free=True).soft_sort(x)
    torch.testing.assert_close(out, x.sort(1, descending=True).values)
    (gb,) = torch.autograd.grad((out * torch.arange(5.0, dtype=x.dtype)).sum(), beta)
    assert torch.isfinite(gb) and gb != 0


@pytest.mark.parametrize("name", FULL + ["difftopk_splitter"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_form_is_the_hard_result_with_the_relaxed_networks_gradient(name, dtype):
    """``error_free="output"``: the forward equals torch.sort (values, P, ranks, membership) and every gradient is
    the relaxed network's own, bit for bit (one straight-through over the whole network)."""
    x = _x(3, 9, seed=7, dtype=dtype) * 5
    op, relaxed = load(name, error_free="output"), load(name)
    ranks = x.argsort(1, descending=True).argsort(1).to(dtype) + 1
    calls = [("topk_membership", lambda o, s: o.topk_membership(s, [1, 3]),
              torch.stack([(ranks <= k).to(dtype) for k in (1, 3)], 1))]
    if name != "difftopk_splitter":
        calls += [("soft_sort", lambda o, s: o.soft_sort(s), torch.sort(x, dim=1, descending=True).values),
                  ("P", lambda o, s: o(s), _hard_p(x)), ("soft_rank", lambda o, s: o.soft_rank(s), ranks)]
    for what, f, want in calls:
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, soft = f(op, a), f(relaxed, b)
        torch.testing.assert_close(out, want, atol=1e-6, rtol=0, msg=what)
        w = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(2))
        (out * w).sum().backward()
        (soft * w).sum().backward()
        assert torch.equal(a.grad, b.grad), what


def test_error_free_true_is_the_per_swap_form():
    assert load("diffsort_bitonic", error_free=True).error_free == "swaps"
