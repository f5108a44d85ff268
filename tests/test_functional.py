"""diffrank.functional: torch's conventions (ascending, any dim) over the operators' (rows = ranks, rank 1 =
largest, (B, n) scores), for every operator config and every function its capabilities allow."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

import diffrank.functional as F
from diffrank.operators import available
from diffrank.operators.base import PERMUTATION, SOFT_RANK, SOFT_SORT, TOPK_MEMBERSHIP, RankingOperator
from diffrank.operators.fast_soft_sort import FastSoftSort
from diffrank.operators.lapsum import LapSum
from diffrank.operators.neuralsort import NeuralSort
from helpers import load_deterministic as load  # stochastic operators without noise (helpers)

F64 = torch.float64
NAMES = available()
CAPS = {name: load(name).capabilities for name in NAMES}
FUNCTIONS = {SOFT_SORT: "soft_sort", SOFT_RANK: "soft_rank", TOPK_MEMBERSHIP: "topk_membership",
             PERMUTATION: "permutation_matrix"}
CASES = [pytest.param(name, cap, id=f"{name}-{FUNCTIONS[cap]}") for name in NAMES for cap in FUNCTIONS
         if cap in CAPS[name]]
K = 2


def _rand(*shape, seed=0):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _untied(B, n, seed=0):
    """Scores at least ~0.45 apart in every row (a random order of 0.5 · (0..n-1) plus a jitter below 0.05)."""
    g = torch.Generator().manual_seed(seed)
    perms = torch.stack([torch.randperm(n, generator=g) for _ in range(B)]).to(F64)
    return (perms + torch.rand(B, n, generator=g, dtype=F64) * 0.1) * 0.5


def _functional(cap, x, method, **kw):
    """The functional call of a capability (top-k with k = 2, permutation with all rows), β = 1 unless given."""
    if not isinstance(method, RankingOperator):
        kw.setdefault("beta", 1.0)
    if cap == SOFT_SORT:
        return F.soft_sort(x, method=method, **kw)
    if cap == SOFT_RANK:
        return F.soft_rank(x, method=method, **kw)
    if cap == TOPK_MEMBERSHIP:
        kw.pop("descending", None)
        return F.topk_membership(x, K, method=method, **kw)
    kw.pop("descending", None)
    return F.permutation_matrix(x, method=method, **kw)


def _operator_result(cap, op, rows):
    """The operator method on ``(B, n)`` rows in its own convention (descending, rank 1 = largest)."""
    if cap == SOFT_SORT:
        return op.soft_sort(rows)
    if cap == SOFT_RANK:
        return op.soft_rank(rows)
    if cap == TOPK_MEMBERSHIP:
        return op.topk_membership(rows, [K])[:, 0]
    return op(rows)


def _ascending(cap, desc):
    """What the ascending functional result must be, from the operator's descending one."""
    n = desc.shape[-1]
    return {SOFT_SORT: lambda: desc.flip(-1), SOFT_RANK: lambda: n + 1 - desc}.get(cap, lambda: desc)()


def _exact_ranks(x, dim=-1):
    return x.argsort(dim=dim).argsort(dim=dim).to(x.dtype) + 1


# 1. shapes, backward, and the map onto the operator convention ------------------------------------------------
@pytest.mark.parametrize("name,cap", CASES)
def test_shapes_and_backward(name, cap):
    n = 5
    for shape, dim in (((n,), -1), ((n,), 0), ((2, 3, n), -1), ((n, 2, 3), 0), ((2, n, 3), 1)):
        x = _rand(*shape, seed=len(shape) + dim).requires_grad_()
        out = _functional(cap, x, name, dim=dim)
        batch = tuple(s for i, s in enumerate(shape) if i != dim % len(shape))
        expect = (*batch, n, n) if cap == PERMUTATION else shape
        assert out.shape == expect and out.dtype == F64, (shape, dim)
        w = _rand(*out.shape, seed=7)
        (grad,) = torch.autograd.grad((out * w).sum(), x)
        assert grad.shape == shape and torch.isfinite(grad).all()
        assert grad.abs().max() > 0, (shape, dim)
    if cap == PERMUTATION:
        assert F.permutation_matrix(_rand(2, n, 3), method=name, k=K, dim=1).shape == (2, 3, K, n)


@pytest.mark.parametrize("name,cap", CASES)
def test_descending_is_the_operator_convention(name, cap):
    """descending=True (or the top-k / P functions) = the operator method on the (B, n) view; ascending =
    flip (sort) or n + 1 - rank; the same along another dim and for more leading dims."""
    op = load(name, beta=1.0)
    x = _rand(4, 6, seed=1)
    desc = _operator_result(cap, op, x)
    for descending, want in ((True, desc), (False, _ascending(cap, desc))):
        torch.testing.assert_close(_functional(cap, x, name, descending=descending), want, rtol=0, atol=0)
        got_t = _functional(cap, x.T, name, dim=0, descending=descending)  # items along dim 0 of (n, B)
        torch.testing.assert_close(got_t, want if cap == PERMUTATION else want.T, rtol=0, atol=0)
        # (2, n, 2) along dim 1: the batch is the other dims in order, i.e. rows x3[a, :, c] at a * 2 + c
        x3 = x.reshape(2, 2, 6).permute(0, 2, 1)
        got3 = _functional(cap, x3, name, dim=1, descending=descending)
        if cap == PERMUTATION:
            torch.testing.assert_close(got3, want.reshape(2, 2, 6, 6), rtol=0, atol=0)
        else:
            torch.testing.assert_close(got3, want.reshape(2, 2, 6).permute(0, 2, 1), rtol=0, atol=0)
    v = x[0]  # 1-D input: one set
    torch.testing.assert_close(_functional(cap, v, name, descending=True), _operator_result(cap, op, v[None])[0],
                               rtol=0, atol=0)


@pytest.mark.parametrize("name", [n for n in NAMES if SOFT_RANK in CAPS[n] and SOFT_SORT in CAPS[n]])
def test_ascending_mirrors_descending(name):
    x = _rand(3, 6, seed=2)
    for dim in (0, 1):
        r_asc = F.soft_rank(x, method=name, dim=dim)
        r_desc = F.soft_rank(x, method=name, dim=dim, descending=True)
        torch.testing.assert_close(r_asc, x.shape[dim] + 1 - r_desc, rtol=0, atol=0)
        s_asc = F.soft_sort(x, method=name, dim=dim)
        torch.testing.assert_close(s_asc, F.soft_sort(x, method=name, dim=dim, descending=True).flip(dim), rtol=0,
                                   atol=0)


# 2. hard limit ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in NAMES if SOFT_RANK in CAPS[n] or SOFT_SORT in CAPS[n]])
def test_hard_limit(name):
    beta = load(name).hard_beta
    x = _untied(2, 6, seed=3).reshape(1, 2, 6).permute(0, 2, 1)  # items along dim 1
    if SOFT_RANK in CAPS[name]:
        torch.testing.assert_close(F.soft_rank(x, method=name, beta=beta, dim=1), _exact_ranks(x, dim=1), atol=1e-2,
                                   rtol=0)
        desc = _exact_ranks(-x, dim=1)
        torch.testing.assert_close(F.soft_rank(x, method=name, beta=beta, dim=1, descending=True), desc, atol=1e-2,
                                   rtol=0)
    if SOFT_SORT in CAPS[name]:
        torch.testing.assert_close(F.soft_sort(x, method=name, beta=beta, dim=1), x.sort(dim=1).values, atol=1e-3,
                                   rtol=0)


@pytest.mark.parametrize("name", [n for n in NAMES if TOPK_MEMBERSHIP in CAPS[n]])
def test_topk_hard_limit(name):
    x = _untied(2, 7, seed=4)
    hard = torch.zeros_like(x).scatter_(1, x.topk(3, dim=1).indices, 1.0)
    got = F.topk_membership(x.T, 3, method=name, beta=load(name).hard_beta, dim=0)
    torch.testing.assert_close(got, hard.T, atol=1e-3, rtol=0)


# 3. straight-through ----------------------------------------------------------------------------------------
TIES = torch.tensor([[1.0, 3.0, 1.0, 2.0, 3.0], [0.5, -1.0, 2.0, 0.5, 0.0]], dtype=F64)


@pytest.mark.parametrize("name", ["neuralsort", "lapsum", "diffsort_odd_even", "fast_soft_sort", "soft_topk"])
def test_hard_forward_is_exact_and_gradient_is_soft(name):
    caps = CAPS[name]
    x = TIES.T.clone()  # items along dim 0, with ties: torch.sort(stable=True) breaks them by index
    w = _rand(5, 2, seed=5)
    expect = {
        (SOFT_SORT, False): TIES.sort(dim=1).values.T,
        (SOFT_SORT, True): TIES.sort(dim=1, descending=True).values.T,
        (SOFT_RANK, False): torch.tensor([[1.0, 4, 2, 3, 5], [3, 1, 5, 4, 2]], dtype=F64).T,
        (SOFT_RANK, True): torch.tensor([[4.0, 1, 5, 3, 2], [2, 5, 1, 3, 4]], dtype=F64).T,
        (TOPK_MEMBERSHIP, None): torch.tensor([[0.0, 1, 0, 0, 1], [1, 0, 1, 0, 0]], dtype=F64).T,
    }
    for (cap, descending), want in expect.items():
        if cap not in caps:
            continue
        kw = {} if descending is None else {"descending": descending}
        xh, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
        fn = getattr(F, FUNCTIONS[cap])
        args = (K,) if cap == TOPK_MEMBERSHIP else ()
        out_h = fn(xh, *args, method=name, dim=0, hard=True, **kw)
        out_s = fn(xs, *args, method=name, dim=0, **kw)
        assert torch.equal(out_h, want), (cap, descending)
        (gh,) = torch.autograd.grad((out_h * w).sum(), xh)
        (gs,) = torch.autograd.grad((out_s * w).sum(), xs)
        assert gs.abs().max() > 0
        torch.testing.assert_close(gh, gs, rtol=0, atol=0)
    if PERMUTATION in caps:
        xh, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
        p_h = F.permutation_matrix(xh, method=name, dim=0, k=3, hard=True)
        p_s = F.permutation_matrix(xs, method=name, dim=0, k=3)
        order = torch.tensor([[1, 4, 3], [2, 0, 3]])  # stable descending sort of each set
        assert torch.equal(p_h, torch.zeros(2, 3, 5, dtype=F64).scatter_(2, order.unsqueeze(-1), 1.0))
        wp = _rand(2, 3, 5, seed=6)
        (gh,) = torch.autograd.grad((p_h * wp).sum(), xh)
        (gs,) = torch.autograd.grad((p_s * wp).sum(), xs)
        torch.testing.assert_close(gh, gs, rtol=0, atol=0)


def test_hard_topk_with_tensor_k_per_set():
    x = TIES.clone().requires_grad_()
    k = torch.tensor([1.0, 3.0])
    out = F.topk_membership(x, k, method="lapsum", hard=True)
    assert torch.equal(out, torch.tensor([[0.0, 1, 0, 0, 0], [1, 0, 1, 1, 0]], dtype=F64))
    with pytest.raises(ValueError, match="whole-number k"):
        F.topk_membership(x, 2.5, method="lapsum", hard=True)


# 4. conservation --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in NAMES if TOPK_MEMBERSHIP in CAPS[n] and load(n).sums_to_k])
def test_topk_membership_sums_to_k(name):
    x = _rand(2, 6, 3, seed=8)
    for k in (1, 3):
        torch.testing.assert_close(F.topk_membership(x, k, method=name, dim=1).sum(1),
                                   torch.full((2, 3), float(k), dtype=F64), atol=1e-6, rtol=0)


def test_lapsum_real_k():
    x = _rand(2, 6, 3, seed=9)
    p = F.topk_membership(x, 2.5, method="lapsum", beta=1.5, dim=1)
    torch.testing.assert_close(p.sum(1), torch.full((2, 3), 2.5, dtype=F64), atol=1e-12, rtol=0)
    # one k per set (a tensor of the batch shape), with a gradient for k
    k = torch.tensor([[0.5, 2.5, 5.5], [1.0, 3.3, 4.9]], dtype=F64, requires_grad=True)
    p = F.topk_membership(x, k, method="lapsum", beta=1.5, dim=1)
    torch.testing.assert_close(p.sum(1), k.detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(p[:, :, 1], LapSum(1.5).topk_membership(x[:, :, 1], k[:, 1:2])[:, 0])
    (gk,) = torch.autograd.grad(p.sum(), k)
    torch.testing.assert_close(gk, torch.ones_like(gk), atol=1e-10, rtol=0)  # Σ_j p_j = k
    # a 0-dim k tensor is one k for every set
    torch.testing.assert_close(F.topk_membership(x, torch.tensor(2.5), method="lapsum", beta=1.5, dim=1),
                               F.topk_membership(x, 2.5, method="lapsum", beta=1.5, dim=1))


@pytest.mark.parametrize("name", [n for n in NAMES if PERMUTATION in CAPS[n]])
def test_permutation_rows_sum_to_one(name):
    x = _rand(2, 5, 2, seed=10)
    for k in (None, 3):
        p = F.permutation_matrix(x, method=name, k=k, dim=1)
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1], dtype=F64), atol=1e-6, rtol=0)


# 5. fast soft sort against torchsort and a tiny reference ---------------------------------------------------
def _increasing_isotonic(y):
    """Pool adjacent violators: argmin_{v_1 <= ... <= v_n} ‖v - y‖² (y a list of floats)."""
    blocks = []  # [sum, count]
    for value in y:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return [s / c for s, c in blocks for _ in range(c)]


def _reference_rank_l2(theta, eps):
    """Ascending l2 soft rank (Blondel et al. 2020, Prop. 3): the projection of θ/ε onto the permutahedron
    of (1, ..., n) = z_sorted - iso(z_sorted - (1..n)), unsorted."""
    z = theta / eps
    zs, order = z.sort()
    v = torch.tensor(_increasing_isotonic((zs - torch.arange(1, len(z) + 1, dtype=F64)).tolist()), dtype=F64)
    return torch.empty_like(z).scatter_(0, order, zs - v)


def _reference_sort_l2(theta, eps):
    """Ascending l2 soft sort: the projection of (1..n)/ε onto the permutahedron of θ = w - iso(w - θ_sorted)."""
    w = torch.arange(1, len(theta) + 1, dtype=F64) / eps
    return w - torch.tensor(_increasing_isotonic((w - theta.sort().values).tolist()), dtype=F64)


def test_fast_soft_sort_matches_torchsort():
    torchsort = pytest.importorskip("torchsort")
    for eps, reg in ((0.3, "l2"), (1.0, "l2"), (3.0, "l2"), (1.0, "kl")):
        x = _rand(3, 8, seed=11) * 2
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        w = _rand(3, 8, seed=12)
        if reg == "l2":  # ascending = torchsort's own (ascending) functions
            pairs = ((F.soft_rank(a, method="fast_soft_sort", beta=1 / eps), torchsort.soft_rank(b, "l2", eps)),
                     (F.soft_sort(a, method="fast_soft_sort", beta=1 / eps), torchsort.soft_sort(b, "l2", eps)))
        else:  # descending = torchsort on -x, for either regularisation
            pairs = ((F.soft_rank(a, method="fast_soft_sort", beta=1 / eps, regularization=reg, descending=True),
                      torchsort.soft_rank(-b, reg, eps)),)
        for ours, ref in pairs:
            torch.testing.assert_close(ours, ref, atol=1e-10, rtol=1e-10)
            (ga,) = torch.autograd.grad((ours * w).sum(), a)
            (gb,) = torch.autograd.grad((ref * w).sum(), b)
            torch.testing.assert_close(ga, gb, atol=1e-10, rtol=1e-10)


def test_fast_soft_sort_against_reference():
    s = torch.tensor([0.5, -1.2, 2.0, 0.3, 1.1], dtype=F64)
    asc = torch.tensor([2.96, 1.26, 4.46, 2.76, 3.56], dtype=F64)  # = 6 - [3.04, 4.74, 1.54, 3.24, 2.44]
    torch.testing.assert_close(F.soft_rank(s, method="fast_soft_sort"), asc)
    torch.testing.assert_close(F.soft_rank(s, method="fast_soft_sort", descending=True), 6 - asc)
    torch.testing.assert_close(_reference_rank_l2(s, 1.0), asc)
    torch.testing.assert_close(F.soft_sort(s, method="fast_soft_sort", beta=0.1),
                               torch.tensor([0.34, 0.44, 0.54, 0.64, 0.74], dtype=F64))
    x = _rand(4, 7, seed=13) * 2
    for eps in (0.05, 0.5, 2.0, 20.0):
        got_r = F.soft_rank(x, method="fast_soft_sort", beta=1 / eps)
        got_s = F.soft_sort(x, method="fast_soft_sort", beta=1 / eps)
        for b in range(4):
            torch.testing.assert_close(got_r[b], _reference_rank_l2(x[b], eps), atol=1e-10, rtol=0)
            torch.testing.assert_close(got_s[b], _reference_sort_l2(x[b], eps), atol=1e-10, rtol=0)
    for reg in ("l2", "kl"):  # ε → 0: the exact ranks and sorted values
        torch.testing.assert_close(F.soft_rank(x, method="fast_soft_sort", beta=1e4, regularization=reg),
                                   _exact_ranks(x))
        torch.testing.assert_close(F.soft_sort(x, method="fast_soft_sort", beta=1e4, regularization=reg),
                                   x.sort().values)
    # the regularization option reaches the operator
    torch.testing.assert_close(F.soft_rank(x, method="fast_soft_sort", beta=2.0, regularization="kl", descending=True),
                               FastSoftSort.with_strength(0.5, "kl").soft_rank(x), rtol=0, atol=0)


# 6. gradcheck -----------------------------------------------------------------------------------------------
def test_gradcheck_neuralsort_dim1():
    x = _rand(2, 5, 3, seed=14).requires_grad_()
    op = NeuralSort(beta=0.7)
    assert gradcheck(lambda t: F.soft_rank(t, method=op, dim=1), (x,))
    assert gradcheck(lambda t: F.soft_rank(t, method="neuralsort", beta=0.7, dim=1, descending=True), (x,))
    assert gradcheck(lambda t: F.topk_membership(t, 2, method=op, dim=1), (x,))
    assert gradcheck(lambda t: F.soft_sort(t, method=op, dim=1), (x,))
    assert gradcheck(lambda t: F.permutation_matrix(t, method=op, k=2, dim=1), (x,))
    k = torch.tensor([[1.5, 2.0, 4.5], [0.5, 3.0, 2.2]], dtype=F64, requires_grad=True)
    assert gradcheck(lambda t, kk: F.topk_membership(t, kk, method="lapsum", beta=1.3, dim=1), (x, k))


# 7. errors, options and the operator cache ------------------------------------------------------------------
def test_bad_input():
    x = _rand(2, 5)
    with pytest.raises(ValueError, match="at least one dimension"):
        F.soft_rank(torch.tensor(1.0), method="neuralsort")
    with pytest.raises(ValueError, match="at least one item"):
        F.soft_sort(torch.zeros(3, 0), method="neuralsort")
    with pytest.raises(TypeError, match="floating point"):
        F.soft_rank(torch.arange(5), method="neuralsort")
    with pytest.raises(TypeError, match="torch.Tensor"):
        F.soft_rank([1.0, 2.0], method="neuralsort")
    with pytest.raises(IndexError, match="out of range"):
        F.soft_rank(x, method="neuralsort", dim=2)
    with pytest.raises(ValueError, match="unknown operator 'nosuch'"):
        F.soft_rank(x, method="nosuch")
    with pytest.raises(TypeError, match="operator name"):
        F.soft_rank(x, method=3)
    with pytest.raises(ValueError, match="beta must not be given"):
        F.soft_rank(x, method=NeuralSort(), beta=2.0)
    with pytest.raises(ValueError, match="beta must not be given"):
        F.soft_rank(x, method=NeuralSort(), beta=1.0)
    with pytest.raises(ValueError, match="backend must not be given"):
        F.soft_rank(x, method=NeuralSort(), backend="torch")
    with pytest.raises(ValueError, match="beta"):
        F.soft_rank(x, method="neuralsort", beta=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        F.soft_rank(torch.tensor([1.0, float("nan")]), method="neuralsort")
    with pytest.raises(ValueError, match="provides only"):
        F.permutation_matrix(x, method="fast_soft_sort")
    with pytest.raises(ValueError, match="provides only"):
        F.topk_membership(x, 2, method="fast_soft_sort")
    with pytest.raises(ValueError, match="provides only"):
        F.soft_rank(x, method="soft_topk")
    with pytest.raises(TypeError, match="integer"):
        F.topk_membership(x, 2.5, method="neuralsort")
    with pytest.raises(ValueError, match="k must satisfy"):
        F.topk_membership(x, 6, method="neuralsort")
    with pytest.raises(ValueError, match="k must satisfy"):
        F.topk_membership(x, 5.5, method="lapsum")
    with pytest.raises(ValueError, match="shape"):
        F.topk_membership(x, torch.ones(3), method="lapsum")


def test_options_and_cache():
    x = _rand(3, 6, seed=15)
    op = load("diffsort_odd_even", beta=3.0, sigmoid="logistic")
    torch.testing.assert_close(F.soft_rank(x, method="diffsort_odd_even", beta=3.0, sigmoid="logistic",
                                           descending=True), op.soft_rank(x), rtol=0, atol=0)
    assert not torch.allclose(F.soft_rank(x, method="diffsort_odd_even", beta=3.0), F.soft_rank(
        x, method="diffsort_odd_even", beta=3.0, sigmoid="logistic"))
    a = F._operator("neuralsort", 2.0, {})
    assert a is F._operator("neuralsort", 2.0, {}) and a.beta == 2.0
    assert F._operator("neuralsort", 3.0, {}) is not a
    assert F._operator("lapsum", 2.0, {"backend": "torch"}) is F._operator("lapsum", 2.0, {"backend": "torch"})
    own = NeuralSort(beta=4.0)
    assert F._operator(own, None, {}) is own
    # no beta: the config's (neuralsort.yaml: 0.5)
    torch.testing.assert_close(F.soft_rank(x, method="neuralsort", descending=True),
                               load("neuralsort").soft_rank(x))
    assert F.soft_rank(x.float(), method="neuralsort").dtype == torch.float32


def test_per_row_k_of_a_non_lapsum_method_says_it_is_lapsums():
    """A k per set (a tensor of the batch shape) for NeuralSort said "k must be an integer, got
    tensor([1])"; it now says per-row k is LapSum's (and a real k too), and LapSum takes it."""
    x = _rand(3, 5)
    with pytest.raises(TypeError, match=r"per-row k \(one k per set\) is LapSum's.*NeuralSort"):
        F.topk_membership(x, torch.tensor([1, 2, 3]), method="neuralsort")
    with pytest.raises(TypeError, match=r"real-valued k is LapSum's.*SoftSort"):
        F.topk_membership(x, torch.tensor(2.5, dtype=F64), method="softsort")
    with pytest.raises(TypeError, match=r"got 2.5 \(real-valued k is LapSum's"):
        F.topk_membership(x, 2.5, method="neuralsort")
    out = F.topk_membership(x, torch.tensor([1.0, 2.0, 3.0], dtype=F64), method="lapsum")
    assert torch.allclose(out.sum(-1), torch.tensor([1.0, 2.0, 3.0], dtype=F64))


def test_a_float_dim_is_a_clear_type_error():
    """dim=1.0 raised "tuple indices must be integers or slices, not float"."""
    x = _rand(2, 4)
    for fn in (F.soft_sort, F.soft_rank, F.permutation_matrix):
        with pytest.raises(TypeError, match=r"dim must be an integer .* got 1.0 of type float"):
            fn(x, method="neuralsort", dim=1.0)
    with pytest.raises(TypeError, match="dim must be an integer"):
        F.topk_membership(x, 2, method="neuralsort", dim=1.0)
    import numpy as np

    assert torch.equal(F.soft_rank(x, method="neuralsort", dim=np.int64(1)), F.soft_rank(x, method="neuralsort"))


def test_k_and_dim_forms_that_are_not_what_they_look_like_are_named():
    """A complex k (tensor(2+0j)) was read as the integer 2 and a meta k failed in .item(); dim=True was taken as
    dim 1. Each raises naming the argument; a bool or string β (read by float() as 1 or 2) too."""
    x = _rand(2, 5)
    for method in ("neuralsort", "lapsum"):
        with pytest.raises(TypeError, match="k must be"):
            F.topk_membership(x, torch.tensor(2 + 0j), method=method)
        with pytest.raises(ValueError, match="k is on the meta device"):
            F.topk_membership(x, torch.tensor(2.0, device="meta"), method=method)
    with pytest.raises(ValueError, match="k is on the meta device"):
        F.topk_membership(x, torch.tensor(2, device="meta"), method="neuralsort")
    with pytest.raises(TypeError, match="dim must be an integer .* got True"):
        F.soft_rank(x, method="lapsum", dim=True)
    for beta in ("2", True):
        with pytest.raises(ValueError, match="beta"):
            F.soft_sort(x, method="lapsum", beta=beta)
