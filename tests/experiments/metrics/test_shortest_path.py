"""Warcraft metrics by hand: exact-match path accuracy and cost ratio."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.metrics.shortest_path import CostRatio, PathExactMatch, predicted_paths

LABEL = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
DETOUR = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]])
COSTS = torch.tensor([[[1.0, 1.0, 2.0], [1.0, 1.0, 1.0], [3.0, 2.0, 1.0]]])


def test_exact_match_by_hand():
    m = PathExactMatch()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert float(m.compute()) == 0.0
    m.update(torch.cat([LABEL, DETOUR]), torch.cat([LABEL, LABEL]))  # 1 of 2
    assert float(m.compute()) == pytest.approx(0.5)
    m.update(LABEL, LABEL)  # 2 of 3
    assert float(m.compute()) == pytest.approx(2 / 3)
    one_cell_off = LABEL.clone()
    one_cell_off[0, 2, 0] = 1.0
    m.reset()
    m.update(one_cell_off, LABEL)
    assert float(m.compute()) == 0.0


def test_cost_ratio_by_hand():
    m = CostRatio()
    # label cost 3, detour cost 4 -> 4/3; the label itself -> 1; mean 7/6
    m.update(torch.cat([DETOUR, LABEL]), torch.cat([LABEL, LABEL]), torch.cat([COSTS, COSTS]))
    assert float(m.compute()) == pytest.approx((4 / 3 + 1) / 2)


def test_predicted_paths_use_dijkstra_on_absolute_costs():
    assert torch.equal(predicted_paths(COSTS), LABEL)
    assert torch.equal(predicted_paths(-COSTS), LABEL)
    raised = COSTS.clone()
    raised[0, 1, 1] = 6.0
    assert torch.equal(predicted_paths(raised), DETOUR)


def test_errors():
    with pytest.raises(ValueError, match="B, k, k"):
        PathExactMatch().update(LABEL, LABEL[:, :2])
    with pytest.raises(ValueError, match="shape"):
        CostRatio().update(LABEL, LABEL, COSTS[:, :2])
    with pytest.raises(ValueError, match="cost <= 0"):
        CostRatio().update(LABEL, LABEL, torch.zeros_like(COSTS))
