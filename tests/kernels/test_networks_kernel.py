"""The fused comparator-network Triton kernels against the PyTorch path (interpreter on the CPU).

The interpreter is slow, so the product network × sigmoid × n × k is reduced: every network meets two or
three sigmoids, each over n ∈ {1, 2, 5, 16, 37} and k ∈ {1, 3}; all six sigmoids are checked element-wise
and on one network.
"""

from __future__ import annotations

import pytest
import torch

from diffrank.operators import sorting_network
from diffrank.operators.networks import build
from diffrank.operators.sigmoids import SIGMOIDS, swap_slope, swap_weight
from diffrank.operators.sorting_network import ComparatorNetwork, network_kernel, run_network

pytestmark = pytest.mark.triton

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
kern = pytest.importorskip("diffrank.kernels.networks")

CASES = [("odd_even", "cauchy"), ("odd_even", "logistic"),
         ("bitonic", "cauchy"), ("bitonic", "optimal"), ("bitonic", "logistic_phi"),
         ("splitter_selection", "logistic_phi"), ("splitter_selection", "gaussian"),
         ("splitter_selection", "reciprocal")]


def _pair(network, sigmoid, beta=1.5):
    kw = dict(beta=beta, sigmoid=sigmoid, art_lambda=0.5, network=network)
    return ComparatorNetwork(backend="torch", **kw), ComparatorNetwork(backend="triton", **kw)


def _grad_tol(sigmoid, g):
    # the ART slope β ε^{-λ}-scale near ties makes float32 itself lose ~1e-4 relative (see test_all_sigmoids…)
    rel = 1e-4 if sigmoid == "logistic_phi" else 1e-5
    return dict(atol=rel * max(1.0, g.abs().max().item()), rtol=rel)


def _check(fn_ref, fn_fused, s, sigmoid, gen):
    a, b = s.clone().requires_grad_(), s.clone().requires_grad_()
    pa, pb = fn_ref(a), fn_fused(b)
    assert pb.shape == pa.shape and pb.dtype == pa.dtype
    torch.testing.assert_close(pb, pa, atol=1e-5, rtol=1e-5)
    if not pa.requires_grad:  # n = 1: a constant
        assert not pb.requires_grad
        return
    w = torch.randn(pa.shape, generator=gen)
    (pa * w).sum().backward()
    (pb * w).sum().backward()
    torch.testing.assert_close(b.grad, a.grad, **_grad_tol(sigmoid, a.grad))


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("n", [1, 2, 5, 16, 37])
@pytest.mark.parametrize("network,sigmoid", CASES)
def test_rows_membership_and_p_match_pytorch(network, sigmoid, n, k):
    k = min(k, n)
    gen = torch.Generator().manual_seed(100 * n + k)
    s = torch.randn(2, n, generator=gen)
    ref, fused = _pair(network, sigmoid)
    _check(lambda x: ref.topk_rows(x, k), lambda x: fused.topk_rows(x, k), s, sigmoid, gen)
    ks = sorted({1, k})
    _check(lambda x: ref.topk_membership(x, ks), lambda x: fused.topk_membership(x, ks), s, sigmoid, gen)
    if network != "splitter_selection" and k == 3:  # full P once per n
        _check(lambda x: ref(x), lambda x: fused(x), s, sigmoid, gen)


@pytest.mark.parametrize("network", ["odd_even", "bitonic"])
def test_soft_sort_and_soft_rank_match_pytorch(network):
    gen = torch.Generator().manual_seed(7)
    s = torch.randn(3, 13, generator=gen)
    ref, fused = _pair(network, "cauchy", beta=4.0)
    _check(ref.soft_sort, fused.soft_sort, s, "cauchy", gen)
    _check(ref.soft_rank, fused.soft_rank, s, "cauchy", gen)


@triton.jit
def _sigmoid_probe(d_ptr, a_ptr, s_ptr, n, beta, lam, SIGMOID: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(d_ptr + offs, mask=mask, other=0.0)
    tl.store(a_ptr + offs, kern._alpha(d, beta, lam, SIGMOID), mask=mask)
    tl.store(s_ptr + offs, kern._slope(d, beta, lam, SIGMOID), mask=mask)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy exp(+big)
@pytest.mark.parametrize("sigmoid", list(SIGMOIDS))
def test_kernel_sigmoids_match_closed_forms(sigmoid):
    """f and f' in Triton equal sigmoids.py (float64 truth) across ties, both branches and the tails."""
    d = torch.tensor([0.0, 1e-12, -1e-12, 1e-6, -1e-6, 0.01, -0.01, 0.1, -0.1, 0.124, 0.126, -0.126,
                      0.3, -0.4, 0.414, 0.415, 1.0, -1.0, 2.41, 2.42, -3.0, 10.0, -50.0, 1e4, -1e6])
    beta, lam = 2.0, 0.5
    a, sl = torch.empty_like(d), torch.empty_like(d)
    _sigmoid_probe[(1,)](d, a, sl, d.numel(), beta, lam, SIGMOID=kern.SIGMOID_CODES[sigmoid], BLOCK=32)
    d64 = d.double()
    torch.testing.assert_close(a.double(), swap_weight(d64, beta, sigmoid, lam), atol=2e-7, rtol=1e-6)
    torch.testing.assert_close(sl.double(), swap_slope(d64, beta, sigmoid, lam), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("sigmoid", list(SIGMOIDS))
def test_all_sigmoids_as_accurate_as_float32_pytorch(sigmoid):
    """Every sigmoid through the kernels (values and rows, bitonic n = 16): the distance to the float64 PyTorch
    result is no larger than float32 PyTorch's own, up to a small slack."""
    net = build("bitonic", 16)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, generator=gen)
    y0 = torch.randn(1, 3, 16, generator=gen)
    for mode, y in (("values", None), ("rows", y0)):
        outs, grads = [], []
        for fn, dtype in ((run_network, torch.float64), (run_network, torch.float32),
                          (network_kernel, torch.float32)):
            a = x.to(dtype).clone().requires_grad_()
            out = fn(net, a, 2.0, sigmoid, 0.5, mode, None if y is None else y.to(dtype))
            (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum().backward()
            outs.append(out.detach().double())
            grads.append(a.grad.double())
        for vals in (outs, grads):
            scale = vals[0].abs().max().item()
            err_torch = (vals[1] - vals[0]).abs().max().item()
            err_kernel = (vals[2] - vals[0]).abs().max().item()
            assert err_kernel <= 3 * err_torch + 2e-6 * max(1.0, scale), (mode, err_kernel, err_torch)


@pytest.mark.parametrize("network", ["bitonic", "splitter_selection"])
def test_bfloat16_matches_pytorch(network):
    gen = torch.Generator().manual_seed(11)
    s = torch.randn(2, 21, generator=gen).bfloat16()
    ref, fused = _pair(network, "logistic_phi")
    pa, pb = ref.topk_rows(s, 3), fused.topk_rows(s, 3)
    assert pb.dtype == torch.bfloat16
    torch.testing.assert_close(pb.float(), pa.float(), atol=1e-2, rtol=1e-2)


def _spy(monkeypatch):
    calls = []
    real = sorting_network.network_kernel

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(sorting_network, "network_kernel", spy)
    return calls


def test_backend_torch_never_calls_triton(monkeypatch):
    calls = _spy(monkeypatch)
    s = torch.randn(2, 9)
    op = ComparatorNetwork(network="bitonic", backend="torch")
    op(s), op(s, k=2), op.topk_membership(s, [1, 3]), op.soft_sort(s), op.soft_rank(s)
    ComparatorNetwork(network="splitter_selection", backend="torch").topk_membership(s, [2])
    ComparatorNetwork(network="bitonic", backend="auto")(s, k=2)  # auto on the CPU: PyTorch
    assert calls == []


def test_backend_triton_calls_the_kernel_where_it_applies(monkeypatch):
    calls = _spy(monkeypatch)
    op = ComparatorNetwork(network="odd_even", backend="triton")
    op(torch.randn(2, 9), k=2)
    assert len(calls) == 1
    op(torch.randn(2, 9, dtype=torch.float64), k=2)  # float64: the float32 kernels would lose precision
    op(torch.randn(2, 1), k=1)  # no layers
    monkeypatch.setattr(kern, "MAX_N", 8)
    op(torch.randn(2, 9), k=2)  # n above the kernels' limit
    assert len(calls) == 1


def test_bad_backend_and_bad_kernel_input_raise():
    with pytest.raises(ValueError, match="backend"):
        ComparatorNetwork(backend="cuda")
    net = build("bitonic", 8)
    with pytest.raises(ValueError, match="float32"):
        network_kernel(net, torch.randn(2, 8, dtype=torch.float64), 1.0, "cauchy", 0.5)
    with pytest.raises(ValueError, match="float32"):
        network_kernel(net, torch.randn(2, 7), 1.0, "cauchy", 0.5)
    with pytest.raises(ValueError, match="y0"):
        network_kernel(net, torch.randn(2, 8), 1.0, "cauchy", 0.5, "rows", torch.randn(3, 2, 8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [16, 37, 300, 2048])
@pytest.mark.parametrize("network,sigmoid", [("bitonic", "cauchy"), ("odd_even", "logistic"),
                                             ("splitter_selection", "logistic_phi")])
def test_cuda_matches_pytorch(network, sigmoid, n):
    gen = torch.Generator().manual_seed(n)
    s = torch.randn(4, n, generator=gen).cuda()
    ref, fused = _pair(network, sigmoid)
    gen = torch.Generator().manual_seed(1)

    def check(f_ref, f_fused):
        a, b = s.clone().requires_grad_(), s.clone().requires_grad_()
        c = s.double().requires_grad_()  # the float64 PyTorch path: the reference both float32 results are held to
        pa, pb, pc = f_ref(a), f_fused(b), f_ref(c)
        torch.testing.assert_close(pb, pa, atol=2e-5, rtol=1e-4)
        w = torch.randn(pa.shape, generator=gen).cuda()
        for p in (pa, pb, pc):
            (p * w.to(p.dtype)).sum().backward()
        # the kernel rounds differently from float32 PyTorch (FMA contraction, summation order), and near ties the
        # slope of ART / Cauchy amplifies both roundings (2026-11-25, H100: 2-6 elements of 10^3-10^4 beyond 1e-4,
        # each at float32 PyTorch's own worst element): the kernel's error against float64 may be at most a few
        # times PyTorch's own, elementwise in the tolerance that float32 PyTorch needs
        err_torch = (a.grad.double() - c.grad).abs()
        err_kernel = (b.grad.double() - c.grad).abs()
        tol = _grad_tol(sigmoid, c.grad)
        bound = 3 * err_torch.max() + tol["atol"] + tol["rtol"] * c.grad.abs()
        worst = int((err_kernel - bound).argmax())
        assert bool((err_kernel <= bound).all()), (
            f"kernel gradient off float64 by {float(err_kernel.flatten()[worst]):.3g} at flat index {worst}, "
            f"float32 PyTorch by at most {float(err_torch.max()):.3g}")

    check(lambda x: ref.topk_rows(x, 5), lambda x: fused.topk_rows(x, 5))
    if network != "splitter_selection" and n <= 300:
        check(ref, fused)


@pytest.mark.parametrize("network,n", [("odd_even", 11), ("bitonic", 16), ("splitter_selection", 20)])
def test_checkpointed_rows_backward_matches_pytorch(network, n, monkeypatch):
    """Above CHECKPOINT_ELEMENTS the rows backward keeps a snapshot every ⌈√L⌉ steps and recomputes the segment:
    the same gradients (full P and top-k rows), and a smaller buffer."""
    sizes = []
    empty = torch.empty

    def recording_empty(*shape, **kwargs):
        out = empty(*shape, **kwargs)
        sizes.append(out.numel())
        return out

    gen = torch.Generator().manual_seed(n)
    s = torch.randn(2, n, generator=gen)
    ref, fused = _pair(network, "cauchy")
    monkeypatch.setattr(kern.torch, "empty", recording_empty)
    full = max(sizes or [0])
    for threshold in (kern.CHECKPOINT_ELEMENTS, 0):
        monkeypatch.setattr(kern, "CHECKPOINT_ELEMENTS", threshold)
        sizes.clear()
        _check(lambda x: ref.topk_rows(x, 3), lambda x: fused.topk_rows(x, 3), s, "cauchy", gen)
        if network != "splitter_selection":
            _check(lambda x: ref(x), lambda x: fused(x), s, "cauchy", gen)
        full = max(sizes) if threshold else full
    L = len(build(network, n, 3 if network == "splitter_selection" else None).layers)
    assert L >= 9 and max(sizes) < full  # the largest buffer, the rows snapshots, shrank


@pytest.mark.parametrize("cap", ["P", "rows", "soft_sort"])
def test_torch_func_and_second_derivatives_match_pytorch(cap):
    """vmap (folded into the batch), grad, the recorded (differentiable) backward and forward mode (torch.func.hessian)
    of the kernel Function equal the PyTorch path's, float32."""
    ref, fused = _pair("bitonic", "cauchy")
    f = {"P": lambda op, x: op._permutation(x, None), "rows": lambda op, x: op._permutation(x, 2),
         "soft_sort": lambda op, x: op._soft_sort(x)}[cap]
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(3, 2, 6, generator=gen)
    torch.testing.assert_close(torch.func.vmap(lambda x: f(fused, x))(xs), torch.stack([f(ref, x) for x in xs]),
                               atol=1e-5, rtol=1e-5)
    x = xs[0]

    def hvp(op):
        leaf = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(f(op, leaf).sin().sum(), leaf, create_graph=True)
        return torch.autograd.grad(g.sum(), leaf)[0]

    torch.testing.assert_close(hvp(fused), hvp(ref), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.func.grad(lambda x: f(fused, x).sin().sum())(x),
                               torch.func.grad(lambda x: f(ref, x).sin().sum())(x), atol=1e-5, rtol=1e-4)
    v = x[0]
    hessians = [torch.func.hessian(lambda v, op=op: f(op, v.unsqueeze(0)).sin().sum())(v) for op in (fused, ref)]
    torch.testing.assert_close(*hessians, atol=1e-4, rtol=1e-4)
