"""Relaxed evaluation of comparator networks, and the base class of the sorting-network operators.

A layer of comparators (hi, lo) acts on a vector x of wire values as (spec §2.5; Petersen et al. 2021, Eq. 1)

    α = f(β (x_hi - x_lo)),   x'_hi = α x_hi + (1-α) x_lo,   x'_lo = (1-α) x_hi + α x_lo.

With the layer's wire permutation ``partner`` (hi ↔ lo, idle wires fixed) and per-wire weight w = 1 - α
(w = 0 on idle wires) this is one gather and one lerp for every wire at once:

    x' = x + w ⊙ (x[partner] - x).

No selection matrices, no matmuls: O(B·n) per layer for the values. The layer's mixing matrix M_t
(output wire × input wire) is symmetric and doubly stochastic, and P = M_T ⋯ M_1 (rows = output wires,
columns = items), so

- full P: start from I and apply the same gather + lerp to the *rows* of a (B, n, n) matrix: O(L·B·n²);
- any m rows W·P (top-k rows, top-k membership, soft ranks): the bidirectional evaluation of Petersen
  et al. 2022 (Eq. 3; spec §2.6): run the values forward keeping each layer's w (B, n), then push the
  (B, m, n) matrix Y = W from the output side back to the input, Y ← Y M_t for t = T … 1, which is the
  same gather + lerp on the *columns* of Y. Memory O(L·B·n) for the weights plus O(L·B·m·n) saved by
  autograd, never O(L·B·n²).

Half-precision inputs are computed in float32 (α, values and P) and the result is cast back: hundreds
of chained lerps in float16 / bfloat16 would lose the precision the relaxation is meant to keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor

from diffrank.operators.base import RankingOperator, check_scores
from diffrank.operators.networks import Network
from diffrank.operators.sigmoids import MONOTONIC, check_art_lambda, check_sigmoid, swap_weight

# a beta at which P of scores spaced >= 0.5 apart is within 1e-3 of the hard permutation for n <= 8
# (operator contract): 1 - α ≈ e^{-β/2} for the exponential tails, ≈ 1/(c β) for the algebraic ones
HARD_BETA = {"logistic": 50.0, "logistic_phi": 50.0, "gaussian": 50.0,
             "reciprocal": 1e6, "cauchy": 1e6, "optimal": 1e5}


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def forward_values(network: Network, x: Tensor, beta: float, sigmoid: str, art_lambda: float,
                   keep_weights: bool = False, p: Tensor | None = None
                   ) -> tuple[Tensor, list[Tensor], Tensor | None]:
    """Run the relaxed network forward on track values (optionally carrying a full P along).

    Args:
        network: the comparator network on n wires.
        x: ``(B, n)`` values in a float32 / float64 compute dtype.
        beta, sigmoid, art_lambda: the relaxed swap (see :mod:`diffrank.operators.sigmoids`).
        keep_weights: keep every layer's per-wire weight w = 1 - α, ``(B, n)`` each, for the
            bidirectional evaluation.
        p: optional ``(B, n, n)`` matrix whose rows are mixed like the values (start from I for P).

    Returns:
        ``(x_out (B, n) per track, weights (list of (B, n), empty unless keep_weights), p_out or None)``.
    """
    weights = []
    for layer in network.layers:
        partner, sign = layer.tensors(x.device, x.dtype)
        xp = x.index_select(1, partner)
        w = 1.0 - swap_weight(sign * (x - xp), beta, sigmoid, art_lambda)
        if keep_weights:
            weights.append(w)
        if p is not None:
            p = p + w.unsqueeze(-1) * (p.index_select(1, partner) - p)
        x = x + w * (xp - x)
    return x, weights, p


def accumulate_rows(network: Network, weights: list[Tensor], y: Tensor) -> Tensor:
    """Bidirectional evaluation (Petersen et al. 2022, Eq. 3): Y · M_T ⋯ M_1 for stored layer weights.

    Args:
        network: the network whose forward pass produced ``weights``.
        weights: per-layer ``(B, n)`` weights w = 1 - α from :func:`forward_values`.
        y: ``(B, m, n)`` or ``(1, m, n)`` rows indexed by output track.

    Returns:
        ``(B, m, n)``: the rows W·P, columns = items.
    """
    for layer, w in zip(reversed(network.layers), reversed(weights)):
        partner, _ = layer.tensors(y.device, y.dtype)
        y = y + w.unsqueeze(1) * (y.index_select(2, partner) - y)
    return y


class SortingNetworkOperator(RankingOperator):
    """Base class of the relaxed sorting / top-k network operators (diffsort, difftopk).

    The network is built per (n, k) from the input's shape at call time (cached), with its index
    tensors cached per device, so one operator instance serves any n and any device.

    Args:
        beta: inverse temperature β > 0 (reference-code scale; see :mod:`diffrank.operators.sigmoids`).
        sigmoid: ``"logistic"``, ``"logistic_phi"``, ``"gaussian"``, ``"reciprocal"``, ``"cauchy"``,
            ``"optimal"``.
        art_lambda: λ ∈ [0, 1] of the activation replacement trick (``logistic_phi`` only).

    Class attributes: ``doubly_stochastic = True`` (every layer matrix is), ``permutation_equivariant =
    False`` (a network compares fixed wires). ``hard_beta`` depends on the sigmoid and is set per instance
    (the class value is that of the default sigmoid).

    Raises:
        ValueError: beta <= 0, an unknown sigmoid (the message lists the known ones), λ outside [0, 1].
    """

    doubly_stochastic: ClassVar[bool] = True
    permutation_equivariant: ClassVar[bool] = False
    hard_beta: float = HARD_BETA["cauchy"]

    def __init__(self, beta: float = 10.0, sigmoid: str = "cauchy", art_lambda: float = 0.25) -> None:
        super().__init__(beta)
        self.sigmoid = check_sigmoid(sigmoid)
        self.art_lambda = check_art_lambda(art_lambda)
        self.hard_beta = HARD_BETA[self.sigmoid]

    @property
    def monotonic(self) -> bool:
        """True for the monotonic sigmoids (thesis Table 3.1): reciprocal, Cauchy, optimal."""
        return self.sigmoid in MONOTONIC

    # -- networks ------------------------------------------------------------------------------------
    def network(self, n: int, k: int | None) -> Network:
        """The network for n items whose first outputs give ranks 0 … k-1 (k = None: all ranks)."""
        raise NotImplementedError

    # -- evaluation ----------------------------------------------------------------------------------
    def _values(self, net: Network, scores: Tensor, keep_weights: bool):
        x = scores.to(_compute_dtype(scores.dtype))
        return forward_values(net, x, self.beta, self.sigmoid, self.art_lambda, keep_weights)

    def _rows(self, net: Network, scores: Tensor, w_out: Tensor) -> Tensor:
        """``w_out`` ``(m, n)`` rows over output ranks → ``(B, m, n)`` rows W·P over items (bidirectional)."""
        _, weights, _ = self._values(net, scores, keep_weights=True)
        w_out = w_out.to(device=scores.device, dtype=_compute_dtype(scores.dtype))
        perm = net.out_perm_tensor(scores.device)
        y = w_out if perm is None else torch.zeros_like(w_out).index_copy_(1, perm, w_out)
        rows = accumulate_rows(net, weights, y.unsqueeze(0))
        return rows.expand(scores.shape[0], -1, -1).contiguous().to(scores.dtype)

    def _full(self, net: Network, scores: Tensor) -> Tensor:
        B, n = scores.shape
        x = scores.to(_compute_dtype(scores.dtype))
        eye = torch.eye(n, dtype=x.dtype, device=x.device).expand(B, n, n)
        _, _, p = forward_values(net, x, self.beta, self.sigmoid, self.art_lambda, p=eye)
        perm = net.out_perm_tensor(scores.device)
        if perm is not None:
            p = p.index_select(1, perm)
        return p.contiguous().to(scores.dtype)

    def relaxed_permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Rows of P: all n from the forward pass on (B, n, n), or the top k by bidirectional evaluation.

        Args:
            scores: ``(B, n)`` validated scores.
            k: ``None`` or 1 <= k <= n.

        Returns:
            ``(B, n or k, n)`` in the dtype of ``scores``; rows sum to 1, and for k = None columns too.
        """
        n = scores.shape[1]
        if k is None:
            return self._full(self.network(n, None), scores)
        eye = torch.eye(k, n, dtype=_compute_dtype(scores.dtype))
        return self._rows(self.network(n, k), scores, eye)

    def topk_membership(self, scores: Tensor, ks: Sequence[int]) -> Tensor:
        """Σ_{r<k} P[r, j] for each k, in one bidirectional pass from the indicator rows (Eq. 2 and 3).

        Args:
            scores: ``(B, n)`` floating tensor.
            ks: non-empty sequence of ints in [1, n].

        Returns:
            ``(B, len(ks), n)`` in the dtype of ``scores``; row i sums to ks[i].

        Raises:
            ValueError / TypeError: bad scores or ks.
        """
        check_scores(scores)
        n = scores.shape[1]
        ks = self._check_ks(ks, n)
        ranks = torch.arange(n)
        w_out = (ranks.unsqueeze(0) < torch.tensor(ks).unsqueeze(1)).to(_compute_dtype(scores.dtype))
        return self._rows(self.network(n, max(ks)), scores, w_out)

    def soft_sort(self, scores: Tensor) -> Tensor:
        """Soft-sorted values, descending: the network's output wires (= P @ s), without forming P.

        Args:
            scores: ``(B, n)`` floating tensor.

        Returns:
            ``(B, n)`` in the dtype of ``scores``. O(L·B·n) time and memory.
        """
        check_scores(scores)
        net = self.network(scores.shape[1], None)
        x, _, _ = self._values(net, scores, keep_weights=False)
        perm = net.out_perm_tensor(scores.device)
        if perm is not None:
            x = x.index_select(1, perm)
        return x.to(scores.dtype)

    def soft_rank(self, scores: Tensor) -> Tensor:
        """Soft ranks Σ_r r·P[r, j] (1 = largest) from one bidirectional pass with the row (1, …, n).

        Args:
            scores: ``(B, n)`` floating tensor.

        Returns:
            ``(B, n)`` in the dtype of ``scores``, values in [1, n].
        """
        check_scores(scores)
        n = scores.shape[1]
        r = torch.arange(1, n + 1, dtype=_compute_dtype(scores.dtype)).unsqueeze(0)
        return self._rows(self.network(n, None), scores, r).squeeze(1)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, sigmoid={self.sigmoid!r}, art_lambda={self.art_lambda}"
