"""Recall@k / NDCG@k over full rankings with the known positives left out, computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from diffrank.experiments.metrics.ranking import MeanListMetric


def test_known_positives_are_left_out_of_the_ranking():
    # item 0 is a training positive scored highest: left out, so item 2 (relevant) ranks first, item 3 second
    scores = torch.tensor([[9.0, 1.0, 5.0, 4.0, 0.0]])
    targets = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]])
    candidates = torch.tensor([[False, True, True, True, True]])
    recall, ndcg = MeanListMetric("recall", 1), MeanListMetric("ndcg", 2)
    recall.update(scores, targets, candidates)
    ndcg.update(scores, targets, candidates)
    assert recall.compute().item() == pytest.approx(0.5)
    assert ndcg.compute().item() == pytest.approx(1.0)
    # ranked with the known positive, item 2 would be second and item 3 third
    full = MeanListMetric("ndcg", 2)
    full.update(scores, targets, torch.ones_like(candidates))
    assert full.compute().item() == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))


def test_the_mean_is_over_users_with_a_relevant_candidate_and_accumulates():
    m = MeanListMetric("recall", 2)
    scores = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
    targets = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    m.update(scores, targets, torch.ones(3, 3, dtype=torch.bool))  # the third user has none: not counted
    assert m.compute().item() == pytest.approx((0.5 + 1.0) / 2)
    m.update(scores[:1], targets[:1], torch.tensor([[False, True, True]]))  # only item 2 relevant, ranked 2nd
    assert m.compute().item() == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    m.reset()
    with pytest.warns(UserWarning, match="before the ``update`` method"):  # torchmetrics says so; 0, not NaN
        assert m.compute().item() == 0.0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="name must be one of"):
        MeanListMetric("mrr", 10)
    with pytest.raises(ValueError, match="share one shape"):
        MeanListMetric("ndcg", 1).update(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
