"""EM / EW / EM5 computed by hand on small sets."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.metrics.sorting import ElementWiseAccuracy, ExactMatch, correct_positions


def test_by_hand():
    values = torch.tensor([[10, 30, 20], [1, 2, 3], [5, 4, 3]])
    scores = torch.tensor([[0.1, 0.9, 0.5],   # right order
                           [0.3, 0.2, 0.9],   # items 0 and 1 swapped: sorted positions 0, 1 wrong
                           [0.0, 1.0, 2.0]])  # reversed: only the middle position is right
    assert correct_positions(scores, values).tolist() == [[True] * 3, [False, False, True], [False, True, False]]
    em, ew = ExactMatch(), ElementWiseAccuracy()
    em.update(scores, values)
    ew.update(scores, values)
    assert em.compute().item() == pytest.approx(1 / 3)
    assert ew.compute().item() == pytest.approx((3 + 1 + 1) / 9)


def test_accumulates_over_batches_and_resets():
    em = ExactMatch()
    em.update(torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 2]]))
    em.update(torch.tensor([[2.0, 1.0], [1.0, 2.0], [0.0, 3.0]]), torch.tensor([[1, 2], [1, 2], [1, 2]]))
    assert em.compute().item() == pytest.approx(3 / 4)
    em.reset()
    assert em.compute().item() == 0.0  # nothing seen: 0, not NaN


def test_ties_follow_the_stable_order():
    # tied true values: the stable argsort orders them by item index; a prediction must do the same
    values = torch.tensor([[7, 7, 1], [7, 7, 1]])
    scores = torch.tensor([[0.5, 0.6, 0.0], [0.6, 0.5, 0.0]])
    assert correct_positions(scores, values).tolist() == [[True, True, True], [True, False, False]]
    # tied scores are ordered by item index too
    assert correct_positions(torch.zeros(1, 3), torch.tensor([[1, 2, 3]])).all()
    assert not correct_positions(torch.zeros(1, 3), torch.tensor([[3, 2, 1]]))[0, 0]


def test_em5_is_em_on_5_sets_and_small_n():
    em5 = ExactMatch()
    v = torch.tensor([[5, 1, 4, 2, 3]])
    em5.update(torch.tensor([[5.0, 1, 4, 2, 3]]), v)
    em5.update(torch.tensor([[5.0, 1, 4, 3, 2]]), v)
    assert em5.compute().item() == 0.5
    ew = ElementWiseAccuracy()
    ew.update(torch.tensor([[0.0, 1.0]]), torch.tensor([[2, 1]]))  # n = 2, both wrong
    assert ew.compute().item() == 0.0


def test_bad_input():
    with pytest.raises(ValueError, match=r"must be \(B, n\) or \(B, n, n\)"):
        ExactMatch().update(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="non-finite"):
        ElementWiseAccuracy().update(torch.tensor([[0.0, float("nan")]]), torch.tensor([[1, 2]]))


def test_states_sum_under_ddp():
    m = ExactMatch()
    assert m._reductions["correct"].__name__ == m._reductions["total"].__name__ == "dim_zero_sum"


def test_rank_by_item_logits_are_read_row_by_row():
    """(B, n, n) logits (row r = rank r + 1, largest first): the predicted item of each rank is its row's argmax
    (Grover et al.'s prop_correct); a matrix that is no permutation still scores its right rows."""
    values = torch.tensor([[10, 30, 20], [10, 30, 20]])  # ranks: item 1, item 2, item 0
    right = torch.eye(3)[[1, 2, 0]]
    twice = torch.eye(3)[[1, 1, 0]]  # rank 2 wrongly item 1 as well
    logits = torch.stack([right, twice])
    assert correct_positions(logits, values).tolist() == [[True] * 3, [True, False, True]]
    em, ew = ExactMatch(), ElementWiseAccuracy()
    em.update(logits, values)
    ew.update(logits, values)
    assert em.compute().item() == pytest.approx(1 / 2) and ew.compute().item() == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match=r"\(B, n, n\)"):
        correct_positions(torch.zeros(2, 3, 2), values)
