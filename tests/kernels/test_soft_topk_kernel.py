"""The fused SOFT top-k Newton kernel against the PyTorch path (interpreter on the CPU, CUDA when present).

Both paths solve the same 1-D dual in float64 with the same start, bracket and stopping rule
(|Σ A - k| < 1e-13 n), so the memberships agree to 1e-12 and the gradients to 1e-10 of their largest entry
(the stopping rule's slack in Δ, amplified on near-hard plans; the iteration counts can differ by one or
two steps for the same reason); float32 outputs agree to float32 rounding. Against a float64 Sinkhorn run
to a 1e-13 marginal tolerance, the kernel agrees to 1e-10.
"""

from __future__ import annotations

import pytest
import torch

from diffrank.kernels import soft_topk as kmod
from diffrank.operators.soft_topk import SoftTopK

pytestmark = pytest.mark.triton

TOL = {torch.float64: dict(atol=1e-12, rtol=1e-10), torch.float32: dict(atol=2e-6, rtol=1e-5)}
# the stopping rule leaves Δ uncertain by ~|Σ A - k| / Σ σ', which a near-hard plan's derivative amplifies
GRAD_TOL = {torch.float64: dict(atol=1e-10, rtol=1e-6), torch.float32: dict(atol=2e-6, rtol=1e-5)}


def _scores(B, n, seed, dtype=torch.float64, scale=2.0):
    return torch.randn(B, n, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def _close(a, ref, dtype, tols=TOL):
    """Equal to rounding at the scale of ``ref`` (a gradient's small entries carry its largest one's error)."""
    tol = tols[dtype]
    torch.testing.assert_close(a, ref, atol=tol["atol"] * (1 + float(ref.abs().max())), rtol=tol["rtol"])


def _fwd_bwd(op, s, ks, w):
    x = s.clone().requires_grad_()
    a = op.topk_membership(x, ks)
    (a * w).sum().backward()
    return a.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,ks,beta,norm", [
    (2, [1, 2], 10.0, "none"),
    (5, [1, 2, 5], 1.0, "row"),
    (37, [1, 12], 10.0, "none"),
    (37, [3], 1000.0, "batch"),
])
def test_forward_backward_match_pytorch(n, ks, beta, norm, dtype):
    s = _scores(3, n, seed=n, dtype=dtype)
    w = _scores(3, len(ks), seed=n + 1, dtype=dtype).unsqueeze(-1) * _scores(1, n, seed=n + 2, dtype=dtype)
    ref, fused = (SoftTopK(beta, cost_normalization=norm, backend=b) for b in ("torch", "triton"))
    a_ref, g_ref = _fwd_bwd(ref, s, ks, w)
    a, g = _fwd_bwd(fused, s, ks, w)
    assert a.shape == (3, len(ks), n) and a.dtype == dtype
    _close(a, a_ref, dtype)
    _close(g, g_ref, dtype, GRAD_TOL)
    assert 0 < fused.last_iterations < 100  # the same Newton iteration: tens of steps, never the cap
    torch.testing.assert_close(a.double().sum(-1), torch.tensor(ks, dtype=torch.float64).expand(3, -1),
                               atol=1e-10 if dtype == torch.float64 else 1e-4, rtol=0)


def test_rows_longer_than_a_block(monkeypatch):
    """n = 37 over blocks of 16: the Newton sums and the backward walk three blocks."""
    monkeypatch.setattr(kmod, "_MAX_BLOCK", 16)
    s, w = _scores(2, 37, seed=3), _scores(2, 37, seed=4).unsqueeze(1)
    a_ref, g_ref = _fwd_bwd(SoftTopK(5.0, backend="torch"), s, [7], w)
    a, g = _fwd_bwd(SoftTopK(5.0, backend="triton"), s, [7], w)
    _close(a, a_ref, torch.float64)
    _close(g, g_ref, torch.float64, GRAD_TOL)


def test_matches_a_long_float64_sinkhorn_reference():
    s = _scores(2, 20, seed=5, scale=1.0)
    ref = SoftTopK(10.0, solver="sinkhorn", tolerance=1e-13, max_iter=20000, backend="torch")
    a = SoftTopK(10.0, backend="triton").topk_membership(s, [1, 6])
    torch.testing.assert_close(a, ref.topk_membership(s, [1, 6]), atol=1e-10, rtol=0)


def test_n_one_and_k_equal_n_are_ones_without_the_kernel(monkeypatch):
    monkeypatch.setattr(kmod, "newton_forward", _forbidden)
    op = SoftTopK(10.0, backend="triton")
    assert torch.equal(op.topk_membership(torch.randn(2, 1), [1]), torch.ones(2, 1, 1))
    assert torch.equal(op.topk_membership(torch.randn(2, 4), [4]), torch.ones(2, 1, 4))


def test_bfloat16_matches_pytorch():
    s = _scores(2, 9, seed=6, dtype=torch.float32).bfloat16()
    a_ref = SoftTopK(10.0, backend="torch").topk_membership(s, [3])
    a = SoftTopK(10.0, backend="triton").topk_membership(s, [3])
    assert a.dtype == torch.bfloat16
    torch.testing.assert_close(a.float(), a_ref.float(), atol=1e-2, rtol=1e-2)


def test_iteration_cap_warns_like_pytorch():
    s = _scores(2, 30, seed=7)
    with pytest.warns(RuntimeWarning, match="Newton solve stopped"):
        SoftTopK(10.0, max_iter=1, backend="triton").topk_membership(s, [4])


def _forbidden(*args, **kwargs):
    raise AssertionError("the Triton kernel was called")


def test_torch_backend_never_calls_triton(monkeypatch):
    monkeypatch.setattr(kmod, "newton_forward", _forbidden)
    monkeypatch.setattr(kmod, "_soft_topk_fwd", None)
    s = _scores(2, 6, seed=8, dtype=torch.float32)
    for op in (SoftTopK(10.0, backend="torch"), SoftTopK(10.0, backend="auto"),  # auto on the CPU = PyTorch
               SoftTopK(10.0, solver="sinkhorn", max_iter=20, tolerance=None, backend="auto")):
        op.topk_membership(s, [2])


def test_backend_errors():
    with pytest.raises(ValueError, match="backend must be one of"):
        SoftTopK(10.0, backend="cuda")
    with pytest.raises(ValueError, match="solver='newton' only"):
        SoftTopK(10.0, solver="sinkhorn", backend="triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [1000, 5000])
def test_cuda_matches_pytorch(n):
    s = _scores(8, n, seed=n).cuda()
    w = torch.randn(8, 2, n, dtype=torch.float64, device="cuda")
    a_ref, g_ref = _fwd_bwd(SoftTopK(10.0, backend="torch"), s, [1, n // 10], w)
    a, g = _fwd_bwd(SoftTopK(10.0, backend="auto"), s, [1, n // 10], w)
    _close(a, a_ref, torch.float64)
    _close(g, g_ref, torch.float64, GRAD_TOL)
    a32 = SoftTopK(10.0, backend="auto").topk_membership(s.float(), [1, n // 10])
    _close(a32, a_ref.float(), torch.float32)


@pytest.mark.slow  # ~15 s under the Triton interpreter; tests/test_torch_func.py covers soft_topk's PyTorch path
def test_torch_func_and_second_derivatives_match_pytorch():
    """vmap (folded into the batch), jacrev and the recorded backward (torch ops on A: exact second derivatives) of
    the fused Newton Function equal the PyTorch path's."""
    fused, ref = SoftTopK(beta=2.0, backend="triton", tolerance=1e-12), SoftTopK(beta=2.0, backend="torch",
                                                                                 tolerance=1e-12)
    x = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    leaf = x.clone().requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: fused._topk_membership(x, [2, 4]), (leaf,), atol=1e-5)
    xs = torch.randn(4, 3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(torch.func.vmap(lambda x: fused._topk_membership(x, [2]))(xs),
                               torch.stack([ref._topk_membership(a, [2]) for a in xs]))
    torch.testing.assert_close(torch.func.jacrev(lambda x: fused._topk_membership(x, [2, 4]))(x),
                               torch.func.jacrev(lambda x: ref._topk_membership(x, [2, 4]))(x))
