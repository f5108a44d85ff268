"""Top-K recommendation on MovieLens-100K end to end: every recsys experiment config (fast_dev_run on a tiny .inter
file in RecBole's wheel layout), the matrix factorisation's scores and the losses over all items."""

from __future__ import annotations

import math

import pytest
import torch

from diffrank.experiments.models.recommender import DotProductScorer, MatrixFactorization
from diffrank.losses.recommendation import (
    BPRLoss,
    ItemSoftmaxLoss,
    NeuralNDCGLoss,
    sample_negatives,
)
from experiments.data.movielens_files import COUNTS, write_ml100k
from helpers import options

RECSYS = [e for e in options("experiment") if e.startswith("recsys/")]


@pytest.fixture(scope="module")
def ml_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ml100k")
    write_ml100k(root)
    return root


def test_the_rows_are_there():
    assert {"recsys/ml100k", "recsys/ml100k/bpr", "recsys/ml100k/softmax", "recsys/ml100k/neural_ndcg_neuralsort",
            "recsys/ml100k/neural_ndcg_softsort", "recsys/ml100k/approx_ndcg"} <= set(RECSYS)


def test_the_protocol_composes_with_recboles_defaults(compose_train):
    cfg = compose_train(["experiment=recsys/ml100k/neural_ndcg_softsort"], fast=False)
    assert (cfg.data.num_users, cfg.data.num_items, cfg.data.split_seed) == (943, 1682, 0)
    assert cfg.model.dim == 64 and cfg.model.optimizer.lr == 1e-3 and cfg.optimized_metric == "val/ndcg10"
    assert cfg.hydra.runtime.choices.operator == "softsort" and cfg.loss.k == 10 and cfg.paper is None


@pytest.mark.parametrize("name", RECSYS)
def test_each_row_runs_a_fast_dev_run(train_built, compose_train, ml_root, name):
    record, objects = train_built(compose_train([
        f"experiment={name}", f"paths.data_dir={ml_root}", f"data.num_users={len(COUNTS)}", "data.num_items=30",
        "data.batch_size=4", "data.eval_batch_size=5"]))
    metrics = record.metrics
    for stage in ("val", "test"):
        assert 0 <= metrics[f"{stage}/recall10"] <= metrics[f"{stage}/recall20"] <= 1, name
        assert 0 <= metrics[f"{stage}/ndcg10"] <= 1 and 0 <= metrics[f"{stage}/ndcg20"] <= 1, name
    assert math.isfinite(metrics["train/loss"])
    assert isinstance(objects["model"], MatrixFactorization)
    assert ("operator" in record.choices) == ("neural_ndcg" in name), record.choices


def test_scores_are_dot_products_over_all_items():
    net = DotProductScorer(3, 5, 4)
    users = torch.tensor([2, 0])
    assert torch.allclose(net(users), net.user.weight[users] @ net.item.weight.T)
    with pytest.raises(ValueError):
        DotProductScorer(0, 5)


def test_bpr_negatives_are_never_positives_and_the_loss_is_hand_computed():
    positives = torch.zeros(2, 6, dtype=torch.bool)
    positives[0, :5] = True
    positives[1, 2] = True
    rows = positives.nonzero()[:, 0]
    g = torch.Generator().manual_seed(0)
    negatives = sample_negatives(positives, rows.repeat(50), generator=g)
    assert not bool(positives[rows.repeat(50), negatives].any())
    # one positive (item 0, score 1): the loss is softplus(s_neg - 1) for a negative among items 1..5
    scores = torch.tensor([[1.0, 2.0, 0.0, 0.0, 0.0, 3.0]])
    loss = BPRLoss()(scores, torch.tensor([[1.0, 0, 0, 0, 0, 0]]))
    possible = [math.log1p(math.exp(s - 1.0)) for s in (2.0, 0.0, 3.0)]
    assert min(abs(loss.item() - p) for p in possible) < 1e-6
    with pytest.raises(ValueError, match="no negative"):
        sample_negatives(torch.ones(1, 3, dtype=torch.bool), torch.tensor([0]))


def test_item_softmax_is_the_mean_cross_entropy_of_the_positives():
    scores = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    positives = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    logp = torch.log_softmax(scores, -1)
    want = -(logp[0, 0] + logp[0, 2] + logp[1, 1]) / 3
    assert ItemSoftmaxLoss()(scores, positives).item() == pytest.approx(want.item())
    with pytest.raises(ValueError, match="no positive"):
        ItemSoftmaxLoss()(scores, torch.zeros_like(scores))


def test_neural_ndcg_over_all_items_rewards_ranking_the_positives_first():
    from diffrank.operators.neuralsort import NeuralSort

    loss = NeuralNDCGLoss(NeuralSort(beta=4.0), k=2)
    positives = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]])
    good = loss(torch.tensor([[5.0, 4.0, 1.0, 0.0, -1.0]]), positives)
    bad = loss(torch.tensor([[-1.0, 0.0, 1.0, 4.0, 5.0]]), positives)
    assert 0 <= good.item() < 0.05 < 0.9 < bad.item() <= 1
