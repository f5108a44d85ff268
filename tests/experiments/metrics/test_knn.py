"""Hard kNN evaluation against scikit-learn; Euclidean distances."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from diffrank.experiments.metrics.knn import knn_predict
from diffrank.losses.knn import pairwise_euclidean


@pytest.mark.parametrize("k,chunk", [(1, 7), (9, 50), (9, 8192), (4, 13)])
def test_knn_predict_equals_sklearn(k, chunk):
    g = torch.Generator().manual_seed(k * 100 + chunk)
    ref = torch.randn(300, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 5, (300,), generator=g)
    queries = torch.randn(120, 6, generator=g, dtype=torch.float64)
    ours = knn_predict(queries, ref, labels, k, 5, chunk=chunk)
    sk = KNeighborsClassifier(n_neighbors=k, algorithm="brute").fit(ref.numpy(), labels.numpy())
    assert ours.dtype == torch.int64 and np.array_equal(ours.numpy(), sk.predict(queries.numpy()))


def test_vote_ties_go_to_the_smallest_label_like_sklearn():
    ref = torch.tensor([[1.0], [-1.1], [2.0], [-2.2]])
    labels = torch.tensor([3, 1, 3, 1])  # k = 4: two votes each
    q = torch.zeros(1, 1)
    sk = KNeighborsClassifier(n_neighbors=4).fit(ref.numpy(), labels.numpy()).predict(q.numpy())
    assert knn_predict(q, ref, labels, 4, 4).item() == sk[0] == 1


def test_pairwise_euclidean_is_not_squared_and_has_finite_gradient_at_zero():
    a = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    d = pairwise_euclidean(a, a)
    torch.testing.assert_close(d, torch.tensor([[1e-6, 5.0], [5.0, 1e-6]]))
    d.sum().backward()
    assert torch.isfinite(a.grad).all()
    torch.testing.assert_close(pairwise_euclidean(a, a, squared=True)[0, 1], torch.tensor(25.0))


def test_bad_inputs():
    with pytest.raises(ValueError, match="k must be"):
        knn_predict(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), 5, 2)
    with pytest.raises(ValueError, match="features"):
        pairwise_euclidean(torch.zeros(2, 3), torch.zeros(4, 2))
