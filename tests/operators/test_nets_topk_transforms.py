"""The networks, relaxed bubble sort, SOFT top-k, sparse soft top-k and DFTopK under second derivatives and torch
transforms: exact second derivatives (gradgradcheck in float64) or a clear DoubleBackwardError, torch.func (vmap =
loop, grad / jacrev = autograd), torch.compile with the first call compiled, and a learnable β (gradcheck in β).

vmap runs the operators' hooks (``_permutation``, ``_topk_membership``, ...): the public methods' host-side finite
check (operators/base.py) is tested with the public methods."""

from __future__ import annotations

import pytest
import torch

from diffrank.operators.base import DoubleBackwardError
from diffrank.operators.dftopk import DFTopK
from diffrank.operators.relaxed_bubble_sort import RelaxedBubbleSort
from diffrank.operators.soft_topk import SoftTopK, soft_topk_sorted
from diffrank.operators.sorting_network import ComparatorNetwork
from diffrank.operators.sparse_soft_topk import SparseSoftTopK, sparse_soft_topk_magnitude

SORTERS = {
    "odd_even": lambda: ComparatorNetwork(beta=3.0, network="odd_even"),
    "bitonic_logistic_phi": lambda: ComparatorNetwork(beta=2.0, sigmoid="logistic_phi", network="bitonic"),
    "odd_even_plain": lambda: ComparatorNetwork(beta=3.0, sigmoid="logistic", network="odd_even",
                                                twice_differentiable=True),
    "bubble": lambda: RelaxedBubbleSort(beta=2.0),
}
TOPK = {
    "splitter": lambda: ComparatorNetwork(beta=2.0, sigmoid="optimal", network="splitter_selection"),
    "soft_topk_newton": lambda: SoftTopK(beta=2.0, tolerance=1e-12),
    "soft_topk_sinkhorn": lambda: SoftTopK(beta=2.0, solver="sinkhorn", tolerance=1e-12, max_iter=20000),
    "sparse_pav_4/3": lambda: SparseSoftTopK(beta=2.0),
    "sparse_pav_2": lambda: SparseSoftTopK(beta=2.0, p=2),
    "sparse_dykstra": lambda: SparseSoftTopK(beta=2.0, p=2, solver="dykstra"),
    "dftopk": lambda: DFTopK(beta=2.0),
}
# (operator, capability) -> the public method and the hook (the hook for vmap)
CAPS = {
    "P": (lambda op, x: op(x), lambda op, x: op._permutation(x, None)),
    "P_k": (lambda op, x: op(x, k=2), lambda op, x: op._permutation(x, 2)),
    "topk": (lambda op, x: op.topk_membership(x, [1, 3]), lambda op, x: op._topk_membership(x, [1, 3])),
    "soft_sort": (lambda op, x: op.soft_sort(x), lambda op, x: op._soft_sort(x)),
    "soft_rank": (lambda op, x: op.soft_rank(x), lambda op, x: op._soft_rank(x)),
}
CASES = [(name, cap) for name in SORTERS for cap in CAPS] + [(name, "topk") for name in TOPK]


def _op(name):
    return (SORTERS | TOPK)[name]()


def _x(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,cap", CASES)
def test_gradgradcheck(name, cap):
    op, (public, _) = _op(name), CAPS[cap]
    x = _x(2, 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: public(op, x), (x,))
    assert torch.autograd.gradgradcheck(lambda x: public(op, x), (x,), atol=1e-5)
    assert op.twice_differentiable


@pytest.mark.parametrize("name,cap", CASES)
def test_vmap_grad_jacrev(name, cap):
    op, (public, hook) = _op(name), CAPS[cap]
    xs = _x(3, 2, 6, seed=1)
    torch.testing.assert_close(torch.func.vmap(lambda x: hook(op, x))(xs), torch.stack([hook(op, x) for x in xs]))
    x = xs[0]

    def loss(x):
        return public(op, x).sin().sum()

    leaf = x.clone().requires_grad_()
    loss(leaf).backward()
    torch.testing.assert_close(torch.func.grad(loss)(x), leaf.grad)
    torch.testing.assert_close(torch.func.jacrev(lambda x: public(op, x))(x),
                               torch.autograd.functional.jacobian(lambda x: public(op, x), x))
    # per-sample gradients: the backward mapped too
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(lambda x: hook(op, x).sin().sum()))(xs),
                               torch.stack([torch.func.grad(lambda x: hook(op, x).sin().sum())(x) for x in xs]))


def test_hessian_through_topk_membership_is_not_zero_and_equals_differences():
    """autograd.functional.hessian through sparse soft top-k's topk_membership returned zeros; it equals central
    differences of the gradient."""
    op = SparseSoftTopK(beta=1.0)
    x = _x(1, 6, seed=3)

    def f(x):
        return (op.topk_membership(x, [2]) * torch.arange(6.0, dtype=x.dtype)).sum()

    hess = torch.autograd.functional.hessian(f, x)
    h = 1e-6
    for j in range(6):
        e = torch.zeros_like(x)
        e[0, j] = h
        fd = (torch.func.grad(f)(x + e) - torch.func.grad(f)(x - e)) / (2 * h)
        torch.testing.assert_close(hess[0, :, 0, j], fd[0], atol=1e-5, rtol=1e-5)
    assert hess.abs().max() > 1e-2


def test_soft_topk_sorted_is_twice_differentiable():
    x = _x(2, 6, seed=4).requires_grad_()
    f = lambda x: soft_topk_sorted(x, 3, 2.0, tolerance=1e-12, max_iter=20000)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (x,), atol=1e-5)


def test_sparse_magnitude_p2_exact_and_p43_refuses():
    x = _x(2, 6, seed=5).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: sparse_soft_topk_magnitude(x, 3, 2.0, p=2), (x,))
    f = lambda x: sparse_soft_topk_magnitude(x, 3, 2.0)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    xs = _x(3, 2, 6, seed=6)
    torch.testing.assert_close(torch.func.vmap(f)(xs), torch.stack([f(a) for a in xs]))
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    with pytest.raises(DoubleBackwardError, match=r"sparse_soft_topk_magnitude\(p=4/3\).*use p=2"):
        g.sum().backward()


@pytest.mark.parametrize("make", [
    lambda b: ComparatorNetwork(beta=b, network="odd_even"),
    lambda b: ComparatorNetwork(beta=b, sigmoid="logistic_phi", network="bitonic"),
    lambda b: ComparatorNetwork(beta=b, sigmoid="gaussian", network="splitter_selection"),
    lambda b: RelaxedBubbleSort(beta=b),
    lambda b: DFTopK(beta=b),
    lambda b: SparseSoftTopK(beta=b),
    lambda b: SparseSoftTopK(beta=b, p=2, solver="dykstra"),
])
def test_learnable_beta_gradcheck(make):
    x = _x(2, 6, seed=7)
    beta = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    assert make(beta).learnable_beta
    assert torch.autograd.gradcheck(lambda b: make(b).topk_membership(x, [2, 3]), (beta,))
    loss = make(beta).topk_membership(x, [2]).square().sum()
    loss.backward()
    assert beta.grad is not None and beta.grad != 0


def test_learnable_beta_refused_by_soft_topk():
    with pytest.raises(ValueError, match="SoftTopK cannot learn beta"):
        SoftTopK(beta=torch.tensor(2.0, requires_grad=True))


def test_the_fused_network_and_its_plain_autograd_form_have_the_same_hessian():
    x = _x(2, 5, seed=8)
    fused = ComparatorNetwork(beta=4.0, network="odd_even")
    plain = ComparatorNetwork(beta=4.0, network="odd_even", twice_differentiable=True)
    w = torch.arange(5.0, dtype=torch.float64)
    hf = torch.autograd.functional.hessian(lambda x: (fused.soft_rank(x) * w).sin().sum(), x)
    hp = torch.autograd.functional.hessian(lambda x: (plain.soft_rank(x) * w).sin().sum(), x)
    torch.testing.assert_close(hf, hp)


SLOW = pytest.mark.slow  # a compilation of ~15-40 s each on the CPU
@pytest.mark.parametrize("cap", ["P", "topk", "soft_rank"])
def test_torch_func_hessian_of_the_fused_network_first_call_inside_the_transform(cap):
    """Forward-over-reverse (the jvp rule of the fused Function); the network's cached index tensors are built
    inside the transform on the first call and must not leak its level into the next call."""
    op = ComparatorNetwork(beta=3.0, network="bitonic")
    x = _x(7, seed=10)  # n = 7: a network not built by any other test, so the caches start empty
    hook = CAPS[cap][1]

    def f(x):
        return hook(op, x.unsqueeze(0)).sin().sum()

    torch.testing.assert_close(torch.func.hessian(f)(x), torch.autograd.functional.hessian(f, x))
    torch.testing.assert_close(torch.func.grad(f)(x), torch.autograd.functional.jacobian(f, x))


COMPILED = [pytest.param("odd_even", "soft_sort"), pytest.param("odd_even", "P", marks=SLOW),
            pytest.param("sparse_pav_4/3", "topk", marks=SLOW), pytest.param("soft_topk_newton", "topk", marks=SLOW),
            pytest.param("sparse_dykstra", "topk", marks=SLOW), pytest.param("dftopk", "topk", marks=SLOW),
            pytest.param("bubble", "soft_rank", marks=SLOW)]


@pytest.mark.parametrize("name,cap", COMPILED)
def test_compile_first_call_equals_eager(name, cap):
    torch._dynamo.reset()
    op, (public, _) = _op(name), CAPS[cap]
    x = _x(2, 6, seed=9)
    compiled = torch.compile(lambda x: public(op, x))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = compiled(a)  # the first call is the compiled one
    ref = public(op, b)
    torch.testing.assert_close(out, ref)
    out.sin().sum().backward()
    ref.sin().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("name,cap", [("dftopk", "topk"), pytest.param("bubble", "soft_rank", marks=SLOW)])
def test_fullgraph_compile_of_the_pure_torch_hooks(name, cap):
    """DFTopK and relaxed bubble sort are plain torch ops: their hooks compile as one graph (the public methods'
    host-side check in operators/base.py is left out of the graph)."""
    torch._dynamo.reset()
    op, (_, hook) = _op(name), CAPS[cap]
    x = _x(2, 6, seed=11)
    torch.testing.assert_close(torch.compile(lambda x: hook(op, x), fullgraph=True)(x), hook(op, x))
