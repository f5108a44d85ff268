"""diffrank.metrics: each metric equals scikit-learn's / scipy's on random lists with ties, a masked list equals
the same list without its padding, hand-computed values, the empty / undefined policies and the input errors."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch

from diffrank import metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")


def _lists(seed: int, count: int = 60, low: int = 2, high: int = 9, levels: int = 4):
    """Random lists with many ties: integer scores and labels in [0, levels)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        n = int(torch.randint(low, high, (1,), generator=g))
        s = torch.randint(0, levels, (n,), generator=g).double()
        r = torch.randint(0, levels, (n,), generator=g).double()
        yield s, r


def _padded(rows: list[tuple[torch.Tensor, torch.Tensor]], seed: int = 0):
    """The lists in one (B, n_max + 2) batch, their items at random positions among padding that holds NaN scores and
    -1 labels (allRank's padding), and the mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(len(s) for s, _ in rows) + 2
    scores = torch.full((len(rows), width), math.nan, dtype=torch.float64)
    labels = torch.full((len(rows), width), -1.0, dtype=torch.float64)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, (s, r) in enumerate(rows):
        where = torch.randperm(width, generator=g)[:len(s)].sort().values
        scores[b, where], labels[b, where], mask[b, where] = s, r, True
    return scores, labels, mask


@pytest.mark.parametrize("k", [None, 1, 3, 20])
def test_ndcg_equals_scikit_learn_with_ties_for_both_gains(k):
    for s, r in _lists(1, count=30):
        if r.sum() == 0:
            continue
        want = sklearn_metrics.ndcg_score(r[None].numpy(), s[None].numpy(), k=k)
        assert float(metrics.ndcg(s, r, k=k, gain="linear")) == pytest.approx(want, abs=1e-12)
        # 2^rel - 1 is the linear gain of the transformed labels
        want = sklearn_metrics.ndcg_score((2 ** r - 1)[None].numpy(), s[None].numpy(), k=k)
        assert float(metrics.ndcg(s, r, k=k)) == pytest.approx(want, abs=1e-12)


def _tie_orders(s: torch.Tensor):
    """Every order of the items by decreasing score, tied items in every order (the orders a random tie-break
    gives, each once per group permutation)."""
    for perm in itertools.permutations(range(len(s))):
        if all(s[perm[i]] >= s[perm[i + 1]] for i in range(len(s) - 1)):
            yield perm


@pytest.mark.parametrize("k", [1, 2, 4])
def test_ndcg_and_recall_average_over_the_orders_that_break_ties(k):
    """The tie policy of ndcg and recall_at_k: the mean of the metric over the tie-breaking orders."""
    for s, r in _lists(2, count=25, high=7, levels=3):
        if r.sum() == 0:
            continue
        ideal = sum((2 ** v - 1) / math.log2(i + 2) for i, v in enumerate(sorted(r.tolist(), reverse=True)[:k]))
        ndcgs, recalls = [], []
        for perm in _tie_orders(s):
            ndcgs.append(sum((2 ** float(r[j]) - 1) / math.log2(i + 2) for i, j in enumerate(perm[:k])) / ideal)
            recalls.append(sum(float(r[j] > 0) for j in perm[:k]) / float((r > 0).sum()))
        assert float(metrics.ndcg(s, r, k=k)) == pytest.approx(np.mean(ndcgs), abs=1e-12)
        assert float(metrics.recall_at_k(s, r, k)) == pytest.approx(np.mean(recalls), abs=1e-12)


def test_average_precision_equals_scikit_learn_with_ties():
    for s, r in _lists(3, count=40):
        if not (r > 0).any():
            continue
        want = sklearn_metrics.average_precision_score((r > 0).numpy(), s.numpy())
        assert float(metrics.average_precision(s, r)) == pytest.approx(want, abs=1e-12)


def test_mrr_is_the_pessimistic_reciprocal_rank_of_the_first_relevant_item():
    for s, r in _lists(4):
        rel = r > 0
        if not rel.any():
            continue
        if rel.sum() == 1:  # scikit-learn's label ranking AP is 1 / rank for one relevant label
            want = sklearn_metrics.label_ranking_average_precision_score(rel[None].numpy(), s[None].numpy())
        else:
            want = 1.0 / int((s >= s[rel].max()).sum())
        assert float(metrics.mrr(s, r)) == pytest.approx(want, abs=1e-12)
        rank = int((s >= s[rel].max()).sum())
        assert float(metrics.mrr(s, r, k=2)) == pytest.approx(1.0 / rank if rank <= 2 else 0.0, abs=1e-12)


def test_spearman_and_kendall_tau_b_equal_scipy_with_ties():
    checked = 0
    for x, y in _lists(5, count=80):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy warns on a constant input, and returns NaN
            rho, tau = stats.spearmanr(x.numpy(), y.numpy()).statistic, stats.kendalltau(x.numpy(), y.numpy()).statistic
        if math.isnan(rho):
            assert float(metrics.spearman(x, y)) == 0.0 and float(metrics.kendall_tau(x, y)) == 0.0
            assert math.isnan(float(metrics.spearman(x, y, undefined="nan")))
            assert math.isnan(float(metrics.kendall_tau(x, y, undefined="nan")))
            continue
        assert float(metrics.spearman(x, y)) == pytest.approx(rho, abs=1e-12)
        assert float(metrics.kendall_tau(x, y)) == pytest.approx(tau, abs=1e-12)
        checked += 1
    assert checked > 50


def test_a_masked_list_equals_the_list_without_its_padding():
    rows = list(_lists(6, count=30))
    scores, labels, mask = _padded(rows)
    batched = {
        "ndcg": metrics.ndcg(scores, labels, mask=mask),
        "ndcg@3": metrics.ndcg(scores, labels, k=3, mask=mask, gain="linear"),
        "recall@2": metrics.recall_at_k(scores, labels, 2, mask=mask),
        "mrr": metrics.mrr(scores, labels, mask=mask),
        "ap": metrics.average_precision(scores, labels, mask=mask),
        "spearman": metrics.spearman(scores, labels, mask=mask),
        "kendall": metrics.kendall_tau(scores, labels, mask=mask),
    }
    for b, (s, r) in enumerate(rows):
        alone = {
            "ndcg": metrics.ndcg(s, r), "ndcg@3": metrics.ndcg(s, r, k=3, gain="linear"),
            "recall@2": metrics.recall_at_k(s, r, 2), "mrr": metrics.mrr(s, r), "ap": metrics.average_precision(s, r),
            "spearman": metrics.spearman(s, r), "kendall": metrics.kendall_tau(s, r),
        }
        for name, value in alone.items():
            assert float(batched[name][b]) == pytest.approx(float(value), abs=1e-12), (name, b)


def test_hand_computed_values():
    s = torch.tensor([3.0, 2.0, 1.0])
    r = torch.tensor([0.0, 1.0, 2.0])
    # ranked labels 0, 1, 2: gains 0, 1, 3; ideal 2, 1, 0: gains 3, 1, 0
    dcg, ideal = 1 / math.log2(3) + 3 / math.log2(4), 3 + 1 / math.log2(3)
    assert float(metrics.ndcg(s, r)) == pytest.approx(dcg / ideal)
    linear = (1 / math.log2(3) + 2 / 2) / (2 + 1 / math.log2(3))
    assert float(metrics.ndcg(s, r, gain="linear")) == pytest.approx(linear)
    assert float(metrics.ndcg(s, r, k=1)) == 0.0
    # two tied items, one relevant: each gets half the gain at rank 1
    assert float(metrics.ndcg(torch.zeros(2), torch.tensor([1.0, 0.0]), k=1)) == pytest.approx(0.5)
    assert float(metrics.recall_at_k(torch.tensor([0.9, 0.8, 0.1]), torch.tensor([1, 0, 1]), 1)) == pytest.approx(0.5)
    assert float(metrics.mrr(torch.tensor([0.1, 0.9, 0.5]), torch.tensor([1, 0, 0]))) == pytest.approx(1 / 3)
    assert float(metrics.mrr(torch.tensor([0.1, 0.9, 0.5]), torch.tensor([1, 0, 0]), k=2)) == 0.0
    # relevant at ranks 1 and 3: (1/1 + 2/3) / 2
    assert float(metrics.average_precision(torch.tensor([0.9, 0.5, 0.1]), torch.tensor([1, 0, 1]))) \
        == pytest.approx(5 / 6)
    assert float(metrics.spearman(torch.tensor([1.0, 2, 3]), torch.tensor([3.0, 2, 1]))) == pytest.approx(-1.0)
    assert float(metrics.kendall_tau(torch.tensor([1.0, 2, 3]), torch.tensor([1.0, 3, 2]))) == pytest.approx(1 / 3)


@pytest.mark.parametrize("fn", [metrics.ndcg, metrics.mrr, metrics.average_precision,
                                lambda s, r, **kw: metrics.recall_at_k(s, r, 2, **kw)])
def test_a_list_without_a_relevant_item_takes_the_empty_policy(fn):
    s = torch.tensor([[0.3, 0.2, 0.1], [0.3, 0.2, 0.1]])
    r = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, True], [False, False, False]])  # the second list has no real item
    for empty, want in (("zero", 0.0), ("one", 1.0)):
        assert fn(s, r, empty=empty).tolist()[0] == want
        assert fn(s, r, mask=mask, empty=empty).tolist() == [want, want]
    assert fn(s, r, empty="zero").tolist()[1] > 0  # all relevant: defined, not the policy's value
    assert torch.isnan(fn(s, r, mask=mask, empty="nan")).all()


def test_dtypes_and_batch_shapes():
    s = torch.randn(2, 3, 5)
    r = torch.randint(0, 3, (2, 3, 5))
    for fn in (metrics.ndcg, metrics.mrr, metrics.average_precision, metrics.spearman, metrics.kendall_tau):
        out = fn(s, r)
        assert out.shape == (2, 3) and out.dtype == torch.float32
        assert fn(s.double(), r).dtype == torch.float64
        assert fn(s.double(), r.double()).dtype == torch.float64
        assert fn(s[0, 0], r[0, 0]).shape == ()
    assert metrics.ndcg(torch.randint(0, 5, (4, 6)), torch.randint(0, 2, (4, 6))).dtype == torch.float32


def test_bad_input_raises_clear_errors():
    s, r = torch.randn(2, 4), torch.randint(0, 3, (2, 4)).float()
    with pytest.raises(ValueError, match="shape"):
        metrics.ndcg(s, r[:, :3])
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        metrics.ndcg(s, r, k=0)
    with pytest.raises(TypeError, match="k must be an integer"):
        metrics.recall_at_k(s, r, 1.5)
    with pytest.raises(TypeError, match="bool"):
        metrics.ndcg(s, r, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="mask must have the shape"):
        metrics.ndcg(s, r, mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=">= 0"):
        metrics.ndcg(s, -r - 1)
    with pytest.raises(ValueError, match="NaN or inf"):
        metrics.mrr(torch.tensor([0.1, math.nan]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="gain"):
        metrics.ndcg(s, r, gain="log")
    with pytest.raises(ValueError, match="empty"):
        metrics.ndcg(s, r, empty="skip")
    with pytest.raises(ValueError, match="undefined"):
        metrics.spearman(s, r, undefined="one")
    with pytest.raises(TypeError, match="real"):
        metrics.kendall_tau(s, r.bool())
    with pytest.raises(ValueError, match="n >= 1 items"):
        metrics.ndcg(torch.tensor(1.0), torch.tensor(1.0))
    # NaN where the mask says padding is never read
    nan = torch.tensor([0.5, math.nan])
    assert float(metrics.ndcg(nan, torch.tensor([1.0, -1.0]), mask=torch.tensor([True, False]))) == 1.0
