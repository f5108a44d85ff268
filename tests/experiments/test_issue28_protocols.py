"""The issue-28 operators (sparse soft top-k, DFTopK) through the top-k classification and the deep kNN
protocols with ``fast_dev_run`` (the classification run of every top-k operator is also in test_train.py)."""

from __future__ import annotations

import pytest

from diffrank.experiments.run.train import train

NEW = ["sparse_soft_topk", "dftopk"]
SMALL = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64"]


@pytest.mark.parametrize("overrides", [["operator.p=2"], ["operator.p=2", "operator.solver=dykstra"]],
                         ids=["p2", "dykstra"])
def test_topk_classification_fast_dev_run(compose_train, overrides):
    """The configs' defaults run in test_train.py (every top-k operator); here the other p and solver."""
    metrics, _ = train(compose_train(["operator=sparse_soft_topk", "pk=half_top5", "trainer.fast_dev_run=true",
                                      *overrides, *SMALL]))
    assert 0 <= metrics["test/top1"] <= metrics["test/top5"] <= 1


@pytest.mark.slow  # ~8 s each on 2 cores
@pytest.mark.parametrize("name", NEW)
def test_knn_fast_dev_run(compose_train, name):
    metrics, _ = train(compose_train(["model=knn", "data=digits", f"operator={name}", "data.batch_size=60",
                                      "model.num_queries=30", "model.net.padding=2", "trainer.fast_dev_run=true"]))
    assert 0 <= metrics["test/top1"] <= 1
