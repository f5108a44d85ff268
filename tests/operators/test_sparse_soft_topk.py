"""Sparse soft top-k (Sander et al. 2023) against a float64 reference solve, and DFTopK (Zhu et al. 2025).

The reference solves the same convex problem another way: the KKT conditions of
argmax_{y ∈ C_k} ⟨z, y⟩ - (1/p)‖y‖_p^p give y_i = clip((z_i - τ)_+^{1/(p-1)}, 0, 1) with one scalar τ
fixed by Σ y = k, found by 300 bisection steps (float64). For p = 2 a scipy QP (SLSQP) is a second,
independent check.
"""

from __future__ import annotations

import pytest
import torch

from diffrank.operators import load
from diffrank.operators.dftopk import DFTopK
from diffrank.operators.sparse_soft_topk import (
    SparseSoftTopK,
    isotonic_dykstra,
    sparse_soft_topk_magnitude,
    sparse_soft_topk_mask,
)

P_VALUES = [2.0, 4 / 3]


def _reference(z: torch.Tensor, k: int, p: float) -> torch.Tensor:
    e = 1.0 / (p - 1.0)
    lo = z.min(-1, keepdim=True).values - 2.0
    hi = z.max(-1, keepdim=True).values + 1.0
    for _ in range(300):
        mid = (lo + hi) / 2
        f = ((z - mid).clamp_min(0) ** e).clamp_max(1).sum(-1, keepdim=True) - k
        hi = torch.where(f < 0, mid, hi)
        lo = torch.where(f < 0, lo, mid)
    return ((z - (lo + hi) / 2).clamp_min(0) ** e).clamp_max(1)


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize(("n", "k"), [(1, 1), (5, 2), (10, 1), (50, 10), (200, 100), (7, 7), (64, 63)])
@pytest.mark.parametrize("beta", [0.05, 1.0, 10.0, 300.0])
def test_pav_equals_reference_solve(p, n, k, beta):
    """Values to 1e-10 (float64), sums to k, and exactly 0 / 1 exactly where the reference is."""
    x = torch.randn(4, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n * 7 + k))
    m = sparse_soft_topk_mask(x, k, beta, p)
    r = _reference(x * beta, k, p)
    assert (m - r).abs().max() < 1e-10
    torch.testing.assert_close(m.sum(-1), torch.full((4,), float(k), dtype=torch.float64), atol=1e-10, rtol=0)
    assert torch.equal(m == 0, r < 1e-12) and torch.equal(m == 1, r > 1 - 1e-12)


def test_pav_p2_equals_scipy_qp():
    """p = 2: the Euclidean projection of βx onto C_k, solved as a QP by scipy (independent of bisection)."""
    scipy_opt = pytest.importorskip("scipy.optimize")
    import numpy as np

    g = torch.Generator().manual_seed(5)
    for n, k, beta in [(6, 2, 1.0), (9, 4, 3.0), (12, 1, 0.5)]:
        z = (torch.randn(n, dtype=torch.float64, generator=g) * beta).numpy()
        res = scipy_opt.minimize(lambda y, z=z: 0.5 * np.sum((y - z) ** 2), np.full(n, k / n),
                                 jac=lambda y, z=z: y - z, bounds=[(0, 1)] * n,
                                 constraints=[{"type": "eq", "fun": lambda y, k=k: y.sum() - k}],
                                 method="SLSQP", options={"ftol": 1e-15, "maxiter": 500})
        m = sparse_soft_topk_mask(torch.from_numpy(z).unsqueeze(0) / beta, k, beta, 2.0)[0].numpy()
        assert np.abs(m - res.x).max() < 1e-6  # SLSQP's own accuracy


@pytest.mark.parametrize("p", P_VALUES)
def test_gradcheck_and_reference_gradient(p):
    """float64 gradcheck (away from block boundaries: random scores) and the gradient of the reference solve."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 9, dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: sparse_soft_topk_mask(s, 3, 1.5, p), (x,), eps=1e-6, atol=1e-7)
    w = torch.randn(3, 9, dtype=torch.float64, generator=g)
    (sparse_soft_topk_mask(x, 3, 1.5, p) * w).sum().backward()
    # reference Jacobian by central differences of the bisection solve, every perturbed row in one batch
    h, (B, n) = 1e-6, x.shape
    eye = torch.eye(n, dtype=torch.float64) * h
    rows = x.detach().unsqueeze(1) + torch.stack([eye, -eye], 1).view(1, 2 * n, n)  # (B, 2n, n)
    ref = _reference(rows.reshape(-1, n) * 1.5, 3, p).view(B, n, 2, n)
    num = (((ref[:, :, 0] - ref[:, :, 1]) / (2 * h)) * w.unsqueeze(1)).sum(-1)
    assert (x.grad - num).abs().max() < 1e-6


def test_p43_is_c1_and_p2_is_piecewise_linear():
    """p = 4/3: ∂y_0/∂x_0 is continuous as x_0 sweeps through the support (C¹); for p = 2 it jumps (to 2/3 as x_0
    enters the three-item block)."""
    x = torch.tensor([[0.0, 0.0, -0.3, -2.0]], dtype=torch.float64)
    grads = {}
    for p in P_VALUES:
        gs = []
        for t in torch.linspace(-2.0, 2.0, 401, dtype=torch.float64):
            xx = (x + torch.tensor([[t, 0, 0, 0]], dtype=torch.float64)).requires_grad_()
            sparse_soft_topk_mask(xx, 1, 1.0, p)[0, 0].backward()
            gs.append(float(xx.grad[0, 0]))
        grads[p] = torch.tensor(gs)
    assert grads[4 / 3].diff().abs().max() < 0.05 and grads[2.0].diff().abs().max() > 0.6


def test_exact_sparsity_and_hard_limit():
    x = torch.tensor([[3.0, 2.5, 0.2, 0.1, -4.0]], dtype=torch.float64)
    for p in P_VALUES:
        m = sparse_soft_topk_mask(x, 2, 1.0, p)
        assert m[0, 4] == 0 and m[0, 0] == 1  # exact zeros / ones outside the margin
        hard = sparse_soft_topk_mask(x, 2, 100.0, p)
        assert torch.equal(hard, torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64))


def test_ties_split_evenly():
    x = torch.tensor([[1.0, 1.0, 1.0, -5.0]], dtype=torch.float64)
    for p in P_VALUES:
        torch.testing.assert_close(sparse_soft_topk_mask(x, 2, 1.0, p)[0, :3],
                                   torch.full((3,), 2 / 3, dtype=torch.float64), atol=1e-14, rtol=0)


@pytest.mark.parametrize(("n", "k", "beta"), [(10, 3, 1.0), (40, 5, 2.0), (33, 16, 0.3)])
def test_dykstra_agrees_with_pav(n, k, beta):
    """Values and gradients of the two solvers agree to Dykstra's tolerance (p = 2)."""
    x = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n)).requires_grad_()
    w = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a = sparse_soft_topk_mask(x, k, beta, 2.0, "pav")
    (ga,) = torch.autograd.grad((a * w).sum(), x)
    b = sparse_soft_topk_mask(x, k, beta, 2.0, "dykstra", max_iter=100000, tolerance=1e-13)
    (gb,) = torch.autograd.grad((b * w).sum(), x)
    assert (a - b).abs().max() < 1e-9
    assert (ga - gb).abs().max() < 1e-9
    torch.testing.assert_close(b.sum(-1), torch.full((3,), float(k), dtype=torch.float64), atol=1e-10, rtol=0)


def test_isotonic_dykstra_is_decreasing_projection():
    u = torch.tensor([[3.0, 1.0, 2.0, 0.0, 5.0]], dtype=torch.float64)
    v, _, _ = isotonic_dykstra(u, 10000, 1e-14)
    torch.testing.assert_close(v, torch.tensor([[3.0, 2.0, 2.0, 2.0, 2.0]], dtype=torch.float64), atol=1e-10,
                               rtol=0)


def test_dykstra_at_one_item_and_beyond_the_dtype_resolution():
    """Found by the fuzz matrix's Dykstra variant: n = 1 (its backward indexed an empty block start), and βx past
    1 / ε of the dtype (2^24 in float32), where s - (s - 1) rounds to 0 or 2: the mask is the exact hard one
    there (every item a singleton, as PAV returns it), sums to k and has no gradient."""
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([[0.7]], dtype=dtype, requires_grad=True)
        m = sparse_soft_topk_mask(x, 1, 10.0, 2.0, "dykstra")
        (g,) = torch.autograd.grad(m.sum(), x)
        assert m.item() == 1.0 and g.item() == 0.0
        x = torch.tensor([[3.0, -1.0, 2.0, 0.5, -2.0]], dtype=dtype, requires_grad=True)
        for beta in (1e8, 1e20):
            m = sparse_soft_topk_mask(x, 2, beta, 2.0, "dykstra")
            assert torch.equal(m, torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0]], dtype=dtype))
            assert torch.equal(m, sparse_soft_topk_mask(x, 2, beta, 2.0, "pav").to(dtype))
            (g,) = torch.autograd.grad(m.sum(), x)
            assert torch.equal(g, torch.zeros_like(g))


def test_dykstra_warns_when_not_converged():
    x = torch.randn(2, 200, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.warns(RuntimeWarning, match="Dykstra"):
        sparse_soft_topk_mask(x, 50, 0.1, 2.0, "dykstra", max_iter=3, tolerance=1e-12)


def test_operator_options_and_errors():
    op = load("sparse_soft_topk")
    assert isinstance(op, SparseSoftTopK) and op.p == 4 / 3 and op.beta == 10.0
    assert load("sparse_soft_topk", p="4/3").p == 4 / 3 and load("sparse_soft_topk", p=2).p == 2.0
    for bad in ({"p": 1.5}, {"p": "abc"}, {"solver": "x"}, {"solver": "dykstra"}, {"max_iter": 0},
                {"tolerance": 0.0}):
        with pytest.raises(ValueError):
            load("sparse_soft_topk", **bad)
    with pytest.raises(ValueError, match="range"):
        load("sparse_soft_topk", beta=1e300).topk_membership(torch.tensor([[1e300, 0.0]], dtype=torch.float64), [1])
    with pytest.raises(ValueError, match="range"):
        load("sparse_soft_topk", beta=1e40).topk_membership(torch.tensor([[1e40, 0.0]], dtype=torch.float64), [1])
    s = torch.randn(2, 7)
    torch.testing.assert_close(op.topk_membership(s, [2, 5])[:, 1], sparse_soft_topk_mask(s, 5, 10.0).float())


def test_dftopk_definition():
    """σ(β (x - t)), t = midpoint of the k-th and (k+1)-th largest; gradient through t unless detached."""
    x = torch.tensor([[4.0, 1.0, 3.0, 0.0, 2.0]], dtype=torch.float64, requires_grad=True)
    m = load("dftopk", beta=2.0).topk_membership(x, [2, 5])
    torch.testing.assert_close(m[0, 0], torch.sigmoid(2.0 * (x[0] - 2.5)))
    assert torch.equal(m[0, 1], torch.ones(5, dtype=torch.float64))
    (g,) = torch.autograd.grad(m[0, 0].sum(), x)
    (gd,) = torch.autograd.grad(DFTopK(2.0, detach_threshold=True).topk_membership(x, [2])[0, 0].sum(), x)
    s = torch.sigmoid(2.0 * (x[0] - 2.5)).detach()
    d = 2.0 * s * (1 - s)
    torch.testing.assert_close(gd[0], d)
    want = d.clone()
    want[[2, 4]] -= d.sum() / 2  # x_(2) = 3 (item 2) and x_(3) = 2 (item 4) define t
    torch.testing.assert_close(g[0], want)
    assert not load("dftopk").sums_to_k and load("sparse_soft_topk").sums_to_k


def test_dftopk_gradcheck():
    x = torch.randn(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    op = load("dftopk", beta=1.0)
    assert torch.autograd.gradcheck(lambda s: op.topk_membership(s, [1, 3, 8]), (x,))


# -- magnitude (Sander et al. 2023, §3.3) ----------------------------------------------------------------
def _mag_reference(x, k: int, beta: float, p: float):
    """An independent solve of the weighted isotonic problem: PAV over explicit member lists, each block's u by
    200 bisection steps on Σ_B sign(z - u)|z - u|^{q-1} = λ W u (no moments, no cubic formula)."""
    import numpy as np

    lam, q = 1 / beta, p / (p - 1)

    def value(zs, ws):
        lo, hi = -1.0, max(zs) + 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            f = sum(np.sign(z - mid) * abs(z - mid) ** (q - 1) for z in zs) - lam * sum(ws) * mid
            lo, hi = (mid, hi) if f > 0 else (lo, mid)
        return (lo + hi) / 2

    order = np.argsort(-np.abs(x), kind="stable")
    z = np.abs(x)[order] / lam
    blocks = []
    for i, zi in enumerate(z):
        wi = 1.0 if i < k else 0.0
        blocks.append(([zi], [wi], value([zi], [wi])))
        while len(blocks) > 1 and blocks[-2][2] < blocks[-1][2]:
            b2, b1 = blocks.pop(), blocks.pop()
            blocks.append((b1[0] + b2[0], b1[1] + b2[1], value(b1[0] + b2[0], b1[1] + b2[1])))
    u = np.concatenate([[b[2]] * len(b[0]) for b in blocks])
    r = np.maximum(z - u, 0)
    y = np.zeros(len(z))
    y[order] = r ** (q - 1) + lam * r
    return np.sign(x) * y


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("beta", [0.1, 2.0, 100.0])
def test_magnitude_equals_reference_and_is_sparse(p, beta):
    g = torch.Generator().manual_seed(int(beta * 10))
    for n, k in [(1, 1), (6, 2), (12, 5), (30, 29), (50, 7)]:
        x = torch.randn(n, dtype=torch.float64, generator=g)
        m = sparse_soft_topk_magnitude(x[None], k, beta, p)[0]
        r = torch.from_numpy(_mag_reference(x.numpy(), k, beta, p))
        assert (m - r).abs().max() < 1e-10
        assert (m.abs() <= x.abs() + 1e-12).all() and (m * x >= 0).all()
    x = torch.tensor([[3.0, -2.5, 0.2, 0.1, -4.0]], dtype=torch.float64)
    hard = sparse_soft_topk_magnitude(x, 2, 1e3, p)
    torch.testing.assert_close(hard, torch.tensor([[3.0, 0.0, 0.0, 0.0, -4.0]], dtype=torch.float64), atol=1e-10,
                               rtol=0)
    assert (hard[0, 1:4] == 0).all()  # exact zeros


@pytest.mark.parametrize("p", P_VALUES)
def test_magnitude_gradcheck(p):
    x = torch.randn(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: sparse_soft_topk_magnitude(s, 3, 1.5, p), (x,), eps=1e-6, atol=1e-6)


def test_magnitude_errors():
    with pytest.raises(ValueError, match="k must satisfy"):
        sparse_soft_topk_magnitude(torch.randn(1, 3), 4)
    with pytest.raises(ValueError, match="p must be"):
        sparse_soft_topk_magnitude(torch.randn(1, 3), 1, p=3)
