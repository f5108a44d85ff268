"""Differentiable top-k bitonic network (Petersen et al., ICML 2022, §3.1, Eq. 3; spec §2.6).

The same network as :class:`~diffrank.operators.diffsort_bitonic.DiffSortBitonic` (correct for every n),
with the top-k paper's defaults. Only the k top rows of P are formed, by the bidirectional evaluation:
values forward (each layer's α kept, (B, n)), then the k rows pushed from the output side back to the
input with a gather + lerp per layer. Time O(log²n·B·k·n), memory O(log²n·B·k·n) with autograd —
difftopk's dense path needs O(log²n·B·n²) (15 GB at n = 1000, B = 64) and its sparse path the
``torch-sparse`` extension. ``relaxed_permutation(scores, None)`` returns the full P (forward on
(B, n, n)). For n a power of two the rows equal ``difftopk.DiffTopkNet('bitonic', n, k)``'s after the
orientation map P_ours[b, r, c] = X[b, c, k-1-r] (tested).
"""

from __future__ import annotations

from diffrank.operators.networks import Network, bitonic
from diffrank.operators.sorting_network import SortingNetworkOperator


class DiffTopkBitonic(SortingNetworkOperator):
    """Relaxed bitonic network evaluated for top-k rows; rows = ranks (rank 1 = largest), columns = items.

    Args:
        beta: inverse temperature β > 0 (difftopk's ``inverse_temperature``; the ImageNet README uses 1).
        sigmoid: relaxed-swap sigmoid (default ``"logistic_phi"``, the top-k paper's choice).
        art_lambda: λ of the activation replacement trick (default 0.5, the difftopk scripts' default).

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``.

    Raises:
        ValueError: see :class:`SortingNetworkOperator`.
    """

    def __init__(self, beta: float = 1.0, sigmoid: str = "logistic_phi", art_lambda: float = 0.5) -> None:
        super().__init__(beta, sigmoid, art_lambda)

    def network(self, n: int, k: int | None) -> Network:
        """The bitonic network on n wires (k does not change it)."""
        return bitonic(n)
