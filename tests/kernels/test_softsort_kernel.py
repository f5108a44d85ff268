"""The fused SoftSort Triton kernels against the PyTorch path (interpreter on the CPU, compiled on CUDA)."""

from __future__ import annotations

import pytest
import torch
from kernel_devices import DEVICE, DEVICES, ON_DEVICE, both_backends
from torch import Tensor

from diffrank.operators.softsort import SoftSort

pytestmark = pytest.mark.triton

def _both(s: Tensor, k: int, beta: float = 1.7) -> list[tuple[Tensor, Tensor]]:
    """P and ∂⟨P, W⟩/∂s from the PyTorch path and from the kernels, for the same weights W."""
    return [(p, g) for p, g, _ in both_backends(lambda backend: SoftSort(beta=beta, backend=backend), s, k)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(1, 1), (5, 1), (37, 4), (37, 37), (300, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_backward_match_pytorch(n, k, dtype, device):
    s = torch.randn(3, n, generator=torch.Generator().manual_seed(n), dtype=dtype).to(device)
    (pa, ga), (pb, gb) = _both(s, k)
    assert pb.shape == (3, k, n) and pb.dtype == dtype
    torch.testing.assert_close(pb, pa, atol=1e-5 if dtype == torch.float32 else 1e-12, rtol=1e-5)
    torch.testing.assert_close(gb, ga, atol=1e-5 if dtype == torch.float32 else 1e-12, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_get_the_gradient_of_pytorch(device):
    """Equal scores: sign(0) = 0 in both paths, and t_r's gradient reaches the item topk picked."""
    s = torch.tensor([[0.5, 0.5, -1.0, 2.0, 0.5]], device=device)
    (pa, ga), (pb, gb) = _both(s, 3, beta=0.9)
    torch.testing.assert_close(pb, pa, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gb, ga, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_pytorch(dtype, device):
    """The operator computes half precision in float32, so float32 reaches the kernel; result in ``dtype``."""
    s = torch.randn(2, 50, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    (pa, ga), (pb, gb) = _both(s, 3, beta=1.0)
    assert pb.dtype == dtype and gb.dtype == dtype
    torch.testing.assert_close(pb.float(), pa.float(), atol=1e-3, rtol=1e-2)
    torch.testing.assert_close(gb.float(), ga.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@ON_DEVICE
def test_kernel_on_half_inputs_directly(dtype):
    """The kernel itself also takes half inputs (loaded into float32, stored in ``dtype``)."""
    from diffrank.operators.softsort import softsort_topk_rows

    s = torch.randn(2, 50, generator=torch.Generator().manual_seed(0)).to(DEVICE, dtype)
    out = softsort_topk_rows(s, 3, 1.0)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), softsort_topk_rows(s.float(), 3, 1.0), atol=1e-3, rtol=1e-2)


def test_power_other_than_one_is_refused_by_triton_only():
    with pytest.raises(ValueError, match="power = 1"):
        SoftSort(power=2.0, backend="triton")
    s = torch.randn(2, 6)
    torch.testing.assert_close(SoftSort(power=2.0, backend="auto")(s, k=2),
                               SoftSort(power=2.0, backend="torch")(s, k=2))


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_torch_backend_never_calls_triton_on_cpu(backend, monkeypatch):
    import diffrank.kernels.softsort as kernel

    def boom(*args, **kwargs):
        raise AssertionError("the Triton kernel was called")

    monkeypatch.setattr(kernel, "rows_forward", boom)
    p = SoftSort(beta=1.0, backend=backend)(torch.randn(2, 7), k=3)
    assert p.shape == (2, 3, 7)
