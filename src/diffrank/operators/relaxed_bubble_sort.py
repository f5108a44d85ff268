"""Relaxed bubble sort (Petersen, PhD thesis 2022, §2.3; the relaxation of §2.2) as a ranking operator.

Bubble sort runs passes t = 1 … n-1 over the array; pass t compares the adjacent positions (j, j+1) for
j = 0 … n-1-t and swaps them when they are out of order. The relaxation replaces each conditional swap by
its probability under logistic perturbation of the compared values (thesis Eq. 2.13, P[a > b] = σ(β(a-b)))
and continues with the expectation of both branches (the merge of §2.2):

    p = f(β (x_j - x_{j+1})),   x'_j = p·x_{j+1} + (1-p)·x_j,   x'_{j+1} = p·x_j + (1-p)·x_{j+1},

and the relaxed permutation P (rows = positions, columns = items, starting from I) mixes its rows j, j+1
with the same p, so P @ s is the relaxed array at every step. f is a sigmoid of
:mod:`diffrank.operators.sigmoids` (``logistic`` = AlgoVision's ``GT`` condition, the thesis' choice).

Two loop forms (``early_exit``):

- ``True`` (default): the thesis' program, ``While(swapped)`` around the passes (thesis §2.3 listing; §2.2,
  relaxed loops). ``swapped`` after pass t is s_t = 1 - u_t with u_t = Π_j (1 - p_j) over the pass's
  comparisons; the loop stops after pass t with probability q_{t-1}·u_t, where q_0 = 1, q_t = q_{t-1}·s_t,
  and the result is that mixture of the states after each pass:
  ``Σ_{t=1}^{n-1} q_{t-1} u_t S_t + q_{n-1} S_{n-1}`` (the last term: pass n is empty, so it always stops).
  This equals AlgoVision's ``Algorithm(..., beta=β)`` of the thesis listing run with ``epsilon=0`` (with
  its default ε = 1e-5, AlgoVision stops a loop once every set of the batch has q_t <= ε, a truncation of
  at most ε; we never truncate, so a set's result does not depend on the other sets of its batch).
- ``False``: the plain n-1 passes, n(n-1)/2 comparators: a fixed comparator network (for n = 2, the
  logistic differentiable sorting network, thesis §3.3).

Orientation (docs/conventions.md): bubble sort and AlgoVision sort *ascending* (the largest value bubbles to
the last position). diffrank's P has row 0 = rank 1 = the largest, so we run the ascending algorithm and
read its positions from the end: ``P[r] = P_asc[n-1-r]``. This is exact (it is not a descending bubble sort,
whose relaxation compares in another order): ``P[b, r, c] = Q[b, c, n-1-r]`` for AlgoVision's array tracked
as Q (items × positions).

β: AlgoVision's β (``Algorithm(beta=...)``, default 10; the thesis listing prints 5 and Table 2.1 used
β = 8, tuned for n = 5), the inverse temperature of the logistic perturbation. Every state is a convex
mixture of products of doubly stochastic 2×2 mixings, so P is doubly stochastic (rows and columns sum to 1)
in both loop forms.

Cost: the n(n-1)/2 comparisons are a Python loop of small batched ops (O(B·n) each for the rows of P,
O(B·n³) per call in all, plus the mixture over passes for ``early_exit``); plain autograd. That is fine for
the sorting benchmark's n <= 32; larger n is refused (:data:`MAX_N`), a comparator network
(``diffsort_odd_even``) is the same kind of relaxation in n layers instead of n(n-1)/2 steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from diffrank.operators.base import Check, RankingOperator, beta_repr, check_scores_shape
from diffrank.operators.sigmoids import check_art_lambda, check_sigmoid, swap_weight
from diffrank.operators.sorting_network import HARD_BETA

# n(n-1)/2 sequential Python steps: 496 at n = 32, 8 128 at n = 128 (each a few batched kernels)
MAX_N = 128


def _check_n(n: int) -> None:
    if n > MAX_N:
        raise ValueError(
            f"relaxed_bubble_sort: n = {n} exceeds the limit n <= {MAX_N} (n(n-1)/2 = {n * (n - 1) // 2} sequential "
            "relaxed swaps in a Python loop); use a sorting network (diffsort_odd_even / diffsort_bitonic) instead")


class RelaxedBubbleSort(RankingOperator):
    """Relaxed bubble sort (thesis §2.3): P with rows = ranks (rank 1 = largest), columns = items.

    Args:
        beta: inverse temperature β > 0 of the relaxed swaps (AlgoVision's ``beta``). Default 8, the thesis'
            Table 2.1 value and the config's (``configs/operator/relaxed_bubble_sort.yaml``); a 0-d tensor that
            requires grad is learnable (``learnable_beta``).
        sigmoid: f of the swap probability p = f(β (x_j - x_{j+1})): ``"logistic"`` (AlgoVision, default),
            ``"logistic_phi"``, ``"gaussian"``, ``"reciprocal"``, ``"cauchy"``, ``"optimal"``
            (:mod:`diffrank.operators.sigmoids`, same β scale).
        art_lambda: λ of ``logistic_phi`` only, in [0, 1].
        early_exit: ``True``: the thesis' ``While(swapped)`` loop, a mixture over the pass after which the
            relaxed algorithm stops (module docstring); ``False``: always n-1 passes.

    Shapes and dtypes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)`` in the dtype of ``scores`` (float16 /
    bfloat16 computed in float32); rows and columns sum to 1. ``expected_swaps(scores)`` → ``(B,)``.

    Attributes: ``doubly_stochastic`` True; ``permutation_equivariant`` False (adjacent positions are
    compared in a fixed order); ``hard_beta`` per sigmoid as for the comparator networks.

    Raises:
        ValueError: beta <= 0 or non-finite, an unknown sigmoid (the message lists the known ones), λ outside
            [0, 1]; at call time n > :data:`MAX_N` and the input errors of :class:`RankingOperator`.
        TypeError: ``early_exit`` not a bool; non-tensor / non-floating scores.
    """

    doubly_stochastic = True
    permutation_equivariant = False
    learnable_beta = True  # plain autograd ops: ∂/∂β through every relaxed swap
    paper = "Petersen, PhD thesis 2022, §2.3, Table 2.1 (n ≤ 128)"
    parameter = "β (AlgoVision's `beta`)"

    def __init__(self, beta: float | Tensor = 8.0, sigmoid: str = "logistic", art_lambda: float = 0.25,
                 early_exit: bool = True) -> None:
        super().__init__(beta)
        self.sigmoid = check_sigmoid(sigmoid)
        self.art_lambda = check_art_lambda(art_lambda)
        if not isinstance(early_exit, bool):
            raise TypeError(f"early_exit must be a bool, got {early_exit!r}")
        self.early_exit = early_exit
        self.hard_beta = HARD_BETA[self.sigmoid]

    def expected_swaps(self, scores: Tensor, checks: Sequence[Check] = ()) -> Tensor:
        """The relaxed number of swaps of the ascending bubble sort of ``scores`` (AlgoVision's ``loss_sum``).

        The thesis' Table 2.1 loss: with the scores listed in their true *ascending* order it is the relaxed
        count of inversions, 0 when they are sorted (thesis §2.3; the official script's default loss). For
        ``early_exit`` it is the same mixture over the stopping pass as the permutation.

        Args:
            scores: ``(B, n)`` floating tensor, in the order the algorithm receives them.
            checks: a caller's pending ``(ok, error)`` checks, read with this method's own (one host read).

        Returns:
            ``(B,)`` in the dtype of ``scores``, in [0, n(n-1)/2].

        Raises:
            ValueError / TypeError: bad scores (see :func:`~diffrank.operators.base.check_scores`), n > MAX_N.
        """
        n = check_scores_shape(scores)
        _check_n(n)
        if scores.shape[0] == 0:
            return self._empty(scores)
        x = self._compute_input(scores, checks)
        return self._run(x, want_p=False)[2].to(scores.dtype)

    # -- the hooks -----------------------------------------------------------------------------------------
    def _run(self, x: Tensor, want_p: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
        """The relaxed algorithm on ``x`` (B, n): ascending values (B, n), ascending P_asc (B, n, n) (rows =
        positions) or None, and the relaxed swap count (B,)."""
        B, n = x.shape
        _check_n(n)
        vals = list(x.unbind(1))  # one (B,) tensor per position: the swaps never write into a saved tensor
        rows = list(torch.eye(n, dtype=x.dtype, device=x.device).expand(B, n, n).unbind(1)) if want_p else None
        swaps = x.new_zeros(B)
        # mixture over the pass after which While(swapped) stops: weight q_{t-1} u_t for the state after pass t
        reach = x.new_ones(B)  # q_{t-1}: probability that pass t runs
        acc_v = acc_p = acc_s = None
        for t in range(1, n):
            no_swap = x.new_ones(B)  # u_t = Π (1 - p_j)
            for j in range(n - t):
                a, b = vals[j], vals[j + 1]
                p = swap_weight(a - b, self.beta, self.sigmoid, self.art_lambda)  # P[a > b]: swap
                step = p * (b - a)
                vals[j], vals[j + 1] = a + step, b - step
                if rows is not None:
                    dr = p.unsqueeze(1) * (rows[j + 1] - rows[j])
                    rows[j], rows[j + 1] = rows[j] + dr, rows[j + 1] - dr
                swaps = swaps + p
                if self.early_exit:
                    # 1 - p as f(β (b - a)), not by subtraction: exact where p rounds to 1 (symmetric sigmoids)
                    no_swap = no_swap * swap_weight(b - a, self.beta, self.sigmoid, self.art_lambda)
            if self.early_exit:
                w = reach * no_swap if t < n - 1 else reach  # pass n is empty: the loop surely stops after n-1
                acc_v = self._add(acc_v, w.unsqueeze(1) * torch.stack(vals, 1))
                acc_s = self._add(acc_s, w * swaps)
                if rows is not None:
                    acc_p = self._add(acc_p, w.view(B, 1, 1) * torch.stack(rows, 1))
                reach = reach * (1 - no_swap)
        if not self.early_exit or n == 1:
            return torch.stack(vals, 1), None if rows is None else torch.stack(rows, 1), swaps
        return acc_v, acc_p, acc_s

    @staticmethod
    def _add(acc: Tensor | None, term: Tensor) -> Tensor:
        return term if acc is None else acc + term

    def _permutation(self, x: Tensor, k: int | None) -> Tensor:
        """P = P_asc read from the last position (module docstring): ``(B, k or n, n)``."""
        p = self._run(x)[1].flip(1)
        return p if k is None else p[:, :k]

    def _soft_sort(self, x: Tensor) -> Tensor:
        """The relaxed array, descending (= P @ s), without forming P: ``(B, n)``."""
        return self._run(x, want_p=False)[0].flip(1)

    def extra_repr(self) -> str:
        return (f"beta={beta_repr(self.beta)}, sigmoid={self.sigmoid!r}, art_lambda={self.art_lambda}, "
                f"early_exit={self.early_exit}")
