"""The comparator-network operator (four configs): stochasticity, bidirectional rows = full P rows, fused backward vs
autograd, gradcheck for every sigmoid, monotonicity, hard limit, peer parity (diffsort / difftopk), dtypes."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from diffrank.operators import load
from diffrank.operators.networks import bitonic, odd_even, splitter_selection
from diffrank.operators.sigmoids import MONOTONIC, SIGMOIDS
from diffrank.operators.sorting_network import ComparatorNetwork, reference_forward, run_network

SIGS = list(SIGMOIDS)
FULL = ["diffsort_odd_even", "diffsort_bitonic", "difftopk_bitonic"]


def _x(B, n, seed=0, dtype=torch.float64):
    return torch.randn(B, n, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _to_ours(p_peer):
    """Peer [b, item, ascending position] -> ours [b, rank (0 = largest), item] (docs/conventions.md)."""
    return p_peer.transpose(1, 2).flip(1)


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize("n", [5, 8, 13])
def test_doubly_stochastic_and_rows(name, n):
    op = load(name)
    s = _x(3, n, n)
    p = op(s)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, n, dtype=p.dtype), atol=1e-12, rtol=0)
    torch.testing.assert_close(p.sum(-2), torch.ones(3, n, dtype=p.dtype), atol=1e-12, rtol=0)
    assert (p >= 0).all()
    for k in (1, 3, n):
        torch.testing.assert_close(op(s, k=k), p[:, :k], atol=1e-12, rtol=0)
    torch.testing.assert_close(op.soft_sort(s), (p @ s.unsqueeze(-1)).squeeze(-1), atol=1e-12, rtol=0)
    ranks = torch.arange(1, n + 1, dtype=s.dtype).view(1, -1, 1)
    torch.testing.assert_close(op.soft_rank(s), (ranks * p).sum(1), atol=1e-10, rtol=0)
    torch.testing.assert_close(op.topk_membership(s, [2, 4]), p.cumsum(1)[:, [1, 3]], atol=1e-12, rtol=0)


@pytest.mark.parametrize("sig", SIGS)
@pytest.mark.parametrize("mode", ["values", "full", "rows"])
def test_fused_backward_equals_autograd(sig, mode):
    for net in (odd_even(7), bitonic(8), bitonic(11), splitter_selection(13, 3)):
        x = _x(3, net.n, 1).requires_grad_()
        y0 = _x(1, 4 * net.n, 2).view(1, 4, net.n) if mode == "rows" else None
        a = run_network(net, x, 2.0, sig, 0.4, mode, y0)
        b = reference_forward(net, x, 2.0, sig, 0.4, mode, y0)
        g = torch.randn_like(a)
        (ga,) = torch.autograd.grad((a * g).sum(), x)
        (gb,) = torch.autograd.grad((b * g).sum(), x)
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
        torch.testing.assert_close(ga, gb, atol=1e-10, rtol=0)


@pytest.mark.parametrize("sig", SIGS)
@pytest.mark.parametrize("name", FULL + ["difftopk_splitter"])
def test_gradcheck_every_sigmoid(name, sig):
    op = load(name, beta=1.5, sigmoid=sig, art_lambda=0.5)
    s = _x(2, 6, 3).requires_grad_()
    if name == "difftopk_splitter":
        assert torch.autograd.gradcheck(lambda z: op.topk_rows(z, 2), (s,))
        assert torch.autograd.gradcheck(lambda z: op.topk_membership(z, [1, 3]), (s,))
        return
    assert torch.autograd.gradcheck(lambda z: op(z), (s,))
    assert torch.autograd.gradcheck(lambda z: op(z, k=2), (s,))
    assert torch.autograd.gradcheck(lambda z: op.soft_sort(z), (s,))


@pytest.mark.parametrize("sig", sorted(MONOTONIC))
@pytest.mark.parametrize("name", ["diffsort_odd_even", "diffsort_bitonic"])
def test_monotonic_sigmoids(name, sig):
    """Thesis Thm 3.2-3.7: with a monotonic sigmoid every soft-sorted output is non-decreasing in every
    input (non-negative Jacobian). Note: this does NOT make the soft-sorted outputs themselves ordered —
    at β = 0.7, n = 9 about 10-20 % of adjacent odd-even outputs (cauchy / reciprocal) are increasing;
    each comparator orders its own two outputs, later layers can undo it."""
    op = load(name, beta=0.7, sigmoid=sig)
    s = _x(16, 9, 4)
    jac = torch.autograd.functional.jacobian(lambda z: op.soft_sort(z), s[:2])  # (2, 9, 2, 9)
    assert (jac >= -1e-12).all()


def test_logistic_is_not_monotonic():
    """The property above can fail: logistic relaxations have negative Jacobian entries (thesis Fig. 3.5)."""
    op = load("diffsort_odd_even", beta=0.5, sigmoid="logistic")
    s = _x(2, 9, 4) * 3
    jac = torch.autograd.functional.jacobian(lambda z: op.soft_sort(z), s)
    assert (jac < -1e-6).any()


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize("n", [2, 5, 22, 38, 100])
def test_hard_limit_sorts(name, n):
    op = load(name, beta=1e4, sigmoid="logistic")
    g = torch.Generator().manual_seed(n)
    s = torch.stack([torch.randperm(n, generator=g) for _ in range(4)]).double()
    torch.testing.assert_close(op.soft_sort(s), s.sort(dim=1, descending=True).values, atol=1e-9, rtol=0)
    hard = torch.zeros(4, n, n, dtype=s.dtype).scatter_(2, s.argsort(1, descending=True).unsqueeze(-1), 1.0)
    torch.testing.assert_close(op(s, k=min(5, n)), hard[:, : min(5, n)], atol=1e-9, rtol=0)


@pytest.mark.parametrize("n", [5, 30, 64])
def test_splitter_hard_limit_topk(n):
    op = load("difftopk_splitter", beta=1e4, sigmoid="logistic")
    g = torch.Generator().manual_seed(n)
    s = torch.stack([torch.randperm(n, generator=g) for _ in range(4)]).double()
    k = min(5, n)
    hard = torch.zeros(4, n, n, dtype=s.dtype).scatter_(2, s.argsort(1, descending=True).unsqueeze(-1), 1.0)
    torch.testing.assert_close(op.topk_rows(s, k), hard[:, :k], atol=1e-9, rtol=0)
    member = op.topk_membership(s, [1, k])
    torch.testing.assert_close(member[:, 1], hard[:, :k].sum(1), atol=1e-9, rtol=0)


def test_splitter_capabilities():
    op = load("difftopk_splitter")
    s = _x(2, 7)
    for call in (lambda: op(s), lambda: op.soft_sort(s), lambda: op.soft_rank(s)):
        with pytest.raises(ValueError, match="provides only"):
            call()
    rows = op.topk_rows(s, 3)
    assert rows.shape == (2, 3, 7)
    torch.testing.assert_close(rows.sum(-1), torch.ones(2, 3, dtype=s.dtype), atol=1e-12, rtol=0)
    assert (rows.sum(-2) <= 1 + 1e-12).all()
    torch.testing.assert_close(op.topk_membership(s, [3]), rows.sum(1, keepdim=True), atol=1e-12, rtol=0)


def test_bad_constructor_args():
    with pytest.raises(ValueError, match="known sigmoids"):
        load("diffsort_bitonic", sigmoid="softmax")
    with pytest.raises(ValueError, match="art_lambda"):
        load("difftopk_bitonic", art_lambda=1.5)
    with pytest.raises(ValueError, match="network must be one of"):
        load("difftopk_bitonic", network="merge")


def test_one_class_for_every_network_config():
    ops = {name: load(name) for name in FULL + ["difftopk_splitter"]}
    assert {type(op) for op in ops.values()} == {ComparatorNetwork}
    assert [ops[n].network for n in ops] == ["odd_even", "bitonic", "bitonic", "splitter_selection"]
    assert (ops["diffsort_bitonic"].beta, ops["diffsort_bitonic"].sigmoid, ops["diffsort_bitonic"].art_lambda) == (
        10.0, "cauchy", 0.25)
    assert (ops["difftopk_bitonic"].beta, ops["difftopk_bitonic"].sigmoid, ops["difftopk_bitonic"].art_lambda) == (
        1.0, "logistic_phi", 0.5)
    assert ops["diffsort_odd_even"].doubly_stochastic and not ops["difftopk_splitter"].doubly_stochastic
    s = _x(2, 9)
    torch.testing.assert_close(ops["difftopk_bitonic"].topk_rows(s, 3), ops["difftopk_bitonic"](s, k=3))


@pytest.mark.parametrize("sig", SIGS)
def test_parity_diffsort(sig):
    diffsort = pytest.importorskip("diffsort")
    for kind, name, sizes in (("odd_even", "diffsort_odd_even", [2, 3, 8, 9, 16]),
                              ("bitonic", "diffsort_bitonic", [2, 4, 16, 32])):
        for n in sizes:
            s = _x(3, n, n)
            ref = diffsort.DiffSortNet(kind, n, steepness=3.0, distribution=sig, art_lambda=0.3)
            sorted_ref, p_ref = ref(s)
            op = load(name, beta=3.0, sigmoid=sig, art_lambda=0.3)
            # 'optimal' differs by the reference's +1e-10 in 1/(16(|v| + 1e-10))
            torch.testing.assert_close(op(s), _to_ours(p_ref), atol=1e-8, rtol=0)
            torch.testing.assert_close(op.soft_sort(s), sorted_ref.flip(1), atol=1e-8, rtol=0)


@pytest.mark.parametrize("sig", SIGS)
def test_parity_difftopk_dense_bitonic(sig):
    with contextlib.redirect_stdout(io.StringIO()):
        difftopk = pytest.importorskip("difftopk")
    n, k = 32, 5
    s = _x(3, n, 7, torch.float32)  # difftopk's dense path is float32 only
    _, x_ref = difftopk.DiffTopkNet("bitonic", n, k, sparse=False, steepness=2.0, distribution=sig, art_lambda=0.4)(s)
    ours = load("difftopk_bitonic", beta=2.0, sigmoid=sig, art_lambda=0.4)(s, k=k)
    torch.testing.assert_close(ours, _to_ours(x_ref), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", FULL + ["difftopk_splitter"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes_every_path(name, dtype):
    op = load(name)
    s = torch.randn(3, 11).to(dtype)
    outs = [op.topk_membership(s, [1, 4])]
    if name == "difftopk_splitter":
        outs.append(op.topk_rows(s, 4))
    else:
        outs += [op(s), op(s, k=4), op.soft_sort(s), op.soft_rank(s)]
    for out in outs:
        assert out.dtype == dtype and torch.isfinite(out.float()).all()


def test_device_and_any_n_from_one_instance():
    op = load("difftopk_bitonic")
    for n in (3, 17, 64, 100):
        assert op(torch.randn(2, n), k=2).shape == (2, 2, n)
    assert op(torch.randn(2, 1)).shape == (2, 1, 1)


@pytest.mark.parametrize("n", [1000])
def test_topk_rows_memory_is_linear(n):
    """k rows at n = 1000 with autograd: saved tensors O(L·B·k·n), far below one (B, n, n) per layer."""
    op = load("difftopk_bitonic")
    s = torch.randn(8, n, requires_grad=True)
    rows = op(s, k=5)
    rows.sum().backward()
    assert rows.shape == (8, 5, n) and torch.isfinite(s.grad).all()


@pytest.mark.parametrize("mode", ["full", "rows"])
def test_the_checkpointed_chain_has_the_same_gradient_and_saves_less(mode, monkeypatch):
    """Above CHECKPOINT_ELEMENTS the P / rows chain keeps a snapshot every ⌈√L⌉ layers and recomputes."""
    import diffrank.operators.sorting_network as sn

    def run(net, x, y0):
        saved = []

        def pack(t):
            saved.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            a = run_network(net, x, 2.0, "cauchy", 0.4, mode, y0)
        (g,) = torch.autograd.grad((a * torch.linspace(-1, 1, a.numel()).view_as(a)).sum(), x)
        return a, g, sum(saved)

    for net in (odd_even(37), bitonic(20), splitter_selection(13, 3)):
        x = _x(2, net.n, 1).requires_grad_()
        y0 = _x(1, net.n * net.n, 2).view(1, net.n, net.n) if mode == "rows" else None  # m = n: the chain dominates
        a, g, kept = run(net, x, y0)
        monkeypatch.setattr(sn, "CHECKPOINT_ELEMENTS", 0)
        b, h, fewer = run(net, x, y0)
        monkeypatch.undo()
        torch.testing.assert_close(b, a, atol=0, rtol=0)
        torch.testing.assert_close(h, g, atol=1e-12, rtol=0)
        if len(net.layers) >= 16:
            assert fewer < 0.6 * kept


def test_the_odd_even_networks_depth_is_counted_by_the_memory_check(monkeypatch):
    """Every call keeps two (B, <= n) tensors per layer for the backward pass, and the odd-even network has n layers:
    F.soft_rank of 50 000 items under a 6 GB address-space limit ran for 20 s and failed with torch's bare "can't
    allocate". The layers count in the memory check now (DenseMemoryError before anything large is built, naming the
    depth and the bitonic network's), for the soft sort, soft rank and top-k; the bitonic network is not refused."""
    import diffrank.functional as F
    from diffrank.operators.memory import CHECK_FROM_BYTES, DENSE_BUFFERS, ENV, DenseMemoryError

    monkeypatch.setenv(ENV, "100M")
    x = torch.randn(1, 9000)
    for call in (F.soft_rank, F.soft_sort, lambda s, **kw: F.topk_membership(s, 2, **kw)):
        with pytest.raises(DenseMemoryError, match=r"ComparatorNetwork\.\w+ on 1 set\(s\) of n = 9000 .* that network "
                                                   r"has 9000 layers at n = 9000 \(network='bitonic' has \d+\)"):
            call(x, method="diffsort_odd_even")
    # a lower bound: the values and weights the layers keep, 2 x (n - 1) / 2 per layer, as DENSE_BUFFERS rows of n
    rows = load("diffsort_odd_even")._dense_rows("soft_rank", 9000, None)
    assert DENSE_BUFFERS * rows * 9000 <= 9000 * 8999 < (DENSE_BUFFERS * rows + DENSE_BUFFERS) * 9000
    bitonic_rows = load("diffsort_bitonic")._dense_rows("soft_rank", 9000, None)
    assert DENSE_BUFFERS * bitonic_rows * 9000 * 4 < CHECK_FROM_BYTES  # O(log² n) layers: never checked at this n
