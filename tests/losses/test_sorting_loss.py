"""Ranking-supervision losses: Q orientation by hand, minimal at the hard permutation, capability errors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from diffrank.losses.sorting import (
    BubbleSwapLoss,
    RowSoftmaxCELoss,
    SoftRankMSELoss,
    SortingBCELoss,
    permutation_matrix,
    true_order,
    true_ranks,
)
from diffrank.operators import load
from diffrank.operators.base import RankingOperator
from diffrank.operators.neuralsort import NeuralSort
from diffrank.operators.relaxed_bubble_sort import RelaxedBubbleSort


class FixedP(RankingOperator):
    """Returns a given P whatever the scores (to test the loss alone)."""

    def __init__(self, p: torch.Tensor) -> None:
        super().__init__(1.0)
        self.p = p

    def _permutation(self, scores, k):
        return self.p


def test_ground_truth_orientation_by_hand():
    values = torch.tensor([[20, 50, 10]])
    assert true_order(values).tolist() == [[1, 0, 2]]   # rank 1 = the largest value (item 1)
    assert true_ranks(values).tolist() == [[2, 1, 3]]
    assert permutation_matrix(values)[0].tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 1]]
    assert true_order(torch.tensor([[3, 3, 1]])).tolist() == [[0, 1, 2]]  # ties by item index


def test_hard_permutation_is_the_minimum_over_all_permutations():
    values = torch.tensor([[20, 50, 10, 40]])
    q = permutation_matrix(values)
    for form in ("bce", "ce", "ce_rows"):
        losses = {}
        for perm in itertools.permutations(range(4)):
            p = torch.eye(4)[list(perm)].unsqueeze(0)
            losses[perm] = SortingBCELoss(FixedP(p), form=form)(torch.zeros(1, 4), values).item()
        best = min(losses, key=losses.get)
        assert torch.equal(torch.eye(4)[list(best)], q[0]) and losses[best] == 0.0
        assert sorted(losses.values())[1] > 1.0  # any other permutation costs a clamped log


def test_bce_value_by_hand():
    p = torch.tensor([[[0.8, 0.2], [0.2, 0.8]]])
    values = torch.tensor([[2, 1]])  # item 0 first: Q = I
    expected = -torch.log(torch.tensor(0.8))  # every entry contributes -log 0.8
    assert SortingBCELoss(FixedP(p))(torch.zeros(1, 2), values).item() == pytest.approx(expected.item(), rel=1e-6)
    ce = SortingBCELoss(FixedP(p), form="ce")(torch.zeros(1, 2), values).item()
    assert ce == pytest.approx(expected.item(), rel=1e-6)


def test_loss_decreases_towards_the_true_order_with_an_operator():
    op = load("neuralsort", beta=4.0)
    loss = SortingBCELoss(op)
    values = torch.tensor([[3, 1, 2, 5, 4]])
    good = values.float()
    assert loss(good, values) < loss(-good, values)
    assert loss(10 * good, values) < loss(good, values)  # sharper and right: closer to the hard Q
    assert loss(10 * good, values).item() < 1e-3


def test_gradients_stay_finite_when_p_has_exact_zeros():
    s = torch.tensor([[0.0, 100.0, -100.0]], requires_grad=True)
    loss = SortingBCELoss(load("neuralsort", beta=10.0))(s, torch.tensor([[3, 2, 1]]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(s.grad).all()


def test_rank_mse_with_fast_soft_sort():
    loss = SoftRankMSELoss(load("fast_soft_sort", beta=100.0))
    values = torch.tensor([[3, 1, 2]])
    assert loss(torch.tensor([[3.0, 1.0, 2.0]]), values).item() == pytest.approx(0.0, abs=1e-6)
    assert loss(torch.tensor([[1.0, 3.0, 2.0]]), values).item() == pytest.approx(8 / 3, rel=1e-5)


def test_operator_that_cannot_serve_the_loss_is_rejected():
    with pytest.raises(ValueError, match="needs an operator that provides 'permutation'.*FastSoftSort"):
        SortingBCELoss(load("fast_soft_sort"))
    with pytest.raises(ValueError, match="form"):
        SortingBCELoss(load("neuralsort"), form="kl")


def test_bad_scores_or_values():
    loss = SortingBCELoss(load("neuralsort"))
    with pytest.raises(ValueError, match="shape"):
        loss(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="non-finite"):
        loss(torch.tensor([[0.0, float("nan")]]), torch.tensor([[1, 2]]))


def test_bubble_swap_loss_by_hand():
    """n = 2: one comparison of the scores listed in true ascending order, swap probability σ(β(a - b))."""
    loss = BubbleSwapLoss(RelaxedBubbleSort(beta=2.0))
    scores = torch.tensor([[0.3, -0.2], [1.0, 2.0]], dtype=torch.float64)
    values = torch.tensor([[5.0, 1.0], [1.0, 5.0]], dtype=torch.float64)  # ascending items: [1, 0] and [0, 1]
    want = (torch.sigmoid(2.0 * torch.tensor(-0.2 - 0.3)) + torch.sigmoid(2.0 * torch.tensor(1.0 - 2.0))) / 2
    assert torch.allclose(loss(scores, values), want.double())


def test_bubble_swap_loss_counts_inversions_and_rejects_other_operators():

    loss = BubbleSwapLoss(RelaxedBubbleSort(beta=1e4, early_exit=False))
    values = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    assert loss(values.clone(), values).item() < 1e-6                        # sorted: no swap
    assert abs(loss(values.flip(1).clone(), values).item() - 6.0) < 1e-4     # reversed: n(n-1)/2 inversions
    with pytest.raises(ValueError, match="relaxed_bubble_sort"):
        BubbleSwapLoss(NeuralSort())


def test_row_softmax_ce_by_hand_and_minimal_at_the_true_order():
    values = torch.tensor([[20, 50, 10]])  # rank 1 = item 1, rank 2 = item 0, rank 3 = item 2
    logits = torch.tensor([[[0.0, 2.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 3.0]]], dtype=torch.float64)
    e = math.e
    expected = -((2 - math.log(2 + e ** 2)) + (1 - math.log(e + 2)) + (3 - math.log(2 + e ** 3))) / 3
    assert RowSoftmaxCELoss()(logits, values).item() == pytest.approx(expected, rel=1e-12)
    q = permutation_matrix(values, torch.float64)
    assert RowSoftmaxCELoss()(50 * q, values).item() < 1e-12  # the true permutation's logits: loss -> 0
    cycle = torch.tensor([[20, 10, 50]])  # a 3-cycle: Q^T (rows = items) is another permutation
    q3 = permutation_matrix(cycle, torch.float64)
    assert RowSoftmaxCELoss()(50 * q3.transpose(1, 2), cycle).item() > 10
    assert torch.autograd.gradcheck(lambda x: RowSoftmaxCELoss()(x, values), logits.clone().requires_grad_())


def test_row_softmax_ce_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\(B, n, n\)"):
        RowSoftmaxCELoss()(torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\(B, n, n\)"):
        RowSoftmaxCELoss()(torch.zeros(2, 3, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="non-finite"):
        RowSoftmaxCELoss()(torch.full((1, 2, 2), float("nan")), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="non-finite"):
        RowSoftmaxCELoss()(torch.zeros(1, 2, 2), torch.tensor([[float("inf"), 0.0]]))
