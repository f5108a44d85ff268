"""The fused log-domain Sinkhorn kernel against the PyTorch loop (interpreter on the CPU, compiled on CUDA):
same iterations, same plan, same gradient."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_devices import DEVICE, DEVICES, ON_DEVICE, both_backends
from torch import Tensor

from diffrank.operators.base import DoubleBackwardError
from diffrank.operators.log_sinkhorn import SinkhornSchedule, log_sinkhorn
from diffrank.operators.sinkhorn import SinkhornSort

pytestmark = pytest.mark.triton

def _both(s: Tensor, k: int, **kwargs) -> list[tuple[Tensor, Tensor, int]]:
    """P, ∂⟨P, W⟩/∂s and the iterations used, from the PyTorch loop and from the kernel, for the same W."""
    return [(p, g, op.last_iterations)
            for p, g, op in both_backends(lambda backend: SinkhornSort(backend=backend, **kwargs), s, k)]


F32, F64 = torch.float32, torch.float64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k,dtype", [(1, 1, F32), (2, 1, F32), (5, 5, F64), (37, 4, F32), (31, 31, F64),
                                       (64, 3, F32)])  # up to the largest tiles the kernel gets (fused_size)
def test_forward_backward_match_pytorch(n, k, dtype, device):
    s = torch.randn(2, n, generator=torch.Generator().manual_seed(n), dtype=dtype).to(device)
    (pa, ga, ia), (pb, gb, ib) = _both(s, k, beta=30.0)
    assert ib == ia and pb.shape == (2, k, n) and pb.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(pb, pa, atol=tol, rtol=1e-5)
    torch.testing.assert_close(gb, ga, atol=tol, rtol=1e-5)


@pytest.mark.parametrize("schedule", [dict(tolerance=None, max_iter=40), dict(epsilon_start=None, max_iter=60),
                                      dict(max_iter=7, check_every=3)])
@ON_DEVICE
def test_every_schedule_runs_the_same_iterations(schedule):
    """Fixed count, plain Sinkhorn (no ε-scaling) and a cap reached during the scaling (log Γ then at ε_7)."""
    s = torch.randn(2, 19, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    (pa, ga, ia), (pb, gb, ib) = _both(s, 19, beta=50.0, **schedule)
    assert ib == ia
    torch.testing.assert_close(pb, pa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gb, ga, atol=1e-5, rtol=1e-5)


@ON_DEVICE
def test_per_row_epsilon_and_rectangular_cost():
    """``log_sinkhorn`` itself: costs scaled per row (ε_0 per row), n ≠ m, non-uniform target masses."""
    g = torch.Generator().manual_seed(0)
    cost = (torch.rand(3, 11, 4, generator=g) * torch.tensor([1.0, 5.0, 0.2]).view(3, 1, 1)).to(DEVICE)
    log_mu = torch.full((1, 11), -math.log(11), device=DEVICE)
    log_nu = torch.log_softmax(torch.randn(3, 4, generator=g), dim=-1).to(DEVICE)
    w = torch.randn(3, 11, 4, generator=g).to(DEVICE)
    schedule = SinkhornSchedule(max_iter=300, tolerance=1e-3, check_every=4, epsilon_start=0.5, anneal=0.6)
    out = []
    for kernel in (False, True):
        leaves = [x.clone().requires_grad_() for x in (cost, log_mu, log_nu)]
        log_t, it, err = log_sinkhorn(*leaves, 0.1, schedule, None, kernel=kernel)
        (log_t.exp() * w).sum().backward()  # random weights: a linear function of the indices is constant on Γ
        out.append((log_t, it, err, [x.grad for x in leaves]))
    (ta, ia, ea, grads_a), (tb, ib, eb, grads_b) = out
    assert ib == ia and ea < 1e-3 and abs(eb - ea) < 1e-6
    torch.testing.assert_close(tb.exp(), ta.exp(), atol=1e-5, rtol=1e-5)
    for gb, ga in zip(grads_b, grads_a):  # ∂C, ∂log μ (broadcast over the rows), ∂log ν
        assert gb.shape == ga.shape
        # ∂/∂C carries a factor 1/ε = 10: the same float32 rounding, scaled
        torch.testing.assert_close(gb, ga, atol=1e-5 * float(ga.abs().max()), rtol=1e-5)
    with torch.no_grad():  # no gradient wanted: the kernel records no history, same plan
        tc, ic, _ = log_sinkhorn(cost, log_mu, log_nu, 0.1, schedule, None, kernel=True)
    assert ic == ia
    torch.testing.assert_close(tc, tb, atol=0, rtol=0)


@ON_DEVICE
def test_double_backward_is_refused():
    cost = torch.rand(1, 4, 4, device=DEVICE, requires_grad=True)
    w = torch.full((1, 4), -math.log(4), device=DEVICE)
    log_t, _, _ = log_sinkhorn(cost, w, w, 0.1, SinkhornSchedule(max_iter=5, tolerance=None), 1.0, kernel=True)
    (grad,) = torch.autograd.grad(log_t.exp().pow(2).sum(), cost, create_graph=True)
    with pytest.raises(DoubleBackwardError, match="backend='torch'"):
        grad.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_pytorch(dtype, device):
    """The operator computes half precision in float32, so float32 reaches the kernel; result in ``dtype``."""
    s = torch.randn(2, 20, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    (pa, ga, _), (pb, gb, _) = _both(s, 3, beta=10.0)
    assert pb.dtype == dtype and gb.dtype == dtype
    torch.testing.assert_close(pb.float(), pa.float(), atol=1e-3, rtol=1e-2)
    torch.testing.assert_close(gb.float(), ga.float(), atol=1e-2 * float(ga.float().abs().max()), rtol=1e-2)


def _forbid_kernel(monkeypatch):
    import diffrank.kernels.sinkhorn as kernel

    def boom(*args, **kwargs):
        raise AssertionError("the Triton kernel was called")

    monkeypatch.setattr(kernel, "sinkhorn_updates", boom)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_torch_backend_never_calls_triton_on_cpu(backend, monkeypatch):
    _forbid_kernel(monkeypatch)
    p = SinkhornSort(beta=30.0, backend=backend)(torch.randn(2, 7), k=3)
    assert p.shape == (2, 3, 7)


@ON_DEVICE
@pytest.mark.parametrize("dtype", [F32, F64])
def test_beyond_the_tile_falls_back_to_pytorch(dtype, monkeypatch):
    from diffrank.kernels.sinkhorn import fused_size

    n = fused_size(dtype) + 1
    _forbid_kernel(monkeypatch)
    p = SinkhornSort(beta=10.0, backend="triton", max_iter=20)(torch.randn(1, n, device=DEVICE, dtype=dtype), k=2)
    assert p.shape == (1, 2, n)


def test_kernel_rejects_bad_arguments():
    from diffrank.kernels.sinkhorn import sinkhorn_updates

    cost = torch.rand(2, 5, 3)
    f, g = torch.zeros(2, 5), torch.zeros(2, 3)
    lmu, lnu = torch.full((1, 5), -math.log(5)), torch.full((1, 3), -math.log(3))
    with pytest.raises(ValueError, match="eps"):
        sinkhorn_updates(cost, lmu, lnu, f, g, torch.ones(1, 0), False)
    with pytest.raises(ValueError, match="f and g"):
        sinkhorn_updates(cost, lmu, lnu, torch.zeros(2, 3), g, torch.ones(1, 2), False)
    with pytest.raises(ValueError, match="float32 or float64"):
        sinkhorn_updates(cost.bfloat16(), lmu, lnu, f, g, torch.ones(1, 2), False)
    with pytest.raises(ValueError, match="at most"):
        sinkhorn_updates(torch.rand(1, 129, 3), lmu, lnu, f, g, torch.ones(1, 2), False)
