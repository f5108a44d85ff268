"""The sparse soft top-k PAV Triton kernel (mask and magnitude, p = 2 and 4/3) against the numba kernels
(interpreter on the CPU, compiled on CUDA): ties, B = 0, n = 1, n = 10⁵, and the operator forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_devices import DEVICES, INTERPRET

from diffrank import functional as F
from diffrank.kernels.sparse_soft_topk import pav_topk, pav_topk_magnitude
from diffrank.operators import sparse_soft_topk as sst
from diffrank.operators.sparse_soft_topk import SparseSoftTopK, sparse_soft_topk_magnitude

pytestmark = pytest.mark.triton

CLOSE = dict(rtol=1e-12, atol=1e-12)


def _rows(B: int, n: int, seed: int, device: str) -> torch.Tensor:
    """(B, n) float64 sorted descending, with ties (values on a grid of 0.5)."""
    s = (torch.randn(B, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3).round() / 2
    return s.sort(-1, descending=True)[0].to(device)


def _check_mask(s: torch.Tensor, k: int, cubic: bool) -> None:
    y, a, start = pav_topk(s, k, cubic)
    sn = s.cpu().numpy()
    ref = np.empty_like(sn), np.empty_like(sn), np.empty(sn.shape, np.int64)
    sst._pav_topk(sn, k, cubic, *ref)
    assert torch.equal(start.cpu(), torch.from_numpy(ref[2]))
    torch.testing.assert_close(y.cpu(), torch.from_numpy(ref[0]), **CLOSE)
    torch.testing.assert_close(a.cpu(), torch.from_numpy(ref[1]), **CLOSE)


def _check_magnitude(z: torch.Tensor, k: int, cubic: bool, lam: float) -> None:
    outs = pav_topk_magnitude(z, k, cubic, lam)
    zn = z.cpu().numpy()
    ref = [np.empty_like(zn) for _ in range(4)] + [np.empty(zn.shape, np.int64)]
    sst._pav_topk_mag(zn, k, cubic, lam, *ref)
    for out, r in zip(outs, ref):
        torch.testing.assert_close(out.cpu(), torch.from_numpy(r), **CLOSE)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cubic", [False, True], ids=["p2", "p4_3"])
@pytest.mark.parametrize("B,n,k", [(3, 1, 1), (4, 9, 3), (2, 40, 7), (2, 12, 12)])
def test_pav_matches_the_numba_kernels(B, n, k, cubic, device):
    s = _rows(B, n, n, device)
    _check_mask(s, k, cubic)
    _check_magnitude(s.abs().sort(-1, descending=True)[0], k, cubic, 0.3)


@pytest.mark.parametrize("device", DEVICES)
def test_equal_blocks_and_an_empty_batch(device):
    """All-equal rows (one block), tied pairs, scales that make every item its own block; B = 0."""
    s = torch.tensor([[2.0, 2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 1.0, 1.0, 0.0], [90.0, 60.0, 30.0, 0.0, -30.0]],
                     dtype=torch.float64, device=device)
    for cubic in (False, True):
        for k in (1, 2, 5):
            _check_mask(s, k, cubic)
            _check_magnitude(s.abs().sort(-1, descending=True)[0], k, cubic, 0.5)
        y, a, start = pav_topk(s[:0], 1, cubic)
        assert y.shape == a.shape == start.shape == (0, 5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [2.0, 4 / 3], ids=["p2", "p4_3"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_operator_forward_and_backward_match_numba(p, dtype, device):
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(1), dtype=dtype)
    x[0, 5:9] = x[0, 4]  # ties
    w = torch.randn(3, 2, 20, generator=torch.Generator().manual_seed(2), dtype=dtype)
    out = []
    for backend, dev in (("torch", "cpu"), ("triton", device)):
        xx = x.to(dev, copy=True).requires_grad_()  # a copy: x.to("cpu") is x itself, which would then need grad
        m = SparseSoftTopK(beta=2.0, p=p, backend=backend).topk_membership(xx, [3, 11])
        (m * w.to(dev)).sum().backward()
        xm = x.to(dev, copy=True).requires_grad_()
        mag = sparse_soft_topk_magnitude(xm, 4, beta=2.0, p=p, backend=backend)
        (mag * w[:, 0].to(dev)).sum().backward()
        out.append([t.detach().cpu() for t in (m, xx.grad, mag, xm.grad)])
    tol = CLOSE if dtype == torch.float64 else dict(rtol=1e-6, atol=1e-6)
    for a, b in zip(*out):
        torch.testing.assert_close(b, a, **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_is_refused_on_the_device(device):
    x = torch.tensor([[1e76, 0.0, -1e76]], dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match="out of the range"):
        SparseSoftTopK(beta=1.0, p=4 / 3, backend="triton").topk_membership(x, [1])


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=[pytest.mark.slow, pytest.mark.skipif(
    not INTERPRET, reason="CPU kernels need TRITON_INTERPRET=1")]), *DEVICES[1:]])
@pytest.mark.parametrize("cubic", [False, True], ids=["p2", "p4_3"])
def test_a_row_of_100_000_items(cubic, device):
    """One row of n = 10⁵ with many ties; the interpreter takes minutes (slow suite on the CPU)."""
    s = _rows(1, 100_000, 3, device)
    _check_mask(s, 5_000, cubic)


@pytest.mark.parametrize("device", DEVICES)
def test_no_numba_kernel_with_triton(device, monkeypatch):
    """The Triton path never reaches the numba kernels (where the data went to the host), mask and magnitude,
    through :func:`diffrank.functional.topk_membership`."""
    def host_kernel(*args, **kwargs):
        raise AssertionError("the numba PAV was called")

    monkeypatch.setattr(sst, "_pav_topk", host_kernel)
    monkeypatch.setattr(sst, "_pav_topk_mag", host_kernel)
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
    for p in (2.0, 4 / 3):
        F.topk_membership(x, 3, method=SparseSoftTopK(beta=3.0, p=p, backend="triton")).sum().backward()
        sparse_soft_topk_magnitude(x, 3, p=p, backend="triton").sum().backward()
