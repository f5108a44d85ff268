"""Differentiable odd-even transposition sorting network (Petersen et al., ICML 2021; thesis §3.2).

Full relaxed permutation P = M_n ⋯ M_1 of the odd-even transposition network (n layers), evaluated by
gathers and lerps (:mod:`diffrank.operators.sorting_network`): O(n·B·n²) time for all of P, O(n·B·n)
for soft-sorted values, O(n·B·k·n) for top-k rows. The network is
``diffsort.DiffSortNet('odd_even', n)``'s read from the top, so P equals diffsort's after the orientation map of spec §0
item 1 (P_ours[b, r, c] = P_diffsort[b, c, n-1-r]) — tested for every sigmoid.
"""

from __future__ import annotations

from diffrank.operators.networks import Network, odd_even
from diffrank.operators.sorting_network import SortingNetworkOperator


class DiffSortOddEven(SortingNetworkOperator):
    """Relaxed odd-even transposition sorting network; rows = ranks (rank 1 = largest), columns = items.

    Args:
        beta: inverse temperature β > 0 (diffsort's ``steepness``; default 10 as diffsort).
        sigmoid: relaxed-swap sigmoid (default ``"cauchy"``, diffsort v0.2's default).
        art_lambda: λ of the activation replacement trick, used by ``"logistic_phi"`` only (default 0.25).

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``, doubly stochastic for k = None.

    Raises:
        ValueError: see :class:`SortingNetworkOperator`.
    """

    def network(self, n: int, k: int | None) -> Network:
        """The odd-even transposition network on n wires (k does not change it)."""
        return odd_even(n)
