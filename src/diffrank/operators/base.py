"""The ranking-operator contract shared by every relaxed sorting / ranking / top-k method.

Conventions (DEVELOPERS.md, specs/README.md): scores ``s`` of shape ``(B, n)``; the relaxed
permutation matrix ``P`` has rows = ranks (row 0 = rank 1 = the largest score) and columns =
items, so ``P @ s`` is the soft-sorted vector in *descending* order. ``beta`` is the inverse
temperature of every operator; a paper's own parameter (τ = 1/β, ε = 1/β, …) is derived from it.

An operator says what it can compute through :attr:`RankingOperator.capabilities`:

- ``"permutation"``: rows of P (``forward``); implies the other three.
- ``"topk_membership"``: Pr(item j is among the top k) for given ks.
- ``"soft_sort"``: soft-sorted values, descending.
- ``"soft_rank"``: soft ranks, 1 = largest.

Losses and experiments call :func:`require` to reject an operator that cannot serve them, with a
message naming what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

PERMUTATION = "permutation"
TOPK_MEMBERSHIP = "topk_membership"
SOFT_SORT = "soft_sort"
SOFT_RANK = "soft_rank"
ALL_CAPABILITIES = frozenset({PERMUTATION, TOPK_MEMBERSHIP, SOFT_SORT, SOFT_RANK})


def check_scores(scores: Tensor, name: str = "scores") -> None:
    """Validate a batch of scores.

    Args:
        scores: ``(B, n)`` floating-point tensor (float16 / bfloat16 / float32 / float64).
        name: how the tensor is called in error messages.

    Raises:
        TypeError: if ``scores`` is not a tensor or not floating point.
        ValueError: if ``scores`` is not 2-D, has ``n < 1``, or holds NaN / ±inf.
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, n), got {type(scores).__name__}")
    if scores.dim() != 2:
        raise ValueError(f"{name} must be 2-D (B, n), got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"{name} must be floating point, got dtype {scores.dtype}")
    if scores.shape[1] < 1:
        raise ValueError(f"{name} must have at least one item (n >= 1), got shape {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"{name} contain non-finite values (NaN or inf)")


def check_k(k: int, n: int) -> int:
    """Validate a top-k size against the number of items.

    Args:
        k: number of top ranks, an ``int`` (``bool`` is rejected).
        n: number of items.

    Returns:
        ``k`` as a Python int.

    Raises:
        TypeError: if ``k`` is not an integer.
        ValueError: if ``k < 1`` or ``k > n``.
    """
    if isinstance(k, bool) or not isinstance(k, (int, torch.SymInt)) and not (
        isinstance(k, Tensor) and k.dim() == 0 and not k.is_floating_point()
    ):
        raise TypeError(f"k must be an integer, got {k!r}")
    k = int(k)
    if k < 1 or k > n:
        raise ValueError(f"k must satisfy 1 <= k <= n = {n}, got k = {k}")
    return k


def check_beta(beta: float) -> float:
    """Validate an inverse temperature β > 0 (finite). Raises ``ValueError`` otherwise."""
    beta = float(beta)
    if not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta (inverse temperature) must be a finite positive number, got {beta}")
    return beta


def require(operator: nn.Module, capability: str, user: str) -> None:
    """Raise unless ``operator`` provides ``capability``.

    Args:
        operator: a :class:`RankingOperator`.
        capability: one of ``"permutation"``, ``"topk_membership"``, ``"soft_sort"``, ``"soft_rank"``.
        user: who needs it (for the message), e.g. ``"TopKCrossEntropyLoss"``.

    Raises:
        ValueError: if the operator lacks the capability; the message lists what it does provide.
    """
    caps = getattr(operator, "capabilities", frozenset())
    if capability not in caps:
        raise ValueError(
            f"{user} needs an operator that provides '{capability}', but {type(operator).__name__} "
            f"provides only {sorted(caps)}"
        )


class RankingOperator(nn.Module):
    """Base class of every relaxed ranking operator.

    Subclasses implement :meth:`relaxed_permutation` (if they provide ``"permutation"``) and may
    override :meth:`topk_membership`, :meth:`soft_sort` and :meth:`soft_rank` with direct forms.
    Inputs are validated here once, so subclasses receive valid ``(B, n)`` floating scores.

    Args:
        beta: inverse temperature β > 0. Larger β = closer to the hard sort.

    Class attributes:
        capabilities: what the operator computes (see module docstring).
        doubly_stochastic: True if the full P has unit column sums too (Sinkhorn, sorting
            networks); False if only rows are normalised (NeuralSort, SoftSort).

    Raises:
        ValueError: on a non-positive or non-finite ``beta``.
    """

    capabilities: ClassVar[frozenset[str]] = ALL_CAPABILITIES
    doubly_stochastic: ClassVar[bool] = False

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = check_beta(beta)

    # -- the one method a P-providing operator must implement -----------------------------------
    def relaxed_permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Rows of the relaxed permutation matrix for validated scores.

        Args:
            scores: ``(B, n)`` floating tensor, already validated.
            k: ``None`` for all n rows, else the number of top rows (1 <= k <= n).

        Returns:
            ``(B, r, n)`` with ``r = n`` or ``k``, same dtype and device as ``scores``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not provide the relaxed permutation P")

    def forward(self, scores: Tensor, k: int | None = None) -> Tensor:
        """Relaxed permutation matrix P (rows = ranks, rank 1 = largest; columns = items).

        Args:
            scores: ``(B, n)`` float16 / bfloat16 / float32 / float64.
            k: ``None`` for the full ``n x n`` matrix, else only the top ``k`` rows.

        Returns:
            ``P`` of shape ``(B, n, n)`` or ``(B, k, n)``, dtype of ``scores``; each row sums to 1.

        Raises:
            ValueError / TypeError: bad scores (see :func:`check_scores`) or k (see :func:`check_k`),
                or an operator without the ``"permutation"`` capability.
        """
        require(self, PERMUTATION, f"{type(self).__name__}.forward")
        check_scores(scores)
        if k is not None:
            k = check_k(k, scores.shape[1])
        return self.relaxed_permutation(scores, k)

    def topk_membership(self, scores: Tensor, ks: Sequence[int]) -> Tensor:
        """Probability that item j is among the top k, for each k in ``ks``.

        Default: cumulative sums of the top ``max(ks)`` rows of P (Petersen et al. 2022, Eq. 2,
        inner sum Σ_{r<=k} P_{r,j}).

        Args:
            scores: ``(B, n)`` floating tensor.
            ks: non-empty sequence of ints in ``[1, n]``.

        Returns:
            ``(B, len(ks), n)``, dtype of ``scores``.

        Raises:
            ValueError / TypeError: bad scores or ks.
        """
        check_scores(scores)
        ks = self._check_ks(ks, scores.shape[1])
        p = self.relaxed_permutation(scores, max(ks))
        csum = p.cumsum(dim=1)
        idx = torch.as_tensor([k - 1 for k in ks], device=scores.device)
        return csum.index_select(1, idx)

    def soft_sort(self, scores: Tensor) -> Tensor:
        """Soft-sorted scores in descending order, ``P @ s``.

        Args:
            scores: ``(B, n)`` floating tensor.

        Returns:
            ``(B, n)`` of the dtype of ``scores``.
        """
        check_scores(scores)
        p = self.relaxed_permutation(scores, None)
        return (p @ scores.unsqueeze(-1)).squeeze(-1)

    def soft_rank(self, scores: Tensor) -> Tensor:
        """Soft ranks (1 = largest), the expected rank of each item under P: ``Σ_r r · P[r, j]``.

        Args:
            scores: ``(B, n)`` floating tensor.

        Returns:
            ``(B, n)`` of the dtype of ``scores``, values in ``[1, n]``.
        """
        check_scores(scores)
        p = self.relaxed_permutation(scores, None)
        r = torch.arange(1, scores.shape[1] + 1, dtype=p.dtype, device=p.device)
        return (r.view(1, -1, 1) * p).sum(dim=1)

    @staticmethod
    def _check_ks(ks: Sequence[int], n: int) -> list[int]:
        ks = [ks] if isinstance(ks, int) else list(ks)
        if not ks:
            raise ValueError("ks must be a non-empty sequence of integers")
        return [check_k(k, n) for k in ks]

    def extra_repr(self) -> str:
        """The constructor arguments that ``repr`` shows (β and the paper's own parameters)."""
        return f"beta={self.beta}"
