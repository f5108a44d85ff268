"""The LapSum Triton kernels against the PyTorch path (interpreter on the CPU, CUDA when present).

Top-k membership (real k, k as a tensor with its gradient), soft rank, soft sort and the relaxed
permutation, forward and backward. float64 agrees to 1e-10, float32 to 1e-5 of the largest entry
(the kernels sum the knot series by scans of linear recurrences, PyTorch by ``logcumsumexp``: the same
quantities with other roundings); bfloat16 outputs to 1e-2.
"""

from __future__ import annotations

import pytest
import torch

import diffrank.operators.lapsum as lapsum_mod
from diffrank.kernels import lapsum as kmod
from diffrank.operators.lapsum import LapSum

pytestmark = pytest.mark.triton


@pytest.fixture(autouse=True)
def _pytorch_reference(monkeypatch):
    """The reference is the PyTorch closed form, which computes in the scores' dtype as the kernels do; the CPU's
    numba paths (backend="torch" on CPU) compute float32 in float64 and do not underflow where both of them do."""
    monkeypatch.setattr(lapsum_mod, "_numba_ok", lambda x: False)

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _close(a, ref, dtype):
    """Equal up to ``TOL`` relative to the largest entry of ``ref`` (entries near 0 carry its error)."""
    torch.testing.assert_close(a, ref, atol=TOL[dtype] * (1 + float(ref.abs().max())), rtol=TOL[dtype])


def _scores(B, n, seed, dtype=torch.float64, scale=2.0):
    return torch.randn(B, n, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def _run(method, op, s, w, *args):
    """(output, ∂⟨w, output⟩/∂s) of ``op.method(s, *args)``."""
    x = s.clone().requires_grad_()
    out = getattr(op, method)(x, *args)
    if not out.requires_grad:  # n = 1: P = [[1]] is a constant
        return out, torch.zeros_like(s)
    (out * w).sum().backward()
    return out.detach(), x.grad


def _weights(shape, seed, dtype):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,beta", [(1, 1.0), (5, 0.5), (37, 3.0), (37, 50.0)])
def test_every_method_matches_pytorch(n, beta, dtype):
    s = _scores(2, n, seed=n, dtype=dtype)
    ref, fused = LapSum(beta, backend="torch"), LapSum(beta, backend="triton")
    ks = sorted({1.0, min(2.5, n), n / 3, float(n)})
    calls = [("topk_membership", (ks,), (2, len(ks), n)), ("soft_rank", (), (2, n)), ("soft_sort", (), (2, n)),
             ("forward", (), (2, n, n)), ("forward", (min(2, n),), (2, min(2, n), n))]
    for i, (method, args, shape) in enumerate(calls):
        w = _weights(shape, seed=i, dtype=dtype)
        out_ref, g_ref = _run(method, ref, s, w, *args)
        out, g = _run(method, fused, s, w, *args)
        assert out.shape == shape and out.dtype == dtype, method
        _close(out, out_ref, dtype)
        _close(g, g_ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tensor_k_gradient_matches_pytorch(dtype):
    s = _scores(3, 9, seed=1, dtype=dtype)
    k0 = torch.tensor([[1.0, 4.5], [2.0, 8.9], [0.3, 9.0]], dtype=dtype)
    w = _weights((3, 2, 9), seed=2, dtype=dtype)
    grads = []
    for backend in ("torch", "triton"):
        x, k = s.clone().requires_grad_(), k0.clone().requires_grad_()
        p = LapSum(2.0, backend=backend).topk_membership(x, k)
        (p * w).sum().backward()
        grads.append((p.detach(), x.grad, k.grad))
    for got, want in zip(grads[1], grads[0]):
        _close(got, want, dtype)
    torch.testing.assert_close(grads[1][0].sum(-1), k0, atol=1e-4 if dtype == torch.float32 else 1e-10, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_far_apart_scores_at_integer_k(dtype):
    """Knots 250 apart in u = -βs (q = e^{-250}) with e = k - c = 0: the closed form's r = 0 branch."""
    s = torch.tensor([[0.0, 5.0, 10.0, 15.0], [15.0, 0.0, 10.1, 5.2]], dtype=dtype)
    k0 = torch.tensor([[1.0, 2.0], [3.0, 2.5]], dtype=dtype)
    w = _weights((2, 2, 4), seed=7, dtype=dtype)
    out = []
    for backend in ("torch", "triton"):
        x, k = s.clone().requires_grad_(), k0.clone().requires_grad_()
        p = LapSum(50.0, backend=backend).topk_membership(x, k)
        (p * w).sum().backward()
        out.append((p.detach(), x.grad, k.grad))
    for got, want in zip(out[1], out[0]):
        _close(got, want, dtype)
    # thresholds mid-gap in gaps 2000 wide: the inverse VJP's normaliser underflows unless scaled
    s = torch.tensor([[0.0, 40.0, 80.0]], dtype=dtype)
    for method, shape in (("forward", (1, 3, 3)), ("soft_sort", (1, 3))):
        w = _weights(shape, seed=8, dtype=dtype)
        for got, want in zip(_run(method, LapSum(50.0, backend="triton"), s, w),
                             _run(method, LapSum(50.0, backend="torch"), s, w)):
            _close(got, want, dtype)


def test_rows_longer_than_a_block(monkeypatch):
    """n = 37 in blocks of 16: the scans carry their prefix across three blocks, both directions."""
    monkeypatch.setattr(kmod, "_MAX_BLOCK", 16)
    s = _scores(2, 37, seed=3)
    ref, fused = LapSum(2.0, backend="torch"), LapSum(2.0, backend="triton")
    for i, (method, args, shape) in enumerate([("topk_membership", ([3, 10.5],), (2, 2, 37)),
                                               ("soft_rank", (), (2, 37)), ("soft_sort", (), (2, 37))]):
        w = _weights(shape, seed=i, dtype=torch.float64)
        for got, want in zip(_run(method, fused, s, w, *args), _run(method, ref, s, w, *args)):
            _close(got, want, torch.float64)


def test_float32_is_as_accurate_as_pytorch_float32():
    """Against the float64 result, the float32 kernel errs no more than 2x the float32 PyTorch path (or 1e-6)."""
    s = _scores(4, 60, seed=4, scale=3.0)
    truth = LapSum(5.0, backend="torch").topk_membership(s, [1, 7.5])
    err_ref = (LapSum(5.0, backend="torch").topk_membership(s.float(), [1, 7.5]).double() - truth).abs().max()
    err = (LapSum(5.0, backend="triton").topk_membership(s.float(), [1, 7.5]).double() - truth).abs().max()
    assert err <= max(2 * err_ref, 1e-6)


def test_bfloat16_matches_pytorch():
    s = _scores(2, 11, seed=5, dtype=torch.float32).bfloat16()
    for method, args in (("topk_membership", ([3],)), ("soft_rank", ()), ("soft_sort", ())):
        ref = getattr(LapSum(2.0, backend="torch"), method)(s, *args)
        out = getattr(LapSum(2.0, backend="triton"), method)(s, *args)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)


def _forbidden(*args, **kwargs):
    raise AssertionError("a Triton kernel was called")


def test_torch_backend_never_calls_triton(monkeypatch):
    for name in ("topk_forward", "topk_backward", "rank_forward", "rank_backward", "inverse_forward",
                 "inverse_backward", "_knots", "_inverse"):
        monkeypatch.setattr(kmod, name, _forbidden)
    s = _scores(2, 6, seed=6, dtype=torch.float32)
    for op in (LapSum(1.0, backend="torch"), LapSum(1.0, backend="auto")):  # auto on the CPU = PyTorch
        op.topk_membership(s, [2.5])
        op.soft_rank(s)
        op.soft_sort(s)
        op(s)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        LapSum(1.0, backend="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1000, 3000])
def test_cuda_matches_pytorch(n, dtype):
    s = _scores(8, n, seed=n, dtype=dtype).cuda()
    ref, fused = LapSum(2.0, backend="torch"), LapSum(2.0, backend="auto")
    for i, (method, args, shape) in enumerate([("topk_membership", ([1, 10.5, n / 2],), (8, 3, n)),
                                               ("soft_rank", (), (8, n)), ("soft_sort", (), (8, n))]):
        w = _weights(shape, seed=i, dtype=dtype).cuda()
        for got, want in zip(_run(method, fused, s, w, *args), _run(method, ref, s, w, *args)):
            _close(got, want, dtype)


def test_kernels_second_derivatives_and_torch_func():
    """backend="triton": gradgradcheck of every capability (a recorded backward takes the differentiable closed
    forms), a tensor β's gradient, and torch.func.vmap over sets = the loop (the Functions' vmap rule)."""
    from torch.autograd import gradcheck, gradgradcheck

    op = LapSum(1.3, backend="triton")
    s = _scores(2, 4, seed=21, scale=1.0).requires_grad_()
    k = torch.tensor([[1.5, 3.0], [2.2, 3.9]], dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(lambda x, kk: op.topk_membership(x, kk), (s, k))
    for f in (op.soft_rank, op.soft_sort, op):
        assert gradgradcheck(f, (s,))
    beta = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, b: LapSum(b, backend="triton").soft_sort(x), (s, beta))
    xs = _scores(3, 5, seed=22)
    for hook in (op._soft_rank, op._soft_sort, lambda x: op._topk_membership(x, [2.5])):
        one = lambda x, h=hook: h(x.unsqueeze(0))[0]  # noqa: E731
        torch.testing.assert_close(torch.func.vmap(one)(xs), torch.stack([one(x) for x in xs]))
