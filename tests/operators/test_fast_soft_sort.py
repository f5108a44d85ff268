"""Fast soft sort / rank (Blondel et al. 2020): worked numbers (torchsort README and by hand), a brute-force
projection onto the permutahedron (scipy SLSQP), torchsort parity, conservation laws, gradcheck."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from diffrank import functional as F
from diffrank.operators import load
from diffrank.operators.fast_soft_sort import FastSoftSort

F64 = torch.float64
S = torch.tensor([[0.5, -1.2, 2.0, 0.3, 1.1]], dtype=F64)


def _rank_desc(x, reg="l2", eps=1.0):
    """Soft rank, rank 1 = largest (= ``torchsort.soft_rank(-x, reg, eps)``), through the functional API:
    torchsort's ``regularization_strength`` ε is β = 1/ε."""
    return F.soft_rank(x, method="fast_soft_sort", beta=1 / eps, regularization=reg, descending=True)


def _sort_desc(x, reg="l2", eps=1.0):
    """Soft sort, descending (= ``-torchsort.soft_sort(-x, reg, eps)``), through the functional API."""
    return F.soft_sort(x, method="fast_soft_sort", beta=1 / eps, regularization=reg, descending=True)


def _rand(B, n, seed=0, scale=1.0):
    return torch.randn(B, n, dtype=F64, generator=torch.Generator().manual_seed(seed)) * scale


def test_worked_numbers():
    x = torch.tensor([[8.0, 0, 5, 3, 2, 1, 6, 7, 9]], dtype=F64)
    # torchsort README (ascending): torchsort.soft_sort(x) = 0.5556, 1.5556, ...: the negated descending soft
    # sort of -x, and (l2) the functional API's ascending soft sort
    torch.testing.assert_close(-_sort_desc(-x), torch.arange(9, dtype=F64).view(1, 9) + 5 / 9, atol=1e-4, rtol=0)
    torch.testing.assert_close(_rank_desc(-x), torch.tensor([[8.0, 1, 5, 4, 3, 2, 6, 7, 9]], dtype=F64))
    torch.testing.assert_close(F.soft_sort(x, method="fast_soft_sort"), torch.arange(9, dtype=F64).view(1, 9) + 5 / 9,
                               atol=1e-4, rtol=0)
    torch.testing.assert_close(F.soft_rank(x, method="fast_soft_sort"), torch.tensor([[8.0, 1, 5, 4, 3, 2, 6, 7, 9]],
                                                                                     dtype=F64))
    torch.testing.assert_close(_rank_desc(S), torch.tensor([[3.04, 4.74, 1.54, 3.24, 2.44]], dtype=F64))
    torch.testing.assert_close(_rank_desc(-S), torch.tensor([[2.96, 1.26, 4.46, 2.76, 3.56]], dtype=F64))
    torch.testing.assert_close(-_sort_desc(-S), torch.tensor([[-0.95, 0.05, 0.5, 1.1, 2.0]], dtype=F64))
    torch.testing.assert_close(_rank_desc(-S, "kl"), torch.tensor([[2.7492, 1, 5, 2.2508, 4]], dtype=F64),
                               atol=1e-4, rtol=0)
    torch.testing.assert_close(-_sort_desc(-S, "kl"), torch.tensor([[-1.0882, -0.0882, 0.5, 1.1, 2.0]], dtype=F64),
                               atol=1e-4, rtol=0)
    torch.testing.assert_close(-_sort_desc(-S, "l2", 10.0), torch.tensor([[0.34, 0.44, 0.54, 0.64, 0.74]], dtype=F64))
    for reg in ("l2", "kl"):
        torch.testing.assert_close(_rank_desc(-S, reg, 0.1), torch.tensor([[3.0, 1, 5, 2, 4]], dtype=F64))
        torch.testing.assert_close(_sort_desc(S, reg, 0.1), torch.tensor([[2.0, 1.1, 0.5, 0.3, -1.2]], dtype=F64))


def _permutahedron_projection(z, w, kl):
    """argmin over conv{w_σ} of ½‖μ - z‖² (l2) or KL(μ, e^z) (kl), by SLSQP on the 2^n - 2 facet inequalities."""
    from scipy.optimize import minimize

    n = len(z)
    ws = np.sort(w)[::-1]
    cons = [{"type": "eq", "fun": lambda m: m.sum() - ws.sum()}]
    for size in range(1, n):
        for sub in itertools.combinations(range(n), size):
            cap = float(ws[:size].sum())  # the |S| largest entries of w bound any |S| coordinates
            cons.append({"type": "ineq", "fun": lambda m, sub=list(sub), c=cap: c - m[sub].sum()})
    if kl:
        fun = lambda m: float(np.sum(m * np.log(m) - m * z - m))  # KL(μ, e^z) up to a constant
        x0 = np.full(n, ws.mean())
        bounds = [(1e-9, None)] * n
    else:
        fun = lambda m: float(0.5 * np.sum((m - z) ** 2))
        x0, bounds = np.full(n, ws.mean()), None
    res = minimize(fun, x0, constraints=cons, bounds=bounds, method="SLSQP", options={"ftol": 1e-14, "maxiter": 500})
    return res.x


@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_brute_force_projection(reg, eps):
    theta = _rand(3, 5, seed=1)
    n = 5
    rho = np.arange(n, 0, -1, dtype=float)
    kl = reg == "kl"
    for b in range(3):
        t = theta[b].numpy()
        # rank 1 = largest: r = P(-θ/ε, ρ) (l2), exp P_E(-θ/ε, log ρ) (kl: projection of e^z onto P(ρ))
        ref_rank = _permutahedron_projection(-t / eps, rho, kl)
        torch.testing.assert_close(_rank_desc(theta[b:b + 1], reg, eps)[0], torch.from_numpy(ref_rank), atol=2e-5,
                                   rtol=0)
        if not kl:  # descending sort: P_Q(ρ/ε, θ)
            ref_sort = _permutahedron_projection(rho / eps, t, False)
            torch.testing.assert_close(_sort_desc(theta[b:b + 1], reg, eps)[0], torch.from_numpy(ref_sort), atol=2e-5,
                                       rtol=0)


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_torchsort_parity(reg):
    torchsort = pytest.importorskip("torchsort")
    for eps, n, seed in [(0.3, 50, 0), (1.0, 200, 1), (3.0, 17, 2)]:
        t = _rand(8, n, seed=seed, scale=2.0)
        g = _rand(8, n, seed=seed + 100)
        for ours, ref in ((lambda x, e=eps: _rank_desc(x, reg, e), lambda x, e=eps: torchsort.soft_rank(-x, reg, e)),
                          (lambda x, e=eps: _sort_desc(x, reg, e), lambda x, e=eps: -torchsort.soft_sort(-x, reg, e))):
            a, b = t.clone().requires_grad_(), t.clone().requires_grad_()
            ya, yb = ours(a), ref(b)
            torch.testing.assert_close(ya, yb, atol=1e-10, rtol=1e-10)
            (ya * g).sum().backward()
            (yb * g).sum().backward()
            torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=1e-10)
        t32 = t.float()
        torch.testing.assert_close(_rank_desc(t32, reg, eps), torchsort.soft_rank(-t32, reg, eps), atol=1e-4, rtol=1e-5)


def test_conservation_and_limits():
    t = _rand(4, 40, seed=3, scale=3.0)
    for eps in (0.1, 1.0, 10.0):
        torch.testing.assert_close(_rank_desc(t, "l2", eps).sum(1), torch.full((4,), 40 * 41 / 2, dtype=F64))
        torch.testing.assert_close(_sort_desc(t, "l2", eps).sum(1), t.sum(1))
        out = _sort_desc(t, "kl", eps)
        torch.testing.assert_close(torch.exp(out).sum(1), torch.exp(t).sum(1))  # Σ e^sort = Σ e^θ (descending)
        assert (out[:, :-1] >= out[:, 1:] - 1e-12).all()
    ranks = t.argsort(1, descending=True).argsort(1).to(F64) + 1
    for reg in ("l2", "kl"):
        torch.testing.assert_close(_rank_desc(t, reg, 1e-4), ranks)
        torch.testing.assert_close(_sort_desc(t, reg, 1e-4), t.sort(1, descending=True).values)
    torch.testing.assert_close(_rank_desc(t, "l2", 1e6), torch.full_like(t, 20.5), atol=1e-3, rtol=0)


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_gradcheck(reg):
    t = _rand(3, 6, seed=4).requires_grad_()
    op = FastSoftSort(beta=1.3, regularization=reg)
    assert gradcheck(op.soft_rank, (t,))
    assert gradcheck(op.soft_sort, (t,))


def test_operator_contract_and_errors():
    op = load("fast_soft_sort")
    assert isinstance(op, FastSoftSort) and op.regularization == "l2" and op.regularization_strength == 1.0
    assert op.capabilities == frozenset({"soft_sort", "soft_rank"})
    with pytest.raises(ValueError, match="provides only"):
        op(torch.randn(2, 5))
    with pytest.raises(ValueError, match="provides only"):
        op.topk_membership(torch.randn(2, 5), [2])
    with pytest.raises(ValueError, match="regularization"):
        FastSoftSort(regularization="l1")
    with pytest.raises(ValueError, match="regularization_strength"):
        FastSoftSort.with_strength(0.0).soft_rank(torch.randn(2, 5))
    with pytest.raises(ValueError, match="non-finite"):
        _sort_desc(torch.tensor([[1.0, float("nan")]]))
    out = op.soft_rank(torch.randn(2, 6).bfloat16())
    assert out.dtype == torch.bfloat16
