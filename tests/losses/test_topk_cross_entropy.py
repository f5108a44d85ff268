"""The top-k cross-entropy: by hand, against difftopk, and its input errors."""

from __future__ import annotations

import math

import pytest
import torch

from diffrank.losses.pk import PK
from diffrank.losses.softmax_ce import SoftmaxCrossEntropyLoss
from diffrank.losses.topk_cross_entropy import TopKCrossEntropyLoss, m_subset
from diffrank.operators import load


def _hand_softsort_p():
    """SoftSort P for s = [2, 1, 0] at β = 1, rows 1-2, by hand: P[r, j] ∝ exp(-|s̃_r - s_j|)."""
    e1, e2 = math.exp(-1), math.exp(-2)
    row1 = [1 / (1 + e1 + e2), e1 / (1 + e1 + e2), e2 / (1 + e1 + e2)]
    row2 = [e1 / (1 + 2 * e1), 1 / (1 + 2 * e1), e1 / (1 + 2 * e1)]
    return row1, row2


def _sq(p):
    return -math.log(p * (1 - 2e-7) + 1e-7)


def test_three_classes_by_hand():
    s = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([1])
    r1, r2 = _hand_softsort_p()
    op = load("softsort", beta=1.0)
    # P_K = [.5, .5]: Eq. 2 gives p_y = .5 P[1,y] + .5 (P[1,y] + P[2,y])
    p_sort = 0.5 * r1[1] + 0.5 * (r1[1] + r2[1])
    assert TopKCrossEntropyLoss(op, [0.5, 0.5], top1_mode="sort")(s, y).item() == pytest.approx(_sq(p_sort), abs=1e-9)
    ce = -math.log(math.exp(1) / (math.exp(2) + math.exp(1) + 1))
    eq4 = 0.5 * ce + 0.5 * _sq(0.5 * (r1[1] + r2[1]))
    assert TopKCrossEntropyLoss(op, [0.5, 0.5], top1_mode="eq4")(s, y).item() == pytest.approx(eq4, abs=1e-9)
    sm = _sq(0.5 * math.exp(ce * -1) + 0.5 * (r1[1] + r2[1]))
    assert TopKCrossEntropyLoss(op, [0.5, 0.5], top1_mode="sm")(s, y).item() == pytest.approx(sm, abs=1e-9)
    # P_K = [1]: eq4 and sm reduce to softmax cross-entropy
    assert TopKCrossEntropyLoss(op, [1.0])(s, y).item() == pytest.approx(ce, abs=1e-9)


def test_pk_k_max():
    assert PK([0.5, 0, 0, 0, 0.5]).k_max == 5 and PK([1.0, 0.0]).k_max == 1


def test_m_subset_order():
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0, 5.0]])
    out = m_subset(logits, torch.tensor([3]), 3)
    torch.testing.assert_close(out, torch.tensor([[-1.0, 5.0, 3.0]]))


def test_gradient_only_on_subset():
    x = torch.randn(4, 12, requires_grad=True)
    y = torch.randint(0, 12, (4,))
    TopKCrossEntropyLoss(load("neuralsort"), [0.5, 0, 0, 0, 0.5], m=6)(x, y).backward()
    assert ((x.grad != 0).sum(1) <= 6).all()


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
@pytest.mark.parametrize("mode,ours", [("sm", "sm"), ("smce", "eq4"), ("sort", "sort")])
@pytest.mark.parametrize("m", [None, 8])
def test_parity_with_difftopk(method, mode, ours, m):
    difftopk = pytest.importorskip("difftopk")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 20, generator=g) * 3
    y = torch.randint(0, 20, (16,), generator=g)
    for pk in ([0.5, 0, 0, 0, 0.5], [0.2] * 5, [0.25, 0.25, 0.5]):
        ref = difftopk.TopKCrossEntropyLoss(method, inverse_temperature=0.7, p_k=pk, n=20, m=m, top1_mode=mode)
        loss = TopKCrossEntropyLoss(load(method, beta=0.7), pk, m=m, top1_mode=ours)
        xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        lr, lo = ref(xr, y), loss(xo, y)
        lr.backward()
        lo.backward()
        assert abs(lr.item() - lo.item()) < 1e-5
        torch.testing.assert_close(xo.grad, xr.grad, atol=1e-5, rtol=1e-4)


def test_half_precision_logits():
    x = torch.randn(4, 10).half()
    out = TopKCrossEntropyLoss(load("softsort"), [0.5, 0, 0, 0, 0.5])(x, torch.randint(0, 10, (4,)))
    assert out.dtype == torch.float32 and torch.isfinite(out)


# ---------------------------------------------------------------- bad input
def _loss(**kw):
    return TopKCrossEntropyLoss(load("softsort"), kw.pop("p_k", [0.5, 0, 0, 0, 0.5]), **kw)


@pytest.mark.parametrize("weights,msg", [([0.5, -0.1, 0.6], "negative"), ([0.5, 0.4], "sum to 1"),
                                         ([], "at least one"), ([float("nan"), 1.0], "finite")])
def test_bad_pk(weights, msg):
    with pytest.raises(ValueError, match=msg):
        PK(weights)
    with pytest.raises(ValueError, match=msg):
        _loss(p_k=weights)


def test_bad_m():
    with pytest.raises(ValueError, match="larger than the largest k"):
        _loss(m=5)
    with pytest.raises(ValueError, match="exceeds the number of classes"):
        _loss(m=30)(torch.randn(2, 10), torch.tensor([0, 1]))


def test_k_larger_than_n():
    with pytest.raises(ValueError, match="k = 5 > n = 4"):
        _loss()(torch.randn(2, 4), torch.tensor([0, 1]))


def test_bad_top1_mode():
    with pytest.raises(ValueError, match="top1_mode"):
        _loss(top1_mode="nope")


@pytest.mark.parametrize("loss", [_loss, lambda: SoftmaxCrossEntropyLoss()], ids=["topk_ce", "softmax_ce"])
def test_bad_labels_and_logits(loss):
    fn = loss() if not isinstance(loss, type) else loss
    x = torch.randn(3, 10)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 9\]"):
        fn(x, torch.tensor([0, 10, 1]))
    with pytest.raises(ValueError, match="must lie"):
        fn(x, torch.tensor([0, -1, 1]))
    with pytest.raises(TypeError, match="integer"):
        fn(x, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="shape"):
        fn(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.randn(10), torch.tensor([0]))
    with pytest.raises(TypeError, match="floating"):
        fn(torch.ones(3, 10, dtype=torch.long), torch.tensor([0, 1, 2]))
    x[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        fn(x, torch.tensor([0, 1, 2]))


def test_operator_without_topk_membership_is_rejected():
    class OnlyRanks(torch.nn.Module):
        capabilities = frozenset({"soft_rank"})

    with pytest.raises(ValueError, match="needs an operator that provides 'topk_membership'"):
        TopKCrossEntropyLoss(OnlyRanks(), [0.5, 0, 0, 0, 0.5])
    TopKCrossEntropyLoss(OnlyRanks(), [1.0])  # top-1 only needs no operator


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_integer_label_dtypes_are_accepted_as_int64(dtype):
    """int32 / uint8 labels failed inside gather() or cross_entropy ("expected target dtype to be Long or
    Byte"); every integer dtype gives the int64 labels' loss (floating labels stay refused)."""
    from diffrank.losses.newton import NewtonLoss

    x = torch.randn(4, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([1, 2, 3, 0])
    losses = [TopKCrossEntropyLoss(load("neuralsort"), PK([0.5, 0, 0, 0, 0.5])),
              TopKCrossEntropyLoss(load("softsort"), PK([0.5, 0.5]), m=4), SoftmaxCrossEntropyLoss(),
              NewtonLoss(TopKCrossEntropyLoss(load("softsort"), PK([0.5, 0.5]), m=4), variant="fisher", tikhonov=0.1)]
    for loss in losses:
        assert torch.equal(loss(x, y.to(dtype)), loss(x, y)), type(loss).__name__
    with pytest.raises(TypeError, match="integer tensor"):
        losses[0](x, y.float())
