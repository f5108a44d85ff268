"""The learning-to-rank losses (diffrank.losses.ranking): float64 gradients, the hard limit of the NDCG losses, exact
padding (a masked list equals the unpadded one, values and gradients; padded items get zero gradient), float32 at
n = 10⁴, the empty policy, ListMLE and ListNet by hand, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from diffrank import metrics
from diffrank.losses import ranking
from diffrank.operators import load


def _untied(b: int, n: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """Scores at least 0.5 apart (a shuffled arange plus noise below 0.25), so that a large β gives hard ranks."""
    g = torch.Generator().manual_seed(seed)
    base = torch.stack([torch.randperm(n, generator=g) for _ in range(b)]).to(dtype)
    return base + 0.25 * torch.rand(b, n, generator=g, dtype=dtype)


def _labels(b: int, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 4, (b, n), generator=g).double()
    r[:, 0] = 1.0  # every list has a relevant item (the empty policy has its own test)
    return r


# name → loss(scores, labels, **kw); each takes mask= and reduction=
LOSSES = {
    "approx_ndcg": lambda s, r, **kw: ranking.approx_ndcg_loss(s, r, beta=2.0, **kw),
    "approx_ndcg@3": lambda s, r, **kw: ranking.approx_ndcg_loss(s, r, k=3, beta=2.0, **kw),
    # 10 Sinkhorn passes rather than 50: the same code path, a fifth of the gradcheck's time
    "neural_ndcg": lambda s, r, **kw: ranking.neural_ndcg_loss(s, r, beta=1.0, sinkhorn_iterations=10, **kw),
    "neural_ndcg@2_no_sinkhorn": lambda s, r, **kw: ranking.neural_ndcg_loss(s, r, k=2, sinkhorn_iterations=0, **kw),
    "neural_ndcg_transposed@3": lambda s, r, **kw: ranking.neural_ndcg_loss(s, r, k=3, transposed=True,
                                                                                    sinkhorn_iterations=10, **kw),
    "listnet": ranking.listnet_loss,
    "listmle": ranking.listmle_loss,
    "listmle@2": lambda s, r, **kw: ranking.listmle_loss(s, r, k=2, **kw),
    "soft_spearman": ranking.soft_spearman_loss,
    "pirank@2": lambda s, r, **kw: ranking.pirank_loss(s, r, k=2, **kw),
    "smooth_ap": lambda s, r, **kw: ranking.smooth_ap_loss(s, r, beta=2.0, **kw),
}


@pytest.mark.parametrize("name", LOSSES)
def test_float64_gradcheck(name):
    s = (torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))).requires_grad_()
    r = _labels(2, 5)
    mask = torch.tensor([[True] * 5, [True, False, True, True, False]])
    fn = LOSSES[name]
    assert torch.autograd.gradcheck(lambda x: fn(x, r, reduction="none"), (s,))
    assert torch.autograd.gradcheck(lambda x: fn(x, r, mask=mask), (s,))


@pytest.mark.parametrize("k", [None, 1, 3])
def test_ndcg_losses_tend_to_one_minus_the_hard_ndcg(k):
    s, r = _untied(4, 7), _labels(4, 7)
    want = 1 - metrics.ndcg(s, r, k=k)
    got = {
        "approx": ranking.approx_ndcg_loss(s, r, k=k, beta=1e4, reduction="none"),
        "approx, fast soft rank": ranking.approx_ndcg_loss(s, r, k=k, beta=1e4, reduction="none",
                                                           operator=load("fast_soft_sort", beta=1e4)),
        "neural": ranking.neural_ndcg_loss(s, r, k=k, beta=1e4, reduction="none"),
        "neural, no Sinkhorn": ranking.neural_ndcg_loss(s, r, k=k, reduction="none", sinkhorn_iterations=0,
                                                         operator=load("neuralsort", beta=1e4)),
        "neural transposed": ranking.neural_ndcg_loss(s, r, k=k, beta=1e4, transposed=True, reduction="none"),
        "pirank": ranking.pirank_loss(s, r, k=k, beta=1e4, reduction="none"),
    }
    for name, value in got.items():
        torch.testing.assert_close(value, want, atol=1e-9, rtol=0, msg=name)
    # and the soft versions are not the hard value already (the limit is a limit)
    soft = ranking.approx_ndcg_loss(s, r, k=k, beta=0.5, reduction="none")
    assert (soft - want).abs().max() > 1e-3


def test_soft_spearman_tends_to_one_minus_spearman():
    s, y = _untied(3, 8), _untied(3, 8, seed=5)
    want = 1 - metrics.spearman(s, y)
    torch.testing.assert_close(ranking.soft_spearman_loss(s, y, beta=1e4, reduction="none"), want, atol=1e-9, rtol=0)
    torch.testing.assert_close(ranking.soft_spearman_loss(s, y, beta=1e4, soft_target=True, reduction="none"), want,
                               atol=1e-9, rtol=0)


def _rows(seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 1, 3, 5, 2, 3]
    return [(torch.randn(n, dtype=torch.float64, generator=g), torch.randint(0, 3, (n,), generator=g).double())
            for n in lengths]


def _padded(rows):
    """One batch: each list's items at random positions among NaN scores and -1 labels, a mask, and a last list
    without a real item."""
    g = torch.Generator().manual_seed(0)
    width = max(len(s) for s, _ in rows) + 2
    scores = torch.full((len(rows) + 1, width), math.nan, dtype=torch.float64)
    labels = torch.full((len(rows) + 1, width), -1.0, dtype=torch.float64)
    mask = torch.zeros((len(rows) + 1, width), dtype=torch.bool)
    places = []
    for b, (s, r) in enumerate(rows):
        where = torch.randperm(width, generator=g)[:len(s)].sort().values
        scores[b, where], labels[b, where], mask[b, where] = s, r, True
        places.append(where)
    return scores, labels, mask, places


@pytest.mark.parametrize("name", LOSSES)
def test_a_masked_list_equals_the_unpadded_list_values_and_gradients(name):
    fn = LOSSES[name]
    rows = _rows()
    scores, labels, mask, places = _padded(rows)
    scores.requires_grad_()
    out = fn(scores, labels, mask=mask, reduction="none")
    assert out.shape == (len(rows) + 1,) and out[-1] == 0  # the list without a real item
    out.sum().backward()
    grad = scores.grad
    assert torch.isfinite(grad).all()
    assert (grad[~mask] == 0).all()  # padded items: exactly zero
    for b, ((s, r), where) in enumerate(zip(rows, places)):
        s = s.clone().requires_grad_()
        alone = fn(s[None], r[None], reduction="none")[0]
        alone.backward()
        torch.testing.assert_close(out[b], alone, atol=1e-12, rtol=0)
        torch.testing.assert_close(grad[b, where], s.grad, atol=1e-12, rtol=0)
    # the mean runs over the lists that have a real item
    torch.testing.assert_close(fn(scores.detach(), labels, mask=mask), out.detach()[:-1].mean(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", LOSSES)
def test_a_fully_masked_batch_gives_zero_and_zero_gradients(name):
    s = torch.full((2, 4), math.nan, dtype=torch.float64, requires_grad=True)
    loss = LOSSES[name](s, torch.zeros(2, 4, dtype=torch.float64), mask=torch.zeros(2, 4, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()
    assert (s.grad == 0).all()


@pytest.mark.parametrize("name", ["listmle", "listnet", "soft_spearman", "neural_ndcg@10_topk_rows", "approx_ndcg"])
def test_finite_in_float32_at_large_n(name):
    """n = 10⁴ for the O(n log n) / O(k n) losses; the pairwise sigmoid ranks of ApproxNDCG are O(n²) in memory, so
    it runs at n = 2000. Scores spread over ±1000, far beyond exp's float32 range."""
    n = 2000 if name == "approx_ndcg" else 10_000
    g = torch.Generator().manual_seed(0)
    s = (1000 * torch.randn(1, n, generator=g)).requires_grad_()
    r = torch.randint(0, 5, (1, n), generator=g).float()
    fns = {
        "listmle": lambda: ranking.listmle_loss(s, r),
        "listnet": lambda: ranking.listnet_loss(s, r),
        "soft_spearman": lambda: ranking.soft_spearman_loss(s, r),
        "neural_ndcg@10_topk_rows": lambda: ranking.neural_ndcg_loss(s, r, k=10, sinkhorn_iterations=0),
        "approx_ndcg": lambda: ranking.approx_ndcg_loss(s, r, k=10),
    }
    loss = fns[name]()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(s.grad).all()


@pytest.mark.parametrize("name", ["approx", "neural", "neural_transposed"])
def test_the_empty_policy_of_the_ndcg_losses(name):
    fn = {"approx": ranking.approx_ndcg_loss, "neural": ranking.neural_ndcg_loss,
          "neural_transposed": lambda *a, **kw: ranking.neural_ndcg_loss(*a, transposed=True, **kw)}[name]
    s = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    r = torch.tensor([[0.0, 0, 0, 0], [1, 0, 2, 0]], dtype=torch.float64)
    zero = fn(s, r, empty="zero", reduction="none")
    one = fn(s, r, empty="one", reduction="none")
    assert zero[0] == 1.0 and one[0] == 0.0 and zero[1] == one[1]
    assert torch.isnan(fn(s, r, empty="nan", reduction="none")[0])
    zero.sum().backward()
    assert torch.isfinite(s.grad).all() and (s.grad[0] == 0).all()


def test_a_stochastic_operator_averages_its_samples():
    s, r = _untied(3, 6, dtype=torch.float32), _labels(3, 6).float()
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [False] * 6])
    for op_samples in (1, 4):
        op = load("neuralsort_stochastic", samples=op_samples, beta=1e4)
        for loss in (ranking.neural_ndcg_loss(s, r, operator=op, mask=mask, reduction="none"),
                     ranking.approx_ndcg_loss(s, r, operator=op, mask=mask, beta=1e4, reduction="none"),
                     ranking.soft_spearman_loss(s, r, operator=op, mask=mask, reduction="none")):
            assert loss.shape == (3,) and torch.isfinite(loss).all() and loss[-1] == 0


def test_listmle_by_hand():
    s = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)
    r = torch.tensor([[2.0, 0.0, 1.0]], dtype=torch.float64)  # the true order: item 0, item 2, item 1
    e = [math.exp(v) for v in s[0].tolist()]
    first = math.log(e[0] + e[2] + e[1]) - 0.5
    second = math.log(e[2] + e[1]) - 2.0
    assert ranking.listmle_loss(s, r).item() == pytest.approx(first + second)  # the last term is log e^s - s = 0
    assert ranking.listmle_loss(s, r, k=1).item() == pytest.approx(first)


def test_listnet_by_hand():
    s = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    r = torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64)
    p = [math.exp(v) / sum(math.exp(w) for w in r.tolist()) for v in r.tolist()]
    q = [math.exp(v) / sum(math.exp(w) for w in s.tolist()) for v in s.tolist()]
    assert ranking.listnet_loss(s, r).item() == pytest.approx(-sum(a * math.log(b) for a, b in zip(p, q)))


def test_sigmoid_soft_rank_and_sinkhorn_scaling():
    s = torch.tensor([[3.0, 1.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(ranking.sigmoid_soft_rank(s, beta=1e3), torch.tensor([[1.0, 3.0, 2.0]],
                                                                                     dtype=torch.float64))
    assert ranking.sigmoid_soft_rank(torch.zeros(1, 3)).tolist() == [[2.0, 2.0, 2.0]]  # ties: ½ each way
    p = torch.rand(2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    q = ranking.sinkhorn_scaling(p, 200)
    torch.testing.assert_close(q.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    torch.testing.assert_close(q.sum(-2), torch.ones(2, 5, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(ranking.sinkhorn_scaling(p, 3, last="columns").sum(-2), torch.ones(2, 5,
                                                                                                  dtype=torch.float64))


def test_dtypes_and_batch_shapes():
    s, r = torch.randn(2, 3, 5), torch.randint(0, 3, (2, 3, 5))
    for fn in (ranking.approx_ndcg_loss, ranking.neural_ndcg_loss, ranking.listnet_loss, ranking.listmle_loss,
               ranking.soft_spearman_loss):
        assert fn(s, r, reduction="none").shape == (2, 3)
        assert fn(s, r).dtype == torch.float32 and fn(s.double(), r).dtype == torch.float64
        assert fn(s.half(), r).dtype == torch.float32
        torch.testing.assert_close(fn(s, r, reduction="sum"), fn(s, r, reduction="none").sum())


def test_bad_input_raises_clear_errors():
    s, r = torch.randn(2, 4), torch.randint(0, 3, (2, 4)).float()
    with pytest.raises(TypeError, match="floating"):
        ranking.listnet_loss(r.long(), r)
    with pytest.raises(ValueError, match="shape"):
        ranking.listmle_loss(s, r[:, :3])
    with pytest.raises(ValueError, match="reduction"):
        ranking.approx_ndcg_loss(s, r, reduction="avg")
    with pytest.raises(TypeError, match="bool"):
        ranking.neural_ndcg_loss(s, r, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=">= 0"):
        ranking.approx_ndcg_loss(s, -r - 1)
    with pytest.raises(ValueError, match="NaN or inf"):
        ranking.listmle_loss(torch.tensor([[0.0, math.inf]]), torch.tensor([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        ranking.neural_ndcg_loss(s, r, k=0)
    with pytest.raises(ValueError, match="operator has its own"):
        ranking.neural_ndcg_loss(s, r, operator=load("neuralsort"), beta=2.0)
    with pytest.raises(ValueError, match="'permutation'"):
        ranking.neural_ndcg_loss(s, r, operator=load("fast_soft_sort"))
    with pytest.raises(ValueError, match="beta must be a positive"):
        ranking.approx_ndcg_loss(s, r, beta=0.0)
    with pytest.raises(ValueError, match="must return P of shape"):
        ranking.neural_ndcg_loss(s, r, operator=lambda x: x)
    with pytest.raises(ValueError, match="empty"):
        ranking.neural_ndcg_loss(s, r, empty="skip")


def test_smooth_ap_tends_to_one_minus_the_hard_ap_and_is_computed_by_hand():
    s, r = _untied(4, 7), _labels(4, 7)
    torch.testing.assert_close(ranking.smooth_ap_loss(s, r, beta=1e4, reduction="none"),
                               1 - metrics.average_precision(s, r), atol=1e-9, rtol=0)
    x = torch.tensor([[2.0, 0.0, 1.0]], dtype=torch.float64)  # relevant: items 0 and 1
    rel = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    sig = torch.sigmoid
    p0 = (1 + sig(torch.tensor(-2.0))) / (1 + sig(torch.tensor(-2.0)) + sig(torch.tensor(-1.0)))
    p1 = (1 + sig(torch.tensor(2.0))) / (1 + sig(torch.tensor(2.0)) + sig(torch.tensor(1.0)))
    torch.testing.assert_close(ranking.smooth_ap_loss(x, rel, beta=1.0), (1 - (p0 + p1) / 2).double())
    empty = ranking.smooth_ap_loss(x, torch.zeros_like(rel), empty="one", reduction="none")
    assert empty.tolist() == [0.0]


def test_pirank_is_neural_ndcg_without_sinkhorn():
    s, r = _untied(3, 6), _labels(3, 6)
    torch.testing.assert_close(ranking.pirank_loss(s, r, k=3, beta=0.7),
                               ranking.neural_ndcg_loss(s, r, k=3, beta=0.7, sinkhorn_iterations=0), rtol=0, atol=0)
