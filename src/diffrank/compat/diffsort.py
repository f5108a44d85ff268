"""diffsort's ``DiffSortNet`` on diffrank's networks: porting is ``from diffrank.compat.diffsort import DiffSortNet``.

diffsort (Petersen et al., ICML 2021 / ICLR 2022; github.com/Felix-Petersen/diffsort) returns the soft-sorted values
in *ascending* order and a matrix P indexed ``[batch, item, ascending position]``, so that ``sort(x) = x @ P`` (its
README, "Math vs. Code Convention"). diffrank's own P has rows = ranks, row 0 = the largest (docs/conventions.md,
"Orientation against diffsort / difftopk"); this adapter returns diffsort's orientation,

    P_diffsort[b, c, j] = P_diffrank[b, n - 1 - j, c],

so that ``torch.einsum("bi,bij->bj", x, P)`` (or ``x[b] @ P[b]``, and for one set ``x @ P`` as in the README) is the
ascending soft sort. The relaxation is :class:`~diffrank.operators.sorting_network.ComparatorNetwork` with diffsort's
defaults stated here (steepness β = 10, ``distribution="cauchy"``, λ = 0.25); the numbers equal diffsort's for
``"odd_even"`` (every n) and ``"bitonic"`` with n a power of two. For other n the two bitonic networks differ, and
so do the values: at some n (10) both sort in the hard limit and are two relaxations, at others (22, 38, …) diffsort's
does not sort at all, diffrank's does at every n (docs/conventions.md, "Bitonic networks for every n"). Every known
difference from each peer, and which is correct: docs/api.md, "Porting".
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diffrank.operators.base import check_beta, check_int
from diffrank.operators.sorting_network import ComparatorNetwork

#: diffsort's ``DiffSortNet`` defaults (its ``diffsort.py``)
DEFAULTS = {"steepness": 10.0, "art_lambda": 0.25, "distribution": "cauchy"}

NETWORKS = ("odd_even", "bitonic")


class DiffSortNet(nn.Module):
    """Drop-in for ``diffsort.DiffSortNet``: a relaxed sorting network over sets of ``size`` values.

    Args:
        sorting_network_type: ``"odd_even"`` or ``"bitonic"`` (any n; see the module docstring).
        size: n, the number of values per set.
        device: accepted for diffsort's signature and ignored: diffrank builds its networks on the input's device.
        steepness: β, the inverse temperature (diffsort's default 10.0).
        art_lambda: λ of ``logistic_phi`` (diffsort's default 0.25).
        interpolation_type: diffsort's deprecated alias of ``distribution``.
        distribution: ``"cauchy"`` (default), ``"logistic"``, ``"logistic_phi"``, ``"gaussian"``, ``"reciprocal"``,
            ``"optimal"``.

    Call: ``forward(vectors (B, size))`` → ``(sorted (B, size) ascending, P (B, size, size))`` with
    ``sorted[b] = vectors[b] @ P[b]`` (P indexed ``[b, item, ascending position]``), both in the dtype of
    ``vectors`` and differentiable in them (second derivatives exact).

    Raises:
        ValueError: an unknown network or distribution, ``interpolation_type`` and ``distribution`` that disagree
            (diffsort asserts the same), ``size`` not an integer >= 1, ``steepness`` not a finite number > 0, or
            ``vectors`` not ``(B, size)``; the errors of :class:`~diffrank.operators.base.RankingOperator` for bad
            values (NaN / inf).
    """

    def __init__(self, sorting_network_type: str, size: int, device: str | torch.device | None = None,
                 steepness: float = DEFAULTS["steepness"], art_lambda: float = DEFAULTS["art_lambda"],
                 interpolation_type: str | None = None, distribution: str = DEFAULTS["distribution"]) -> None:
        super().__init__()
        if sorting_network_type not in NETWORKS:
            raise ValueError(f"sorting_network_type must be one of {NETWORKS}, got {sorting_network_type!r}")
        distribution = peer_distribution(distribution, interpolation_type, "diffsort")
        self.sorting_network_type = sorting_network_type
        self.size = check_count(size, "size", "the number of values per set")
        self.steepness, self.art_lambda, self.distribution = steepness, art_lambda, distribution
        self.operator = ComparatorNetwork(beta=check_beta(steepness, learnable=True, name="steepness"),
                                          sigmoid=distribution, art_lambda=art_lambda, network=sorting_network_type)

    def forward(self, vectors: Tensor) -> tuple[Tensor, Tensor]:
        """``(ascending soft sort (B, n), P (B, n, n))`` in diffsort's orientation (see the class docstring)."""
        check_vectors(vectors, self.size)
        p = self.operator(vectors)  # rows = ranks (0 = largest), columns = items
        return self.operator.soft_sort(vectors).flip(1), p.flip(1).transpose(1, 2)


def peer_distribution(distribution: str | None, interpolation_type: str | None, peer: str) -> str | None:
    """The sigmoid a diffsort / difftopk network is built with: ``interpolation_type`` is the peers' deprecated name
    of ``distribution`` and wins over the default.

    Raises:
        ValueError: both are set, to different values.
    """
    if interpolation_type is None:
        return distribution
    if distribution not in (None, "cauchy", interpolation_type):
        raise ValueError(f"two different distributions are set (distribution={distribution!r}, "
                         f"interpolation_type={interpolation_type!r}); interpolation_type is {peer}'s "
                         "deprecated name of distribution")
    return interpolation_type


def check_count(value: int, name: str, what: str, low: int = 1) -> int:
    """An integer argument of the peers' constructors (``size``, ``k``, ``n``) as an int, refused rather than
    truncated (``int(2.7)`` would be 2): :func:`diffrank.operators.base.check_int`.

    Raises:
        TypeError: not an integer (a float such as 2.7 or 6.0, a string; ``numpy.int64`` is one).
        ValueError: below ``low``.
    """
    return check_int(value, name, low, what)


def check_vectors(vectors: Tensor, size: int) -> None:
    """Raise ``ValueError`` unless ``vectors`` is a ``(B, size)`` tensor, as the peers' networks require."""
    if not isinstance(vectors, Tensor) or vectors.dim() != 2 or vectors.shape[1] != size:
        raise ValueError(f"vectors must have shape (B, {size}), got "
                         f"{tuple(getattr(vectors, 'shape', ())) or type(vectors).__name__}")
