"""LapSum (Struski et al. 2025): worked numbers, exactness, real-valued k, limits, closed-form gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import diffrank.operators.lapsum as lapsum_mod
from diffrank import functional as F
from diffrank.operators import load
from diffrank.operators.lapsum import LapSum

F64 = torch.float64
S = torch.tensor([[0.5, -1.2, 2.0, 0.3, 1.1]], dtype=F64)


def _topk(scores, k, beta):
    """LapSum top-k membership of ``scores (B, n)``: ``(B, n)`` for a number or 0-dim k (the functional API),
    ``(B, M, n)`` for a ``(B, M)`` tensor k (the operator method)."""
    if isinstance(k, torch.Tensor) and k.dim() == 2:
        return LapSum(beta).topk_membership(scores, k)
    return F.topk_membership(scores, k, method="lapsum", beta=beta)


def _rand(B, n, seed=0, dtype=F64, scale=1.0):
    return torch.randn(B, n, dtype=dtype, generator=torch.Generator().manual_seed(seed)) * scale


def _lap(x, s, beta):
    """Lap_s(x) = Σ_j F_α(x - s_j), α = -1/β, by its definition."""
    z = -beta * (x.unsqueeze(-1) - s.unsqueeze(-2))
    e = torch.exp(-z.abs())
    return torch.where(z <= 0, 0.5 * e, 1 - 0.5 * e).sum(-1)


@pytest.mark.parametrize("alpha,k,expect", [
    (-0.5, 2, [0.226943, 0.007574, 0.945155, 0.152124, 0.668205]),
    (-0.5, 2.5, [0.416991, 0.013916, 0.970151, 0.279517, 0.819424]),
    (-0.1, 2, [0.023364, 0.000000, 0.999997, 0.003162, 0.973477]),
    (-0.01, 2, [0, 0, 1, 0, 1]),
    (-0.01, 2.5, [0.5, 0, 1, 0, 1]),
    (-10, 2, [0.396233, 0.334288, 0.460357, 0.388387, 0.420735]),
    (-1000, 2, [0.39998, 0.39930, 0.40058, 0.39990, 0.40022]),
])
def test_topk_worked_numbers(alpha, k, expect):
    p = _topk(S, k, beta=1 / abs(alpha))
    torch.testing.assert_close(p[0], torch.tensor(expect, dtype=F64), atol=1e-5, rtol=0)
    assert abs(float(p.sum()) - k) < 1e-12


def test_smallest_k_is_negation():
    # the k smallest (α = +1/β): p(s, k, +α) = p(-s, k, -α), and = 1 - p(s, n - k, -α) (F(-x) = 1 - F(x))
    p = _topk(-S, 2, beta=2.0)
    torch.testing.assert_close(p[0], torch.tensor([0.360859, 0.976879, 0.017966, 0.535608, 0.108689], dtype=F64),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(p, 1 - _topk(S, 3, beta=2.0))


def test_gradient_worked_numbers():
    s = S.clone().requires_grad_()
    k = torch.tensor(2.0, dtype=F64, requires_grad=True)
    jac = torch.autograd.functional.jacobian(lambda x: _topk(x, 2, beta=2.0)[0], s)[:, 0]
    torch.testing.assert_close(jac.diagonal(), torch.tensor([0.320679, 0.014999, 0.101911, 0.244395, 0.378861],
                                                            dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(jac, jac.T)  # symmetric
    torch.testing.assert_close(jac.sum(1), torch.zeros(5, dtype=F64), atol=1e-12, rtol=0)
    dk = torch.autograd.functional.jacobian(lambda kk: _topk(S, kk, beta=2.0)[0], k)
    torch.testing.assert_close(dk, torch.tensor([0.293480, 0.009794, 0.070926, 0.196726, 0.429074], dtype=F64),
                               atol=1e-6, rtol=0)


def test_rank_sort_permutation_worked_numbers():
    op = LapSum(beta=2.0)
    torch.testing.assert_close(op.soft_rank(S)[0], torch.tensor([3.176356, 4.952563, 1.125060, 3.572099, 2.173922],
                                                                dtype=F64), atol=1e-6, rtol=0)
    srt = op.soft_sort(S)[0]
    torch.testing.assert_close(srt, torch.tensor([2.111620, 1.212946, 0.590772, 0.019434, -1.245320], dtype=F64),
                               atol=1e-6, rtol=0)
    assert abs(float(srt.sum()) - 2.689452) < 1e-6  # not sum-preserving
    P = op(S)[0]
    expect = torch.tensor([[0.049775, 0.001661, 0.749940, 0.033365, 0.165259],
                           [0.177168, 0.005913, 0.195215, 0.118759, 0.502946],
                           [0.412199, 0.015547, 0.036879, 0.312268, 0.223107],
                           [0.306684, 0.130887, 0.015269, 0.454789, 0.092371],
                           [0.054175, 0.845992, 0.002697, 0.080819, 0.016317]], dtype=F64)
    torch.testing.assert_close(P, expect, atol=1e-6, rtol=0)
    torch.testing.assert_close(P[:2].sum(0), _topk(S, 2, beta=2.0)[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(LapSum(beta=100.0).soft_rank(S)[0], torch.tensor([3.0, 5, 1, 4, 2], dtype=F64),
                               atol=1e-6, rtol=0)
    hard = LapSum(beta=100.0)(S)[0]
    assert hard.argmax(1).tolist() == [2, 4, 0, 3, 1]
    assert (hard.max(1).values > 1 - 1e-4).all()  # the closest pair (0.5, 0.3): ½e^{-β·0.1} = 2.3e-5


@pytest.mark.parametrize("n,scale,beta", [(7, 1.0, 1.0), (1000, 50.0, 20.0), (100000, 1.0, 3.0), (2000, 1e3, 10.0)])
def test_sum_equals_real_k(n, scale, beta):
    s = _rand(2, n, seed=n, scale=scale)
    k = torch.tensor([[0.3, n / 3 + 0.7, n - 0.5], [1.0, min(17.3, n / 2), n - 1e-3]], dtype=F64)
    p = _topk(s, k, beta=beta)
    assert p.shape == (2, 3, n)
    assert torch.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()
    assert (p.sum(-1) - k).abs().max() < 1e-12 + 1e-14 * n  # float64 rounding of n terms
    p32 = _topk(s.float(), k.float(), beta=beta)
    assert torch.isfinite(p32).all()
    assert (p32.sum(-1) - k.float()).abs().max() / n < 1e-5


def test_ties_and_widely_spread_float32():
    s = torch.tensor([[1.0, 1.0, 1.0, -2.0, 5.0, 5.0]])
    p = _topk(s, 3.5, beta=1e3)
    torch.testing.assert_close(p[0], torch.tensor([0.5, 0.5, 0.5, 0, 1, 1]), atol=1e-5, rtol=0)
    s = _rand(4, 300, dtype=torch.float32, scale=100.0)
    for beta in (0.8, 10.0, 1e3):  # |s|/τ up to ~1e5
        p = LapSum(beta=beta).topk_membership(s, [1, 5, 299])
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p.sum(-1), torch.tensor([1.0, 5, 299]).expand(4, 3), atol=2e-3, rtol=1e-5)
        assert torch.isfinite(LapSum(beta=beta).soft_rank(s)).all()


def test_threshold_matches_bisection():
    s = _rand(3, 50, seed=5, scale=3.0)
    beta = 1.3
    w = torch.tensor([[0.01, 7.5, 49.9], [1.0, 25.0, 49.0], [0.5, 0.6, 33.3]], dtype=F64)
    b = lapsum_mod._LapSumInverse.apply(s, w, beta)[0]
    lo = s.min(1, keepdim=True).values.expand_as(w) - 60.0
    hi = s.max(1, keepdim=True).values.expand_as(w) + 60.0
    for _ in range(300):  # Lap is decreasing in x for α < 0
        mid = (lo + hi) / 2
        val = torch.stack([_lap(mid[i], s[i], beta) for i in range(3)])
        lo, hi = torch.where(val > w, mid, lo), torch.where(val > w, hi, mid)
    torch.testing.assert_close(b, (lo + hi) / 2, atol=1e-10, rtol=0)
    torch.testing.assert_close(torch.stack([_lap(b[i], s[i], beta) for i in range(3)]), w, atol=1e-10, rtol=0)


def test_limits_and_monotonicity():
    s = _rand(4, 9, seed=2)
    hard = torch.zeros_like(s).scatter_(1, s.topk(3, dim=1).indices, 1.0)
    errs = [float((_topk(s, 3, beta=b) - hard).abs().max()) for b in (1.0, 10.0, 100.0, 1e4)]
    assert errs == sorted(errs, reverse=True) and errs[0] > 0.1 and errs[-1] < 1e-6
    torch.testing.assert_close(_topk(s, 3, beta=1e-6), torch.full_like(s, 3 / 9), atol=1e-5, rtol=0)
    # raising one score raises its own membership and lowers every other one
    for i in range(9):
        bumped = s.clone()
        bumped[:, i] += 0.3
        d = _topk(bumped, 3, beta=2.0) - _topk(s, 3, beta=2.0)
        assert (d[:, i] > 0).all()
        assert (torch.cat([d[:, :i], d[:, i + 1:]], 1) <= 1e-15).all()
    ranks = s.argsort(1, descending=True).argsort(1).to(F64) + 1
    torch.testing.assert_close(LapSum(beta=1e4).soft_rank(s), ranks, atol=1e-6, rtol=0)
    r = LapSum(beta=0.5).soft_rank(s)
    torch.testing.assert_close(r.sum(1), torch.full((4,), 45.0, dtype=F64))
    torch.testing.assert_close(LapSum(beta=1e-7).soft_rank(s), torch.full_like(s, 5.0), atol=1e-5, rtol=0)


def test_sort_shift_and_jacobian_rows():
    s = _rand(2, 8, seed=3)
    op = LapSum(beta=1.5)
    torch.testing.assert_close(op.soft_sort(s + 2.5), op.soft_sort(s) + 2.5)
    jac = torch.autograd.functional.jacobian(lambda x: op.soft_sort(x)[0], s[:1])[:, 0]
    torch.testing.assert_close(jac.sum(1), torch.ones(8, dtype=F64))
    assert (jac >= 0).all()


def test_permutation_doubly_stochastic_and_equivariant():
    s = _rand(3, 12, seed=4)
    P = LapSum(beta=0.7)(s)
    torch.testing.assert_close(P.sum(-1), torch.ones(3, 12, dtype=F64), atol=1e-10, rtol=0)
    torch.testing.assert_close(P.sum(-2), torch.ones(3, 12, dtype=F64), atol=1e-10, rtol=0)
    assert (P >= 0).all()
    torch.testing.assert_close(P[:, :4].sum(1), _topk(s, 4, beta=0.7), atol=1e-12, rtol=0)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(LapSum(beta=0.7)(s[:, perm]), P[:, :, perm])


def test_gradcheck_custom_backwards(monkeypatch):
    s = _rand(3, 7, seed=6).requires_grad_()
    k = torch.tensor([[1.5, 3.0], [2.2, 6.9], [0.3, 4.0]], dtype=F64, requires_grad=True)
    assert gradcheck(lambda x, kk: _topk(x, kk, beta=1.7), (s, k))
    op = LapSum(beta=1.3)
    assert gradcheck(op.soft_rank, (s,))
    assert gradcheck(op.soft_sort, (s,))
    assert gradcheck(lambda x: op(x, k=3), (s,))
    assert gradcheck(lambda x: op.topk_membership(x, [1, 4, 7]), (s,))
    ties = torch.tensor([[1.0, 1.0, 0.0, 2.0, 2.0]], dtype=F64, requires_grad=True)
    assert gradcheck(op.soft_rank, (ties,)) and gradcheck(op, (ties,))
    monkeypatch.setattr(lapsum_mod, "_DENSE_MAX_TARGETS", 0)  # the O(n log n) sweep
    assert gradcheck(op.soft_sort, (s,)) and gradcheck(op, (s,))
    w = torch.tensor([[0.2, 6.8, 3.3], [1.0, 2.0, 3.0], [5.5, 0.5, 2.5]], dtype=F64)
    assert gradcheck(lambda x: lapsum_mod._LapSumInverse.apply(x, w, 0.7)[0], (s,))


def test_sweep_vjp_equals_dense_at_larger_n(monkeypatch):
    s = _rand(2, 300, seed=7, scale=2.0).requires_grad_()
    g = _rand(2, 300, seed=8)
    op = LapSum(beta=2.0)
    (dense,) = torch.autograd.grad((op.soft_sort(s) * g).sum(), s)
    monkeypatch.setattr(lapsum_mod, "_DENSE_MAX_TARGETS", 10**9)
    (ref,) = torch.autograd.grad((op.soft_sort(s) * g).sum(), s)
    torch.testing.assert_close(dense, ref, atol=1e-10, rtol=1e-8)
    # rank VJP against the O(n²) Jacobian of R_i = 1 + Σ_{j≠i} F(β(s_j - s_i))
    (ours,) = torch.autograd.grad((op.soft_rank(s) * g).sum(), s)
    d = 2.0 * (s.unsqueeze(-2) - s.unsqueeze(-1))  # [i, j] = β(s_j - s_i)
    e = torch.exp(-d.abs())
    F = torch.where(d <= 0, 0.5 * e, 1 - 0.5 * e)
    R = 1 + F.sum(-1) - 0.5
    (ref,) = torch.autograd.grad((R * g).sum(), s)
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=1e-8)


def test_k_equal_n_and_bad_k():
    s = _rand(2, 5)
    torch.testing.assert_close(LapSum().topk_membership(s, [5]), torch.ones(2, 1, 5, dtype=F64))
    for bad in (0.0, -1.0, 5.5, float("nan")):
        with pytest.raises(ValueError, match="k must satisfy"):
            _topk(s, bad, beta=1.0)
    with pytest.raises(TypeError):
        _topk(s, "2", beta=1.0)
    with pytest.raises(ValueError, match="shape"):
        _topk(s, torch.ones(3), beta=1.0)
    with pytest.raises(ValueError, match="beta"):
        _topk(s, 2.0, beta=0.0)


def test_config_and_half_precision():
    op = load("lapsum", beta=2.0)
    assert isinstance(op, LapSum) and op.beta == 2.0
    s = _rand(2, 6, dtype=torch.float32)
    for dt in (torch.float16, torch.bfloat16):
        out = op.topk_membership(s.to(dt), [2])
        assert out.dtype == dt
        torch.testing.assert_close(out.float(), op.topk_membership(s, [2]), atol=2e-2, rtol=0)


def test_operator_takes_real_valued_k():
    """LapSum's topk_membership takes real k (paper §3.3, Thm 3.3): floats, and tensors that may require grad."""
    s = _rand(3, 7, seed=9)
    op = LapSum(beta=1.5)
    out = op.topk_membership(s, [0.3, 2.5, 7.0])
    assert out.shape == (3, 3, 7)
    torch.testing.assert_close(out.sum(-1), torch.tensor([0.3, 2.5, 7.0], dtype=F64).expand(3, 3), atol=1e-12, rtol=0)
    torch.testing.assert_close(out[:, 1], _topk(s, 2.5, beta=1.5))
    torch.testing.assert_close(op.topk_membership(s, 2.5)[:, 0], out[:, 1])
    # integer ks give the same as the real ones they equal
    torch.testing.assert_close(op.topk_membership(s, [2]), op.topk_membership(s, [2.0]))
    # tensors: (M,) shared by every row, (B, M) per row, with a gradient for k
    torch.testing.assert_close(op.topk_membership(s, torch.tensor([0.3, 2.5, 7.0])), out)
    k = torch.tensor([[1.5], [2.5], [3.5]], dtype=F64, requires_grad=True)
    per_row = op.topk_membership(s, k)
    torch.testing.assert_close(per_row.sum(-1), k.detach(), atol=1e-12, rtol=0)
    (per_row[:, 0, 0]).sum().backward()
    assert k.grad is not None and (k.grad > 0).all()  # raising k raises every membership
    for bad in ([0.0], [7.5], [float("nan")], torch.tensor([1.0, 8.0]), torch.tensor([[1.0]] * 3) * 0):
        with pytest.raises(ValueError, match="k must satisfy"):
            op.topk_membership(s, bad)
    with pytest.raises(TypeError):
        op.topk_membership(s, [True])
    with pytest.raises(ValueError, match="shape"):
        op.topk_membership(s, torch.ones(2, 1))
    # the other operators keep integer k
    with pytest.raises(TypeError, match="integer"):
        load("neuralsort").topk_membership(s, [2.5])


def test_cpu_numba_thresholds_equal_the_torch_closed_form():
    """The CPU top-k forward's numba inverse (lapsum_cpu, O(n) recurrences) = the logcumsumexp closed form, to
    1e-12 relative, over 1e-3 <= β <= 1e8, scales 1e-6 .. 1e30, targets at the tails, the middle and k = n."""
    from diffrank.operators.lapsum import _sorted_knots, _thresholds
    from diffrank.operators.lapsum_cpu import thresholds

    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 300):
        for beta in (1e-3, 1.0, 1e3, 1e8):
            for scale in (1e-6, 1.0, 1e30):
                x = torch.randn(3, n, dtype=torch.float64, generator=g) * scale
                w = torch.tensor([0.5, 1.0, n / 2, n - 0.5, float(n)], dtype=torch.float64)
                w = w.clamp(min(0.5, n), n).expand(3, 5)
                a, b = _thresholds(_sorted_knots(x, beta)[0], w), thresholds(x, beta, w)
                assert torch.equal(torch.isfinite(a), torch.isfinite(b))
                fin = torch.isfinite(a)
                assert ((a - b).abs() / (1 + a.abs()))[fin].max() < 1e-12


def _topk_and_grads(fn, x, k, seed=1):
    """``fn(x, k)`` memberships and the gradients of Σ(w ⊙ p) with respect to x and k (when k is a tensor)."""
    xx = x.clone().requires_grad_()
    kk = k.clone().requires_grad_() if isinstance(k, torch.Tensor) else k
    p = fn(xx, kk)
    w = torch.randn(p.shape, dtype=F64, generator=torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad((p * w).sum(), (xx, kk) if isinstance(kk, torch.Tensor) else (xx,))
    return (p.detach(), *grads)


def test_cpu_numba_topk_equals_the_torch_path():
    """CPU top-k in two numba calls (_LapSumTopKNumba) = the PyTorch path (_LapSumTopK) in values and in the
    gradients for scores and k, to 1e-13 relative in float64 (1e-12 where the forward selects the top 2k + 2), over
    1e-3 <= β <= 1e8, scales 1e-6 .. 1e30, ties, k at the tails, the middle and k = n, ks as a list and a (B, M)
    tensor; float32 (computed in float64) to float32 rounding."""
    def path(numba, beta):
        def f(x, k):
            if numba:
                return lapsum_mod._LapSumTopKNumba.apply(x, k, beta)
            k = (k if isinstance(k, torch.Tensor) else torch.tensor(k, dtype=x.dtype)).expand(x.shape[0], -1)
            return lapsum_mod._LapSumTopK.apply(x, k, beta)[0]
        return f

    g = torch.Generator().manual_seed(0)
    cases = [(n, beta, scale) for n in (1, 2, 5, 300) for beta in (1e-3, 1.0, 1e3, 1e8) for scale in (1e-6, 1.0, 1e30)]
    cases += [(5000, 1.0, 1.0), (5000, 1e3, 1e-2)]  # n >= 2048: the kernel's radix sort, not its quicksort
    # integer-valued scores: ties, also at the m-th largest, where the selection of the forward cuts the row
    cases += [(300, 1.0, -1.0), (5000, 2.0, -1.0)]
    for n, beta, scale in cases:
        ks = sorted({min(0.5, n), 1.0, n / 2, max(n - 0.5, 0.5), float(n)})
        x = torch.randn(3, n, dtype=F64, generator=g) * scale if scale > 0 else torch.randint(
            0, 4, (3, n), generator=g).to(F64)
        kb = torch.tensor(ks, dtype=F64).repeat(3, 1) * torch.tensor([[1.0], [0.9], [1.0]], dtype=F64)
        # small ks only (k <= n/8): the forward selects the top 2k + 2 instead of sorting the row
        small = [k for k in (0.5, 1.0, 2.5, 7.0) if 4 * (int(2 * k) + 2) <= n]
        for k in (ks, kb.clamp(max=n)) + ((small,) if small else ()):
            new = _topk_and_grads(path(True, beta), x, k)
            old = _topk_and_grads(path(False, beta), x, k)
            for a, b in zip(new, old):
                assert torch.equal(torch.isfinite(a), torch.isfinite(b))
                size = float(b.abs().max()) or 1.0
                # the selection path forms e^{t + βs} as e^{t + β s_ref} e^{β(s - s_ref)}: exponents of size β|s| ~ 10³
                # carry ~1e-13 relative rounding in either form
                tol = 1e-12 if k is small else 1e-13
                assert float((a - b).abs().max()) <= tol * size, (n, beta, scale, k if type(k) is list else "tensor")
    x = _rand(4, 500, seed=3, dtype=torch.float32)
    p32, g32 = _topk_and_grads(path(True, 1.0), x, [5.0])
    p64, g64 = _topk_and_grads(path(True, 1.0), x.double(), [5.0])
    assert p32.dtype == g32.dtype == torch.float32
    torch.testing.assert_close(p32, p64.float(), atol=0, rtol=0)  # p: one rounding of the float64 result
    torch.testing.assert_close(g32, g64.float(), atol=1e-6, rtol=1e-5)
    pt, gt = _topk_and_grads(path(False, 1.0), x, [5.0])  # the PyTorch path computes in float32
    torch.testing.assert_close(p32, pt, atol=1e-5, rtol=0)
    torch.testing.assert_close(g32, gt, atol=1e-5, rtol=1e-4)
    # the operator takes this path for float32 / float64 CPU scores, not for half precision (computed in float32)
    op = LapSum(2.0)
    assert op._numba_topk(S) and op._numba_topk(S.float()) and not op._numba_topk(S.half())


def test_cpu_numba_topk_checks_finite_scores_itself():
    """The float64 CPU top-k tests NaN / inf in its numba pass (validation skips its own read): the same error,
    for every row, with or without another pending check (then validation reads both, finite first)."""
    op = LapSum(1.0)
    for bad in (float("nan"), float("inf"), -float("inf")):
        for n in (3, 5000):
            x = _rand(3, n, seed=2)
            x[2, n - 1] = bad
            for ks in ([1], torch.tensor([1.0]), torch.tensor([[1.0], [2.0], [0.0]])):
                with pytest.raises(ValueError, match="scores contain non-finite values"):
                    op.topk_membership(x, ks)
            with pytest.raises(ValueError, match="scores contain non-finite values"):
                F.topk_membership(x, 2, method="lapsum")
    for modify in ("scores", "p"):  # the backward reads both through numpy views: autograd's version check
        x = _rand(2, 4, seed=3).requires_grad_()
        p = op.topk_membership(x, [2])
        with torch.no_grad():
            (x if modify == "scores" else p).add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            p.sum().backward()


def test_cpu_radix_sort_equals_numpy_sort():
    """The top-k kernel's radix sort (n >= 2048) and its selection of the m largest = numpy.sort: signs, ±0,
    subnormals, the extremes, ties, and rows whose high bytes are all equal (skipped passes); numba's compiled code
    (the ahead-of-time module compiles the same, test_ahead_of_time_module)."""
    import numpy as np

    from diffrank.operators.lapsum_cpu import KERNELS

    _radix_sorted, _largest_sorted = KERNELS.dispatcher("_radix_sorted"), KERNELS.dispatcher("_largest_sorted")

    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 5e-324, -5e-324, 2.2e-308, -2.2e-308, 1.7e308, -1.7e308, 1.0, -1.0, 1.0])
    for a in (rng.standard_normal(3000), rng.standard_normal(2048) * 1e300, rng.integers(-3, 3, 2500) * 1.0,
              1.0 + rng.random(4096) * 1e-12, np.concatenate([special, rng.standard_normal(3000)]), special,
              np.full(2048, -2.5)):
        got = _radix_sorted(a)
        assert np.array_equal(got, np.sort(a)) and np.array_equal(np.signbit(got[got != 0]), np.signbit(
            np.sort(a)[np.sort(a) != 0]))
        for m in (1, 2, 12, 64):  # the top-k forward's selection of the m largest (k <= n/8)
            assert np.array_equal(_largest_sorted(a, min(m, a.shape[0])), np.sort(a)[-min(m, a.shape[0]):])


def _capabilities(op):
    """Every LapSum capability as a function of the scores (float64)."""
    kt = torch.tensor([[1.5, 3.0], [2.2, 6.9]], dtype=F64)
    return {
        "topk int": lambda x: op.topk_membership(x, [2, 5]),
        "topk real": lambda x: op.topk_membership(x, [0.7, 3.5, 7.0]),
        "topk tensor k": lambda x: op.topk_membership(x, kt[: x.shape[0]]),
        "soft_rank": op.soft_rank,
        "soft_sort": op.soft_sort,
        "permutation": op,
        "permutation k": lambda x: op(x, k=3),
        "inverse": lambda x: op.inverse(x, torch.tensor([0.4, 2.5, 6.1], dtype=F64)),
    }


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_second_derivatives_are_exact(backend):
    """gradgradcheck of every capability (the CPU top-k's numba path, backend="auto", and the PyTorch closed form),
    for the scores and for a k that requires grad; Hessian-vector products through the soft rank equal central
    differences of the gradient (the values the Gauss-Newton-only backward missed by 4.5-13)."""
    op = LapSum(1.3, backend=backend)
    s = _rand(2, 7, seed=11).requires_grad_()
    for name, f in _capabilities(op).items():
        assert gradgradcheck(f, (s,)), name
    k = torch.tensor([[1.5, 3.0], [2.2, 6.9]], dtype=F64, requires_grad=True)
    assert gradgradcheck(lambda x, kk: op.topk_membership(x, kk), (s, k))
    x = _rand(1, 7, seed=12)
    w = _rand(1, 7, seed=13)
    for f in (op.soft_rank, op.soft_sort, lambda z: op.topk_membership(z, [2.5])[:, 0]):
        def grad(z, f=f):
            z = z.clone().requires_grad_()
            (g,) = torch.autograd.grad((f(z) * w).sum(), z, create_graph=True)
            return g
        for j in range(7):
            u = torch.zeros(1, 7, dtype=F64)
            u[0, j] = 1.0
            z = x.clone().requires_grad_()
            (hvp,) = torch.autograd.grad(grad(z), z, u)
            fd = (grad(x + 1e-5 * u) - grad(x - 1e-5 * u)) / 2e-5
            torch.testing.assert_close(hvp, fd.detach(), atol=1e-6, rtol=1e-5)


def test_hessian_of_topk_is_not_zero():
    """torch.autograd.functional.hessian through topk_membership: the gradient carries its graph (it returned
    zeros when the backward was not differentiable) and equals finite differences."""
    op = LapSum(1.0)
    w = _rand(1, 6, seed=14)
    x0 = _rand(1, 6, seed=15)
    f = lambda x: (op.topk_membership(x, [2])[:, 0] * w).sum()  # noqa: E731
    H = torch.autograd.functional.hessian(f, x0)
    assert float(H.abs().max()) > 0.05
    eye = torch.eye(6, dtype=F64).unsqueeze(1)
    grad = lambda x: torch.autograd.functional.jacobian(f, x)  # noqa: E731
    fd = torch.stack([(grad(x0 + 1e-5 * e) - grad(x0 - 1e-5 * e)) / 2e-5 for e in eye]).reshape(6, 6)
    torch.testing.assert_close(H.reshape(6, 6), fd, atol=1e-6, rtol=1e-5)


def test_learnable_beta():
    """A β tensor that requires grad stays in the graph: gradcheck (and gradgradcheck) in β for every capability, on
    the numba and PyTorch paths; beta.grad fills; the values equal those of the float β."""
    s = _rand(2, 7, seed=16)
    for backend in ("auto", "torch"):
        for name in _capabilities(LapSum(1.0)):
            def f(x, b, name=name, backend=backend):
                return _capabilities(LapSum(b, backend=backend))[name](x)
            b = torch.tensor(2.0, dtype=F64, requires_grad=True)
            assert gradcheck(f, (s.clone().requires_grad_(), b)), (backend, name)
            if backend == "auto" and name in ("topk real", "soft_sort"):
                assert gradgradcheck(f, (s.clone().requires_grad_(), b)), (backend, name)
            torch.testing.assert_close(f(s, b).detach(), _capabilities(LapSum(2.0, backend=backend))[name](s))
    beta = torch.tensor(2.0, requires_grad=True)
    LapSum(beta).topk_membership(s.float(), [2])[:, 0, 0].sum().backward()
    assert beta.grad is not None and beta.grad != 0
    assert LapSum.learnable_beta and LapSum.twice_differentiable


def _hooks(op):
    """The hooks behind the public methods (validation is base.py's: its finite check under torch.func is tested
    with the public methods), as functions of one set of scores ``(n,)`` for torch.func."""
    one = lambda h: lambda x: h(x.unsqueeze(0))[0]  # noqa: E731
    return {
        "topk list": one(lambda x: op._topk_membership(x, [2, 3.5])),
        "topk tensor": one(lambda x: op._topk_membership(x, torch.tensor([2.0, 3.5], dtype=x.dtype))),
        "soft_rank": one(op._soft_rank),
        "soft_sort": one(op._soft_sort),
        "permutation": one(lambda x: op._permutation(x, None)),
    }


def test_torch_func_vmap_grad_jacrev():
    """torch.func: vmap over sets = the loop, grad = autograd, jacrev = the autograd Jacobian, for every capability
    (the custom Functions' setup_context and vmap rules; the numba paths give way to the PyTorch ones)."""
    op = LapSum(1.3)
    xs = _rand(3, 6, seed=17)
    for name, f in _hooks(op).items():
        torch.testing.assert_close(torch.func.vmap(f)(xs), torch.stack([f(x) for x in xs]), msg=name)
        w = torch.randn(f(xs[0]).shape, dtype=F64, generator=torch.Generator().manual_seed(0))
        x = xs[0].clone().requires_grad_()
        (ref,) = torch.autograd.grad((f(x) * w).sum(), x)
        loss = lambda z, f=f, w=w: (f(z) * w).sum()  # noqa: E731
        torch.testing.assert_close(torch.func.grad(loss)(xs[0]), ref, msg=name)
        torch.testing.assert_close(torch.func.jacrev(f)(xs[0]), torch.autograd.functional.jacobian(f, xs[0]), msg=name)
        torch.testing.assert_close(torch.func.jacrev(torch.func.jacrev(loss))(xs[0]),
                                   torch.autograd.functional.hessian(loss, xs[0]), msg=name)


@pytest.mark.slow
def test_torch_compile_first_call_equals_eager():
    """torch.compile with the first call compiled (dynamo used to crash inside numba): values and gradients of every
    capability equal eager mode (graph breaks allowed)."""
    op = LapSum(1.3)

    def f(s):
        return (op.topk_membership(s, [2, 3.5]).sum(1) * 1.5).sum(-1) + op.soft_rank(s).pow(2).sum(-1) + \
            op.soft_sort(s).pow(2).sum(-1) + op(s).pow(3).sum((1, 2))

    x = _rand(2, 6, seed=18)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = torch.compile(f)(a)
    out.sum().backward()
    ref = f(b)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(a.grad, b.grad)


_AOT_SCRIPT = """
import sys
import torch
from diffrank.operators import lapsum_cpu as cpu
outs = []
gen = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.float64):
    # n = 10 (whole row sorted by quicksort), 300 with small k (sorted buffer) and k = 40 (partition), 3000 (radix)
    for n, ks in ((10, [1.0, 2.5, 10.0]), (300, [3.0, 7.5]), (300, [40.0]), (3000, [5.0, 2000.0])):
        s = torch.randn(4, n, dtype=dtype, generator=gen) * 3
        for k in (ks, torch.rand(4, len(ks), dtype=torch.float64, generator=gen) * n):
            p, state = cpu.topk_forward(s, k, 1.3)
            g = torch.randn(p.shape, dtype=dtype, generator=gen)
            outs += [p.clone(), *cpu.topk_backward(state, g, 1.3)]
        outs.append(cpu.thresholds(s, 0.7, torch.rand(4, 3, dtype=dtype, generator=gen) * n))
    try:
        cpu.topk_forward(torch.tensor([[0.0, float("nan")]], dtype=dtype), [1.0], 1.0)
    except ValueError:
        outs.append(torch.ones(()))
torch.save(outs, sys.argv[1])
print("numba" in sys.modules)
"""


@pytest.mark.slow
def test_ahead_of_time_module(tmp_path):
    """``python -m diffrank.operators.aot --build`` writes a module for the CPU kernels that a fresh process loads
    without importing numba, and whose values / gradients / thresholds / NaN test equal numba's JIT
    (DIFFRANK_LAPSUM_AOT=0), on every path of the forward (quicksort, sorted buffer, partition, radix sort)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DIFFRANK_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-c", "from diffrank.operators.lapsum_cpu import KERNELS; KERNELS.build()"],
                   env=env, check=True, capture_output=True, timeout=600)
    script = tmp_path / "run.py"
    script.write_text(_AOT_SCRIPT)
    res = {}
    for mode in ("auto", "0"):
        out = tmp_path / f"{mode}.pt"
        proc = subprocess.run([sys.executable, str(script), str(out)], env={**env, "DIFFRANK_LAPSUM_AOT": mode},
                              check=True, capture_output=True, text=True, timeout=600)
        assert proc.stdout.strip() == ("False" if mode == "auto" else "True")  # numba imported only by the JIT
        res[mode] = torch.load(out)
    assert len(res["auto"]) == len(res["0"]) == 2 * (4 * 2 * 3 + 4 + 1)
    for a, b in zip(res["auto"], res["0"]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_ahead_of_time_module_absent_or_broken(tmp_path, monkeypatch):
    """Without a loadable ahead-of-time module (none in the cache directory, or a file that is no extension), the
    kernels fall back to numba's JIT and compute the same top-k."""
    from diffrank.operators import aot, lapsum_cpu

    monkeypatch.setenv("DIFFRANK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DIFFRANK_LAPSUM_AOT", raising=False)
    s = _rand(3, 50, seed=4)
    p_ref, state = lapsum_cpu.topk_forward(s, [2.0, 7.5], 1.1)
    ks = lapsum_cpu.KERNELS
    for broken in (False, True):
        fresh = aot.Kernels(ks.prefix, str(ks.source), ks.namespace, ks.exports, ks.helpers, ks.env)
        assert fresh.path().parent == tmp_path / "aot"
        if broken:
            fresh.path().parent.mkdir(parents=True, exist_ok=True)
            fresh.path().write_bytes(b"not a shared object")
        fwd = fresh("_topk_forward_rows", "f8")
        assert hasattr(fwd, "py_func")  # numba's dispatcher
        s_np, kn, t, p = state
        t2, p2 = t.copy(), p.copy()
        assert fwd(s_np, kn, 1.1, t2, p2)
        torch.testing.assert_close(torch.from_numpy(p2), p_ref, rtol=0, atol=0)
    monkeypatch.setenv("DIFFRANK_LAPSUM_AOT", "0")
    assert aot.Kernels(ks.prefix, str(ks.source), ks.namespace, ks.exports, ks.helpers, ks.env)._load() is None


def test_ahead_of_time_command_lists_the_modules():
    """``python -m diffrank.operators.aot`` (without ``--build``) lists the ahead-of-time modules it builds."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "diffrank.operators.aot"], capture_output=True, text=True,
                         timeout=300, check=True)
    assert "_diffrank_lapsum_" in out.stdout and "_diffrank_fss_" in out.stdout, out.stdout


def test_ahead_of_time_entry_points_refuse_non_contiguous_arrays():
    """pycc's wrappers do not check layout: a Fortran-ordered array (an expanded k copied by ``np.array``) read as
    C-contiguous gave garbage memberships; the loader's wrapper refuses it, and the ks are copied in C order."""
    from diffrank.operators.aot import _c_contiguous_only
    from diffrank.operators.lapsum_cpu import _ks_array

    kernel = _c_contiguous_only(lambda *a: "ran", "k_f8")
    assert kernel(np.zeros((2, 3)), 1.0) == "ran"
    with pytest.raises(ValueError, match="k_f8: argument 0 is not C-contiguous"):
        kernel(np.asfortranarray(np.zeros((2, 3))))
    assert _ks_array(torch.tensor([[0.3, 2.5]]).expand(3, 2)).flags.c_contiguous
