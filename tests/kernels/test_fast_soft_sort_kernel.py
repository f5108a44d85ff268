"""The fast soft sort / rank Triton kernels (PAV, forward and VJP) against the CPU kernels (interpreter on the CPU,
compiled on CUDA): float64 and float32, random rows, kinks and ties, shared rows, B = 0, n = 1, n = 10⁵."""

from __future__ import annotations

import pytest
import torch
from kernel_devices import DEVICES, INTERPRET
from torch import Tensor

from diffrank import functional as F
from diffrank.operators import fast_soft_sort as fss
from diffrank.operators import fast_soft_sort_cpu
from diffrank.operators.fast_soft_sort import FastSoftSort

pytestmark = pytest.mark.triton

TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-6, atol=1e-5)}
METHODS = ("soft_rank", "soft_sort", "_soft_rank_ascending", "_soft_sort_ascending")


def _run(backend: str, method: str, reg: str, x: Tensor, beta: float, g: Tensor) -> tuple[Tensor, Tensor]:
    """(output, ∂⟨output, g⟩/∂x) of ``FastSoftSort(beta, reg, backend).<method>(x)``; the ascending forms through
    the validated template (as :mod:`diffrank.compat.torchsort` calls them)."""
    op = FastSoftSort(beta, reg, backend=backend)
    xx = x.clone().requires_grad_()
    call = getattr(op, method) if not method.startswith("_") else (
        lambda s: op._per_item("soft_rank" if "rank" in method else "soft_sort", method, s, getattr(op, method)))
    out = call(xx)
    (out * g).sum().backward()
    return out.detach(), xx.grad


def _compare(x: Tensor, beta: float, reg: str, methods=METHODS) -> None:
    """Triton against the CPU kernels (``backend="torch"``), forward and backward, every method.

    The reference runs on x's device too: both paths then read the rows in the orders of the same ``torch.sort``
    (on CUDA the CPU kernels get the device's orders). Tied scores are ordered differently by the CPU's and CUDA's
    sort, and tied items get different gradients (the convention of torchsort, whose sort is the device's too):
    a reference on ``x.cpu()`` failed 12 of 30 entries at ties on an H100 (2026-11-27)."""
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(x)
    for method in methods:
        if method == "_soft_sort_ascending" and reg == "kl":
            continue  # -soft_sort(-x): the same kernels as soft_sort
        ref = _run("torch", method, reg, x, beta, g)
        out = _run("triton", method, reg, x, beta, g)
        for a, b in zip(out, ref):
            assert a.device == x.device and a.dtype == x.dtype
            torch.testing.assert_close(a.cpu(), b.cpu(), **TOL[x.dtype],
                                       msg=lambda m, method=method: f"{method} {reg}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B,n", [(3, 1), (2, 2), (4, 17), (1, 260)])
def test_random_rows_match_the_cpu_kernels(B, n, dtype, reg, device):
    """n = 260 crosses the gather pass's block of 256 (one method: the interpreter takes ~1 ms per item)."""
    x = torch.randn(B, n, generator=torch.Generator().manual_seed(n), dtype=dtype).to(device)
    _compare(x, 0.7, reg, methods=METHODS if n < 100 else ("soft_rank",))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kinks_and_ties_match_the_cpu_kernels(dtype, reg, device):
    """Kinks (integer-spaced scores at β = 1: blocks with equal values, which pool and share a Jacobian block),
    tied scores (equal entries, the order torch.sort gives them) and equal blocks of several items."""
    rows = [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],  # torchsort's README example: every block a kink
            [0.5, 0.5, 0.5, -1.0, 2.0, 0.5],  # ties
            [3.0, 1.0, 3.0, 1.0, 2.0, 2.0],  # tied pairs: equal blocks
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # one block
            [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]]  # presorted, kinks
    x = torch.tensor(rows, dtype=dtype, device=device)
    for beta in (1.0, 0.5, 3.0):
        _compare(x, beta, reg)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_projection_blocks_equal_the_cpu_kernels(reg, device):
    """The kernel's own outputs: μ and the block ids of every sorted position, a batch of z against one w."""
    z = torch.tensor([[3.0, 1.0, 3.0, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0]], dtype=torch.float64, device=device)
    w = torch.arange(5, 0, -1, dtype=torch.float64, device=device).unsqueeze(0)
    w = w.log() if reg == "kl" else w
    for scale in (-1.0, 1.0, -0.25):
        mu, order, worder, bid = fss._project_impl(z, w, reg == "kl", fss.SORT, fss.DESCENDING, scale, True)
        ref = fss._project_impl(z.cpu(), w.cpu(), reg == "kl", fss.SORT, fss.DESCENDING, scale, False)
        torch.testing.assert_close(mu.cpu(), ref[0], rtol=1e-12, atol=1e-12)
        assert torch.equal(bid.cpu(), ref[3]) and torch.equal(order.cpu(), ref[1])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_and_a_single_item(device):
    for reg in ("l2", "kl"):
        op = FastSoftSort(1.0, reg, backend="triton")
        for method in (op.soft_rank, op.soft_sort):
            x = torch.empty(0, 5, dtype=torch.float64, device=device, requires_grad=True)
            out = method(x)
            assert out.shape == (0, 5)
            out.sum().backward()
            assert x.grad.shape == (0, 5)
        x = torch.tensor([[0.3], [-2.0]], dtype=torch.float64, device=device)
        _compare(x, 1.0, reg)
        assert torch.equal(op.soft_rank(x).cpu(), torch.ones(2, 1, dtype=torch.float64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_gradcheck_and_double_backward_with_triton(reg, device):
    """The kernel's VJP against finite differences (float64), and a recorded backward through the tensor ops."""
    x = torch.randn(1, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(device)
    op = FastSoftSort(0.8, reg, backend="triton")
    assert torch.autograd.gradcheck(op.soft_rank, (x.clone().requires_grad_(),))
    assert torch.autograd.gradcheck(op.soft_sort, (x.clone().requires_grad_(),))
    assert torch.autograd.gradgradcheck(op.soft_sort, (x.clone().requires_grad_(),))


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=[pytest.mark.slow, pytest.mark.skipif(
    not INTERPRET, reason="CPU kernels need TRITON_INTERPRET=1")]), *DEVICES[1:]])
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_a_row_of_100_000_items(reg, device):
    """One row of n = 10⁵ with many ties: the scratch offsets and loops at size. The interpreter takes minutes per
    launch here (a few ms per item): the CPU case is in the slow suite, and checks the soft rank only."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(1, 100_000, generator=g, dtype=torch.float64) * 30).round() / 10  # many ties
    _compare(x.to(device), 1.0, reg, methods=("soft_rank",) if device == "cpu" else ("soft_rank", "soft_sort"))


@pytest.mark.parametrize("device", DEVICES)
def test_no_host_kernel_and_no_host_copy_with_triton(device, monkeypatch):
    """With the Triton path, every method of :mod:`diffrank.functional` that fast_soft_sort serves runs forward
    and backward without the CPU kernels (which are where the data went to the host), and without a Python-level
    copy of a tensor to the host beyond the validation's flags (:func:`diffrank.operators.base.raise_failed`)."""
    def host_kernel(*args, **kwargs):
        raise AssertionError("the CPU kernels were called")

    monkeypatch.setattr(fast_soft_sort_cpu, "kernel", host_kernel)
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float32).to(device)
    for reg in ("l2", "kl"):
        op = FastSoftSort(0.5, reg, backend="triton")
        for fn in (F.soft_rank, F.soft_sort):
            for descending in (False, True):
                xx = x.clone().requires_grad_()
                fn(xx, method=op, descending=descending).sum().backward()
                assert xx.grad.device == xx.device


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_and_torch_func_grad_with_triton(device):
    """The custom Function's vmap rule and torch.func.grad carry the Triton path (the forward kernel; the backward
    in tensor operations under transforms) and equal the CPU kernels'."""
    x = torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    out = []
    for backend, dev in (("torch", "cpu"), ("triton", device)):
        op = FastSoftSort(0.9, "kl", backend=backend)
        xs = x.to(dev)
        out.append([torch.func.vmap(op.soft_rank)(xs).cpu(),
                    torch.func.grad(lambda s, op=op: op.soft_sort(s).pow(2).sum())(xs[0]).cpu()])
    for a, b in zip(*out):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
