"""Differentiable bitonic sorting network (Petersen et al., ICML 2021; thesis §3.2), correct for every n.

Full relaxed permutation of Batcher's bitonic sorter: ⌈log2 n⌉(⌈log2 n⌉+1)/2 layers, O(log²n·B·n²) for
P, O(log²n·B·n) for soft-sorted values, O(log²n·B·k·n) for top-k rows. For n a power of two the network
is ``diffsort.DiffSortNet('bitonic', n)`` mirrored and P equals diffsort's after the orientation map
(spec §0 item 1; tested for every sigmoid). For other n we deliberately differ: the reference drops
"virtual" wires and does not sort (708 of the sizes n <= 1024 fail, spec §0 item 4); we pad to the next
power of two with -∞ sentinels resolved at construction (:func:`diffrank.operators.networks.bitonic`),
which sorts every input in the hard limit (tested for all n <= 1024).
"""

from __future__ import annotations

from diffrank.operators.networks import Network, bitonic
from diffrank.operators.sorting_network import SortingNetworkOperator


class DiffSortBitonic(SortingNetworkOperator):
    """Relaxed bitonic sorting network; rows = ranks (rank 1 = largest), columns = items.

    Args:
        beta: inverse temperature β > 0 (diffsort's ``steepness``; default 10 as diffsort).
        sigmoid: relaxed-swap sigmoid (default ``"cauchy"``, diffsort v0.2's default).
        art_lambda: λ of the activation replacement trick, used by ``"logistic_phi"`` only (default 0.25).

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``, doubly stochastic for k = None.

    Raises:
        ValueError: see :class:`SortingNetworkOperator`.
    """

    def network(self, n: int, k: int | None) -> Network:
        """The bitonic network on n wires (k does not change it)."""
        return bitonic(n)
