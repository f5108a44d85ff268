"""SOFT top-k (Xie et al. 2020): worked numbers of the official code, marginals, implicit gradients."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.autograd import gradcheck

from diffrank.operators import load
from diffrank.operators.log_sinkhorn import SinkhornSchedule, log_sinkhorn
from diffrank.operators.soft_topk import SoftTopK, soft_topk_sorted

F64 = torch.float64
# the reference code's semantics: plain Sinkhorn, a fixed number of iterations, cost / batch max
OFFICIAL = dict(tolerance=None, epsilon_start=None, cost_normalization="batch", solver="sinkhorn")


def _rand(B, n, seed=0):
    return torch.randn(B, n, dtype=F64, generator=torch.Generator().manual_seed(seed))


def test_official_demo_values_and_gradient():
    x = torch.tensor([[5.0, 2, 3, 4, 1, 6]], dtype=F64)  # smallest-3 of x = largest-3 of -x
    s = (-x).requires_grad_()
    a = SoftTopK(beta=20.0, max_iter=100, **OFFICIAL).topk_membership(s, [3])[0, 0]
    torch.testing.assert_close(a, torch.tensor([0.158869, 0.841131, 0.635424, 0.364576, 0.941463, 0.058537],
                                               dtype=F64), atol=1e-6, rtol=0)
    (a[1] + a[2] + a[3]).backward()
    torch.testing.assert_close(-s.grad[0], torch.tensor([0.105416, -0.043062, -0.074652, -0.074652, 0.043475,
                                                         0.043475], dtype=F64), atol=1e-6, rtol=0)


def test_largest_and_sorted_worked_numbers():
    s = torch.tensor([[0.5, -1.2, 2.0, 0.3, 1.1]], dtype=F64)
    a = SoftTopK(beta=10.0, max_iter=200, **OFFICIAL).topk_membership(s, [2])[0, 0]
    torch.testing.assert_close(a, torch.tensor([0.279887, 0.008812, 0.915932, 0.199493, 0.595876], dtype=F64),
                               atol=1e-6, rtol=0)
    a = SoftTopK(beta=100.0, max_iter=200, **OFFICIAL).topk_membership(s, [2])[0, 0]
    torch.testing.assert_close(a, torch.tensor([0.006582, 0.0, 0.996791, 0.000078, 0.996549], dtype=F64),
                               atol=1e-6, rtol=0)
    p = soft_topk_sorted(s, 2, beta=100.0, max_iter=500, **OFFICIAL)[0]
    assert p.shape == (2, 5) and p.argmax(1).tolist() == [2, 4]
    assert abs(float(p[0, 2]) - 0.9979) < 1e-4 and abs(float(p[1, 4]) - 0.9958) < 1e-4


@pytest.mark.parametrize("tolerance", [None, 1e-6])
def test_marginals(tolerance):
    s = _rand(4, 30, seed=1) * 2
    op = SoftTopK(beta=2.0, max_iter=3000, tolerance=tolerance, solver="sinkhorn")
    a = op.topk_membership(s, [1, 7, 29, 30])
    assert a.shape == (4, 4, 30)
    torch.testing.assert_close(a.sum(-1), torch.tensor([1.0, 7, 29, 30], dtype=F64).expand(4, 4), atol=1e-10,
                               rtol=0)  # the anchor-side update is last: exact after every iteration
    assert (a >= 0).all() and (a <= 1 + 1e-6).all()  # A <= 1 holds only up to the item-marginal error
    if tolerance is None:
        assert op.last_iterations == 3000
    else:
        assert op.last_iterations < 3000
    # item marginals: n Σ_j Γ_ij = 1 within the tolerance (sorted variant: rows = ranks sum to 1 exactly)
    p = soft_topk_sorted(s, 5, beta=2.0, tolerance=1e-9, max_iter=5000)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 5, dtype=F64), atol=1e-10, rtol=0)
    assert (p.sum(-2) <= 1 + 1e-8).all()


# near-hard plans (β >= 10) need ~20 000 Sinkhorn iterations for the reference (about a minute each): slow
@pytest.mark.parametrize("beta", [0.5, 2.0, pytest.param(10.0, marks=pytest.mark.slow),
                                  pytest.param(100.0, marks=pytest.mark.slow)])
def test_newton_gives_sinkhorns_plan(beta):
    s = _rand(6, 40, seed=3) * 3
    ks = [1, 5, 20, 39]
    newton = SoftTopK(beta=beta)  # the default solver
    a = newton.topk_membership(s, ks)
    assert newton.last_iterations < 60
    torch.testing.assert_close(a.sum(-1), torch.tensor(ks, dtype=F64).expand(6, 4), atol=1e-10, rtol=0)
    assert (a >= 0).all() and (a <= 1).all()
    # Sinkhorn converges to the same plan; near-hard plans (β >= 10 here) only after very many iterations
    sink = SoftTopK(beta=beta, solver="sinkhorn", tolerance=1e-11 if beta <= 2 else 1e-5, max_iter=20_000,
                    check_every=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        b = sink.topk_membership(s, ks)
    torch.testing.assert_close(a, b, atol=1e-9 if beta <= 2 else 1e-3, rtol=0)  # Sinkhorn's own error at β >= 10


def test_limits_equivariance_and_sorted_consistency():
    g = torch.Generator().manual_seed(2)
    s = (torch.randperm(9, generator=g).to(F64) * 0.5).view(1, 9).repeat(2, 1)
    hard = torch.zeros_like(s).scatter_(1, s.topk(3, dim=1).indices, 1.0)
    assert (SoftTopK(beta=100.0).topk_membership(s, [3])[:, 0] - hard).abs().max() < 1e-6
    torch.testing.assert_close(SoftTopK(beta=1e-4).topk_membership(s, [3])[:, 0], torch.full_like(s, 1 / 3),
                               atol=1e-3, rtol=0)
    # sorted variant: summed over the k ranks it is the top-k indicator as ε → 0
    torch.testing.assert_close(soft_topk_sorted(s, 3, beta=100.0).sum(1), hard, atol=1e-6, rtol=0)
    x = _rand(3, 8, seed=3)
    perm = torch.randperm(8, generator=g)
    op = SoftTopK(beta=3.0)
    torch.testing.assert_close(op.topk_membership(x[:, perm], [3]), op.topk_membership(x, [3])[..., perm])


def _unrolled(s, k, beta, sorted_variant=False, iters=1500):
    n = s.shape[-1]
    if sorted_variant:
        x, y = s, torch.arange(k, -1, -1, dtype=F64)
        nu = torch.full((k + 1,), 1.0 / n, dtype=F64)
        nu[-1] = (n - k) / n
    else:
        x, y = -s, torch.tensor([0.0, 1.0], dtype=F64)
        nu = torch.tensor([k / n, (n - k) / n], dtype=F64)
    C = (x.unsqueeze(-1) - y) ** 2
    plain = SinkhornSchedule(max_iter=iters, tolerance=None, epsilon_start=None)
    log_gam, _, _ = log_sinkhorn(C, torch.full_like(x, -math.log(n)), nu.log().expand(s.shape[0], -1), 1 / beta, plain)
    gam = log_gam.exp()
    return n * (gam[..., :k].transpose(-1, -2) if sorted_variant else gam[..., 0])


@pytest.mark.parametrize("k", [1, 2, 4])
def test_implicit_gradient_equals_unrolled_and_finite_differences(k):
    s = _rand(3, 6, seed=10 + k)
    g = _rand(3, 6, seed=20 + k)
    op = SoftTopK(beta=3.0, max_iter=5000, tolerance=1e-13, check_every=1)
    s1 = s.clone().requires_grad_()
    (op.topk_membership(s1, [k])[:, 0] * g).sum().backward()
    s2 = s.clone().requires_grad_()
    (_unrolled(s2, k, 3.0) * g).sum().backward()
    torch.testing.assert_close(s1.grad, s2.grad, atol=1e-9, rtol=0)
    assert gradcheck(lambda x: op.topk_membership(x, [k]), (s.clone().requires_grad_(),), atol=1e-6)
    # sorted (k + 1 anchors): K is (k, k)
    g3 = _rand(3, k * 6, seed=30 + k).view(3, k, 6)
    s3 = s.clone().requires_grad_()
    (soft_topk_sorted(s3, k, 3.0, max_iter=5000, tolerance=1e-13, check_every=1) * g3).sum().backward()
    s4 = s.clone().requires_grad_()
    (_unrolled(s4, k, 3.0, sorted_variant=True) * g3).sum().backward()
    torch.testing.assert_close(s3.grad, s4.grad, atol=1e-9, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_of_a_numerically_hard_plan_is_finite(dtype):
    # scores 10 apart at β = 10: Γ_i0 Γ_i1 underflows (float32) or is ~1e-87 (float64), K ≈ 0; training on
    # far-apart logits crashed the general solve with "input matrix is singular" before the closed form
    g = torch.Generator().manual_seed(0)
    s = torch.stack([torch.randperm(50, generator=g) for _ in range(8)]).to(dtype).mul(10).requires_grad_()
    a = SoftTopK(beta=10.0).topk_membership(s, [1, 5])
    hard = torch.stack([(s.detach() >= s.detach().topk(k, dim=-1).values[:, -1:]).to(dtype) for k in (1, 5)], 1)
    torch.testing.assert_close(a.detach(), hard, atol=1e-6, rtol=0)
    (a * torch.randn(a.shape, generator=g, dtype=dtype)).sum().backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().max() < 1e-6
    s2 = s.detach().clone().requires_grad_()
    r = soft_topk_sorted(s2, 3, 10.0)
    (r * torch.randn(r.shape, generator=g, dtype=dtype)).sum().backward()
    assert torch.isfinite(s2.grad).all() and s2.grad.abs().max() < 1e-6


def test_capabilities_config_and_errors():
    op = load("soft_topk")
    assert isinstance(op, SoftTopK) and op.capabilities == frozenset({"topk_membership"})
    with pytest.raises(ValueError, match="provides only"):
        op(torch.randn(2, 5))
    for bad in (dict(max_iter=0), dict(tolerance=-1.0), dict(cost_normalization="max"), dict(anneal=1.5),
                dict(epsilon_start=0.0)):
        with pytest.raises(ValueError):
            SoftTopK(**bad)
    with pytest.raises(ValueError, match="k must satisfy"):
        soft_topk_sorted(torch.randn(2, 5), 6, beta=1.0)
    out = SoftTopK(beta=4.0, cost_normalization="row").topk_membership(torch.randn(2, 6).half(), [2])
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


# z_i = (C_i1 - C_i0) / ε of one query of a deep kNN batch on MNIST (SOFT top-k, ε = 1e-3, batch-normalised
# costs), rounded to 3 decimals: the 9th and 10th nearest are 0.036 apart. Plain bracketed Newton ping-ponged
# between Δ ≈ 252.4 and 261.4 here, leaving |Σ A - k| = 3.98 after 2 000 iterations.
_PING_PONG_Z = [
    -392.031, -401.712, -237.938, -291.575, -121.431, -256.079, -340.424, -286.959, -308.18, -355.675,
    -389.745, -264.935, -353.431, -259.985, -398.331, -350.469, -323.851, -380.935, -258.306, -335.278,
    -333.296, -351.088, -248.562, -299.683, -336.254, -347.428, -305.225, -356.799, -449.758, -332.015,
    -363.648, -419.212, -372.68, -222.264, -256.043, -342.284, -388.137, -369.34, -425.989, -289.059,
    -294.651, -347.262, -312.528, -300.503, -339.532, -332.657, -295.158, -325.587, -342.532, -390.631,
    -309.857, -326.681, -391.507, -262.528, -333.391, -302.118, -311.567, -348.693, -329.955, -425.798,
    -324.383, -398.547, -303.068, -360.81, -347.464, -247.927, -364.844, -287.372, -269.404, -336.077,
    -354.936, -361.397, -425.599, -295.113, -340.996, -355.485, -234.971, -257.705, -338.695, -358.311,
    -328.586, -294.569, -427.956, -356.25, -411.761, -298.432, -381.959, -317.586, -212.426, -293.451,
    -329.322, -347.029, -348.667, -336.694, -383.235, -346.116, -377.34, -248.642, -318.473, -287.541
]


def test_newton_does_not_ping_pong_between_steep_sigmoids():
    from diffrank.operators.soft_topk import _two_anchor_newton

    z = torch.tensor(_PING_PONG_Z, dtype=torch.float64).unsqueeze(0)
    C = torch.stack([torch.zeros_like(z), z], -1)
    log_nu = torch.log(torch.tensor([[0.09, 0.91]], dtype=torch.float64))
    gam, iterations, err = _two_anchor_newton(C, log_nu, 1.0, 200)
    assert err < 1e-11 and iterations < 60
    torch.testing.assert_close(gam[0, :, 0].sum() * 100, torch.tensor(9.0, dtype=torch.float64))
