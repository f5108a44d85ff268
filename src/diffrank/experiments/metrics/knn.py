"""Hard k-nearest-neighbour classification over a reference set, batched on the accelerator.

The test protocol of the deep kNN experiments (Grover et al. 2019, §5.2; Xie et al. 2020, §4.1 and App. C):
features of every training image form the reference set; a query is labelled by the majority of its k
nearest references in Euclidean distance. Distances come from chunked matmuls (‖q‖² + ‖r‖² − 2 q·r) and a
running ``topk`` over reference chunks, so memory is O(Q · chunk) and there is no Python loop over queries.
"""

from __future__ import annotations

import torch
from torch import Tensor


def knn_predict(queries: Tensor, reference: Tensor, reference_labels: Tensor, k: int, num_classes: int,
                chunk: int = 8192) -> Tensor:
    """Majority label of the ``k`` nearest references of each query (hard kNN).

    Tie rule: a vote tied between classes goes to the smallest label (scikit-learn's
    ``KNeighborsClassifier`` with uniform weights does the same); references at exactly equal distance are
    taken in no fixed order.

    Args:
        queries: ``(Q, D)`` float features. reference: ``(N, D)`` same dtype and device, N ≥ k.
        reference_labels: ``(N,)`` int64 in ``[0, num_classes)``.
        k: neighbours per query. num_classes: label count.
        chunk: references per distance block (memory O(Q · chunk)).

    Returns:
        ``(Q,)`` int64 predicted labels.

    Raises:
        ValueError: k outside ``[1, N]``, or shapes that do not fit.
    """
    n = reference.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}] (the reference size), got {k}")
    if reference_labels.shape != (n,):
        raise ValueError(f"reference_labels must have shape ({n},), got {tuple(reference_labels.shape)}")
    q2 = (queries * queries).sum(1, keepdim=True)
    best_d = queries.new_empty(queries.shape[0], 0)
    best_i = torch.empty(queries.shape[0], 0, dtype=torch.long, device=queries.device)
    for start in range(0, n, chunk):
        r = reference[start:start + chunk]
        d2 = q2 + (r * r).sum(1) - 2 * (queries @ r.T)
        d = torch.cat([best_d, d2], 1)
        i = torch.cat([best_i, torch.arange(start, start + r.shape[0], device=queries.device).expand(len(d2), -1)], 1)
        best_d, pos = d.topk(min(k, d.shape[1]), dim=1, largest=False)
        best_i = i.gather(1, pos)
    votes = torch.zeros(queries.shape[0], num_classes, device=queries.device)
    votes.scatter_add_(1, reference_labels[best_i], torch.ones_like(best_d, dtype=votes.dtype))
    return votes.argmax(1)  # first maximum = smallest label among tied classes
