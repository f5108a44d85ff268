"""The deep kNN loss by hand; the learned β."""

from __future__ import annotations

import math

import pytest
import torch

from diffrank.losses.knn import NeighbourLoss
from diffrank.operators import load


def test_loss_by_hand_on_four_templates():
    """Query at 0; templates at distances 1, 2, 3, 4 with labels (same, other, other, same). k = 2."""
    q, yq = torch.zeros(1, 1), torch.tensor([0])
    t, yt = torch.tensor([[1.0], [-2.0], [3.0], [-4.0]]), torch.tensor([0, 1, 1, 0])
    hard = NeighbourLoss(load("neuralsort", beta=100.0), k=2)
    torch.testing.assert_close(hard(q, yq, t, yt), torch.tensor(1.0))  # nearest two: one of each label
    op = load("lapsum", beta=1.0)
    soft = NeighbourLoss(op, k=2)
    a = op.topk_membership(torch.tensor([[-1.0, -2.0, -3.0, -4.0]]), [2])[0, 0]
    torch.testing.assert_close(soft(q, yq, t, yt), a[1] + a[2])
    torch.testing.assert_close(a.sum(), torch.tensor(2.0))
    # mean over queries: a second query whose nearest two are both of another label
    q2, yq2 = torch.zeros(2, 1), torch.tensor([0, 2])
    torch.testing.assert_close(hard(q2, yq2, t, yt), torch.tensor(1.5))


def test_learned_beta_scales_the_scores():
    g = torch.Generator().manual_seed(0)
    q, t = torch.randn(5, 3, generator=g), torch.randn(12, 3, generator=g)
    yq, yt = torch.randint(0, 3, (5,), generator=g), torch.randint(0, 3, (12,), generator=g)
    learned = NeighbourLoss(load("lapsum", beta=2.0), k=3, learn_beta=True)
    with torch.no_grad():
        learned.log_scale.fill_(math.log(3.0))
    fixed = NeighbourLoss(load("lapsum", beta=6.0), k=3)
    torch.testing.assert_close(learned(q, yq, t, yt), fixed(q, yq, t, yt))
    learned(q, yq, t, yt).backward()
    assert learned.log_scale.grad is not None and torch.isfinite(learned.log_scale.grad)
    torch.testing.assert_close(learned.beta, torch.tensor(6.0))


def test_errors():
    with pytest.raises(ValueError, match="learn_beta"):
        NeighbourLoss(load("soft_topk"), learn_beta=True)
    with pytest.raises(ValueError, match="topk_membership"):
        NeighbourLoss(load("fast_soft_sort"))
    loss = NeighbourLoss(load("lapsum"), k=4)
    with pytest.raises(ValueError, match="more than k"):
        loss(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
