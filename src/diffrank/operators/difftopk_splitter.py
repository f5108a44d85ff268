"""Differentiable splitter selection network (Petersen et al., ICML 2022, §3.2 and Appendix B; spec §2.7).

A selection network that only guarantees the k top outputs: for n = 1000, k = 5 it has 22 layers and 5 085
comparators where the bitonic sorter has 55 / 27 268. It is evaluated bidirectionally (Eq. 3) like
:class:`~diffrank.operators.difftopk_bitonic.DiffTopkBitonic`, with the network built for
k = max(ks) at call time (cached per (n, k)).

Capabilities: only ``"topk_membership"``. The rows it produces depend on the k it was built for, so
they are not the top rows of one relaxed permutation: asking for P, soft sort or soft ranks would
silently mean "the splitter network built with k = n", a different (and much deeper) network. Use
:meth:`DiffTopkSplitter.topk_rows` for the k top rows of P themselves (what difftopk's
``DiffTopkNet('splitter_selection', n, k, sparse=True)`` returns), and a sorting network
(``diffsort_bitonic``, ``difftopk_bitonic``) when the full P is needed.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from diffrank.operators.base import TOPK_MEMBERSHIP, check_k, check_scores
from diffrank.operators.networks import Network, splitter_selection
from diffrank.operators.sorting_network import SortingNetworkOperator, _compute_dtype


class DiffTopkSplitter(SortingNetworkOperator):
    """Relaxed splitter selection network: top-k membership and the k top rows of its P.

    Args:
        beta: inverse temperature β > 0 (difftopk's ``inverse_temperature``; the ImageNet README uses 1).
        sigmoid: relaxed-swap sigmoid (default ``"logistic_phi"``, the top-k paper's choice).
        art_lambda: λ of the activation replacement trick (default 0.5, the difftopk scripts' default).

    Shapes: ``topk_membership(scores (B, n), ks)`` → ``(B, len(ks), n)``; ``topk_rows(scores, k)`` →
    ``(B, k, n)``, rows sum to 1, columns sum to <= 1.

    Raises:
        ValueError: see :class:`SortingNetworkOperator`; ``forward`` / ``soft_sort`` / ``soft_rank``
            raise ``ValueError`` naming the missing capability.
    """

    capabilities: ClassVar[frozenset[str]] = frozenset({TOPK_MEMBERSHIP})

    def __init__(self, beta: float = 1.0, sigmoid: str = "logistic_phi", art_lambda: float = 0.5) -> None:
        super().__init__(beta, sigmoid, art_lambda)

    def network(self, n: int, k: int | None) -> Network:
        """The splitter selection network for n items and the top k (k = None: k = n, a full sorter)."""
        return splitter_selection(n, n if k is None else k)

    def topk_rows(self, scores: Tensor, k: int) -> Tensor:
        """The k top rows of the splitter network's relaxed permutation (bidirectional evaluation, Eq. 3).

        Args:
            scores: ``(B, n)`` floating tensor.
            k: 1 <= k <= n; the network is built for this k.

        Returns:
            ``(B, k, n)`` in the dtype of ``scores``; rows = ranks (row 0 = largest), columns = items.

        Raises:
            ValueError / TypeError: bad scores or k.
        """
        check_scores(scores)
        n = scores.shape[1]
        k = check_k(k, n)
        return self._rows(self.network(n, k), scores, torch.eye(k, n, dtype=_compute_dtype(scores.dtype)))

    def soft_sort(self, scores: Tensor) -> Tensor:
        """Not provided (see the module docstring). Raises ``ValueError``."""
        from diffrank.operators.base import SOFT_SORT, require

        require(self, SOFT_SORT, f"{type(self).__name__}.soft_sort")

    def soft_rank(self, scores: Tensor) -> Tensor:
        """Not provided (see the module docstring). Raises ``ValueError``."""
        from diffrank.operators.base import SOFT_RANK, require

        require(self, SOFT_RANK, f"{type(self).__name__}.soft_rank")
