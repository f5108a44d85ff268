"""The fused SoftSort Triton kernels against the PyTorch path (interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from diffrank.operators.softsort import SoftSort

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("n,k", [(5, 1), (37, 4), (300, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_backward_match_pytorch(n, k, dtype):
    g = torch.Generator().manual_seed(n)
    s = torch.randn(3, n, generator=g, dtype=dtype)
    ref, fused = SoftSort(beta=1.7, use_triton=False), SoftSort(beta=1.7, use_triton=True)
    a, b = s.clone().requires_grad_(), s.clone().requires_grad_()
    pa, pb = ref(a, k=k), fused(b, k=k)
    w = torch.randn(pa.shape, generator=g, dtype=dtype)
    (pa * w).sum().backward()
    (pb * w).sum().backward()
    assert pb.shape == (3, k, n) and pb.dtype == dtype
    torch.testing.assert_close(pb, pa, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4)


def test_half_precision_accumulates_in_float32():
    s = torch.randn(2, 50)
    out = SoftSort(beta=1.0, use_triton=True)(s.half(), k=3)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), SoftSort(beta=1.0)(s.half().float(), k=3), atol=2e-3, rtol=0)


def test_power_other_than_one_is_refused():
    with pytest.raises(ValueError, match="power = 1"):
        SoftSort(power=2.0, use_triton=True)


def test_kernel_on_half_inputs_directly():
    """The operator computes half precision in float32; the kernel itself also takes half inputs."""
    from diffrank.kernels.softsort import softsort_topk_rows

    s = torch.randn(2, 50)
    out = softsort_topk_rows(s.half(), 3, 1.0)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), softsort_topk_rows(s.half().float(), 3, 1.0), atol=2e-3, rtol=0)
