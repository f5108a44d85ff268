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


# -- the VJP at kinks and ties: the authors' convention (google-research/fast-soft-sort, torchsort) ---------------
def _spearman(pred, target, rank):
    """torchsort README's Spearman coefficient, with ``rank`` the ascending soft rank."""
    pred, target = rank(pred), rank(target)
    pred = pred - pred.mean()
    target = target - target.mean()
    return (pred / pred.norm() * target / target.norm()).sum()


def test_readme_spearman_gradient():
    """torchsort README: 0.8321 and gradient [-0.0555, 0, 0.0555, 0.1109, -0.1109]; the scores are integer-spaced
    at ε = 1, so every PAV block is a kink (it was all zeros before the convention)."""
    pred = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], requires_grad=True)
    target = torch.tensor([[5.0, 6.0, 7.0, 8.0, 7.0]])
    rho = _spearman(pred, target, lambda x: F.soft_rank(x, method="fast_soft_sort", beta=1.0))
    (grad,) = torch.autograd.grad(rho, pred)
    torch.testing.assert_close(rho, torch.tensor(0.8321), atol=1e-4, rtol=0)
    torch.testing.assert_close(grad, torch.tensor([[-0.0555, 0.0, 0.0555, 0.1109, -0.1109]]), atol=1e-4, rtol=0)


def _ref_projection(z, w, kl):
    """μ = P(z, w) with Jacobians in z and w, re-derived in numpy from the paper (Prop. 3, Lemma 2) and the authors'
    convention: pool adjacent blocks while the earlier value is <= the later one, then Jacobian blocks = runs of the
    solution whose neighbours differ by <= 1e-9; within a block ∂v_i/∂s_j = 1/|B| or softmax(s_B)_j, ∂v_i/∂w_j =
    -1/|B| or -softmax(w_B)_j."""
    from scipy.special import logsumexp, softmax

    n = len(z)
    order = np.argsort(-z, kind="stable")
    s = z[order]

    def value(a, e):
        return logsumexp(s[a:e]) - logsumexp(w[a:e]) if kl else np.mean(s[a:e] - w[a:e])

    blocks = []
    for i in range(n):
        blocks.append([i, i + 1])
        while len(blocks) > 1 and value(*blocks[-2]) <= value(*blocks[-1]):
            last = blocks.pop()
            blocks[-1][1] = last[1]
    v = np.concatenate([np.full(e - a, value(a, e)) for a, e in blocks])
    cuts = [0] + [i for i in range(1, n) if abs(v[i] - v[i - 1]) > 1e-9] + [n]
    dv_ds, dv_dw = np.zeros((n, n)), np.zeros((n, n))
    for a, e in zip(cuts[:-1], cuts[1:]):
        dv_ds[a:e, a:e] = softmax(s[a:e]) if kl else 1 / (e - a)
        dv_dw[a:e, a:e] = -(softmax(w[a:e]) if kl else 1 / (e - a))
    perm = np.eye(n)[order]  # s = perm @ z
    return perm.T @ (s - v), perm.T @ (np.eye(n) - dv_ds) @ perm, -perm.T @ dv_dw


@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_vjp_at_kinks_and_ties_reference(reg, eps):
    """Integer scores (ties, and kinks at every spacing of ε): our VJP equals the re-derived reference's."""
    gen = torch.Generator().manual_seed(int(eps * 10))
    theta = torch.randint(0, 5, (8, 20), generator=gen).to(F64)
    g = torch.randn(8, 20, dtype=F64, generator=gen)
    op = FastSoftSort.with_strength(eps, reg)
    kl = reg == "kl"
    t = theta.clone().requires_grad_()
    r = op.soft_rank(t)
    (grad_rank,) = torch.autograd.grad(r, t, g)
    t = theta.clone().requires_grad_()
    srt = op.soft_sort(t)
    (grad_sort,) = torch.autograd.grad(srt, t, g)
    n = theta.shape[1]
    rho = np.arange(n, 0, -1, dtype=float)
    for b in range(8):
        th, gb = theta[b].numpy(), g[b].numpy()
        # rank: r = P(-θ/ε, ρ) (l2) or exp P(-θ/ε, log ρ) (kl)
        mu, jz, _ = _ref_projection(-th / eps, np.log(rho) if kl else rho, kl)
        ref_r = np.exp(mu) if kl else mu
        np.testing.assert_allclose(r[b].detach().numpy(), ref_r, atol=1e-10)
        np.testing.assert_allclose(grad_rank[b].numpy(), -(jz.T @ (gb * ref_r if kl else gb)) / eps, atol=1e-10)
        # sort: P(ρ/ε, sorted θ); torch.sort's order of tied θ decides which of them gets which sorted gradient
        sorted_th, idx = torch.sort(theta[b], descending=True)
        mu, _, jw = _ref_projection(rho / eps, sorted_th.numpy(), kl)
        np.testing.assert_allclose(srt[b].detach().numpy(), mu, atol=1e-10)
        ref_g = np.zeros(n)
        ref_g[idx.numpy()] = jw.T @ gb
        np.testing.assert_allclose(grad_sort[b].numpy(), ref_g, atol=1e-10)


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_vjp_at_kinks_and_ties_torchsort(reg):
    """The same integer scores through diffrank.compat.torchsort and torchsort itself: values and VJPs agree."""
    torchsort = pytest.importorskip("torchsort")
    import diffrank.compat.torchsort as compat

    gen = torch.Generator().manual_seed(3)
    for eps in (0.5, 1.0, 2.0):
        x = torch.randint(0, 5, (8, 20), generator=gen).to(F64)
        g = torch.randn(8, 20, dtype=F64, generator=gen)
        for name in ("soft_rank", "soft_sort"):
            a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = getattr(compat, name)(a, reg, eps), getattr(torchsort, name)(b, reg, eps)
            torch.testing.assert_close(ya, yb, atol=1e-10, rtol=1e-10)
            torch.testing.assert_close(torch.autograd.grad(ya, a, g)[0], torch.autograd.grad(yb, b, g)[0], atol=1e-10,
                                       rtol=1e-10)


# -- second derivatives, learnable β, torch.func, torch.compile --------------------------------------------------
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_gradgradcheck(reg):
    """Exact second derivatives: zero a.e. for l2 (piecewise-constant Jacobian, the backward still linear in the
    cotangent), the block softmax's curvature for kl; float64, no kinks."""
    t = _rand(2, 7, seed=5, scale=2.0).requires_grad_()
    op = FastSoftSort(beta=0.8, regularization=reg)
    assert torch.autograd.gradgradcheck(op.soft_rank, (t,))
    assert torch.autograd.gradgradcheck(op.soft_sort, (t,))
    assert torch.autograd.gradgradcheck(lambda x: F.soft_rank(x, method=op), (t,))


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_learnable_beta_gradcheck(reg):
    """β = 1/ε a tensor that requires grad: gradcheck in β and θ together, and β.grad fills."""
    t = _rand(2, 6, seed=6).requires_grad_()
    beta = torch.tensor(0.7, dtype=F64, requires_grad=True)
    assert gradcheck(lambda x, b: FastSoftSort(b, reg).soft_rank(x), (t, beta))
    assert gradcheck(lambda x, b: FastSoftSort(b, reg).soft_sort(x), (t, beta))
    assert torch.autograd.gradgradcheck(lambda x, b: FastSoftSort(b, reg).soft_rank(x), (t, beta))
    FastSoftSort(beta, reg).soft_sort(t).square().sum().backward()
    assert beta.grad is not None and beta.grad != 0


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_torch_func(reg):
    """vmap of the hooks (the public methods' host-side finite check is the base class's) equals the loop;
    func.grad and jacrev of the public methods equal autograd."""
    op = FastSoftSort(beta=1.3, regularization=reg)
    xs = _rand(4, 3 * 6, seed=7).view(4, 3, 6)
    w = torch.arange(6, dtype=F64)
    for name in ("soft_rank", "soft_sort"):
        hook, public = getattr(op, "_" + name), getattr(op, name)
        torch.testing.assert_close(torch.func.vmap(hook)(xs), torch.stack([hook(x) for x in xs]))
        x = xs[0].clone().requires_grad_()
        (ref,) = torch.autograd.grad((public(x) * w).sum(), x)
        torch.testing.assert_close(torch.func.grad(lambda t, f=public: (f(t) * w).sum())(xs[0]), ref)
        torch.testing.assert_close(torch.func.jacrev(public)(xs[0]), torch.autograd.functional.jacobian(public, xs[0]))
        # the Hessian-vector product through func transforms (jvp of grad) equals double backward
        v = torch.randn_like(xs[0])
        f = lambda t, p=public: (p(t) ** 2 * w).sum()  # noqa: E731
        hvp = torch.func.jvp(torch.func.grad(f), (xs[0],), (v,))[1]
        x = xs[0].clone().requires_grad_()
        (gx,) = torch.autograd.grad(f(x), x, create_graph=True)
        torch.testing.assert_close(hvp, torch.autograd.grad(gx, x, v)[0])


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_torch_compile(reg):
    """torch.compile with the first call compiled equals eager (forward and gradient; the kernel is the custom op
    diffrank::fast_soft_sort_project, so dynamo never traces numba); the hooks alone compile with fullgraph=True."""
    op = FastSoftSort(beta=1.3, regularization=reg)

    def f(x):
        return (op.soft_rank(x) * torch.arange(6.0)).sum() + (op.soft_sort(x) ** 2).sum()

    def hooks(x):
        return op._soft_rank(x), op._soft_sort(x)

    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(8))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    ya = torch.compile(f)(a)
    ya.backward()
    yb = f(b)
    yb.backward()
    torch.testing.assert_close(ya, yb, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-5)
    for c, e in zip(torch.compile(hooks, fullgraph=True)(x), hooks(x)):
        torch.testing.assert_close(c, e, atol=1e-5, rtol=1e-5)


_AOT_SCRIPT = """
import sys, torch
from diffrank.operators.fast_soft_sort import FastSoftSort
x = torch.linspace(-2, 3, 12, dtype=torch.float64).view(2, 6).requires_grad_()
outs = []
for dtype in (torch.float64, torch.float32):
    for reg in ("l2", "kl"):
        op = FastSoftSort(1.3, reg)
        xx = x.detach().to(dtype).requires_grad_()
        y = op.soft_rank(xx) + op.soft_sort(xx) ** 2
        y.sum().backward()
        outs += [y.detach().double(), xx.grad.double()]
torch.save(outs, sys.argv[1])
print("numba" in sys.modules)
"""


@pytest.mark.slow
def test_ahead_of_time_module(tmp_path):
    """``python -m diffrank.operators.fast_soft_sort_cpu --build`` writes a module that a fresh process loads
    without importing numba, and whose results equal numba's JIT (DIFFRANK_FSS_AOT=0)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DIFFRANK_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-m", "diffrank.operators.fast_soft_sort_cpu", "--build"], env=env, check=True,
                   capture_output=True, timeout=600)
    script = tmp_path / "run.py"
    script.write_text(_AOT_SCRIPT)
    res = {}
    for mode in ("auto", "0"):
        out = tmp_path / f"{mode}.pt"
        proc = subprocess.run([sys.executable, str(script), str(out)], env={**env, "DIFFRANK_FSS_AOT": mode},
                              check=True, capture_output=True, text=True, timeout=600)
        assert proc.stdout.strip() == ("False" if mode == "auto" else "True")  # numba imported only by the JIT
        res[mode] = torch.load(out)
    for a, b in zip(res["auto"], res["0"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_strided_inputs_and_cotangents(reg):
    """A transposed (non-contiguous) input and cotangent give what their contiguous copies give: the kernels read C
    rows (torch.sort of a transposed tensor returns strided indices)."""
    import diffrank.compat.torchsort as compat

    x = _rand(6, 5, seed=9).T  # (5, 6), strided
    g = _rand(6, 5, seed=10).T
    op = FastSoftSort(beta=0.9, regularization=reg)
    for fn in (op.soft_rank, op.soft_sort, lambda t: compat.soft_rank(t, reg), lambda t: compat.soft_sort(t, reg)):
        a, b = x.clone(memory_format=torch.preserve_format).requires_grad_(), x.contiguous().requires_grad_()
        assert not a.is_contiguous()
        ya, yb = fn(a), fn(b)
        torch.testing.assert_close(ya, yb, rtol=0, atol=0)
        ya.backward(g)
        yb.backward(g.contiguous())
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
