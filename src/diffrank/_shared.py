"""What the Triton kernels and the operators both need, in one module that imports neither (nor Triton): the
kernels import it, the operators import it, and the arrow between the two packages only ever points from an
operator to a kernel launcher.

- :data:`PAV_TOL`: fast soft sort's partition tolerance (Blondel et al. 2020; the authors' ``_partition``), read by
  the numba kernels (:mod:`diffrank.operators.fast_soft_sort_cpu`) and the Triton ones
  (:mod:`diffrank.kernels.fast_soft_sort`) alike.
- :func:`unsort`: a row-wise result in sorted order written back in the items' order (LapSum's Triton launches and
  its PyTorch path).
"""

from __future__ import annotations

import torch
from torch import Tensor

PAV_TOL = 1e-9  # the authors' partition tolerance (fast_soft_sort.numpy_ops._partition; torchsort's partition())


def unsort(x_sorted: Tensor, order: Tensor) -> Tensor:
    """``x`` with ``x[..., order[..., i]] = x_sorted[..., i]``: undo a sort along the last dimension.

    Args:
        x_sorted: ``(..., n)`` values in sorted order; order: ``(..., n)`` the sort's permutation (``sort().indices``).

    Returns:
        ``(..., n)`` of the dtype of ``x_sorted``, in the items' order.

    Raises:
        RuntimeError: from ``scatter_`` for shapes that do not match.
    """
    return torch.empty_like(x_sorted).scatter_(-1, order, x_sorted)
