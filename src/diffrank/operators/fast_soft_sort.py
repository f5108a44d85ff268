"""Fast differentiable sorting and ranking (Blondel, Teboul, Berthet, Djolonga, ICML 2020).

Soft rank and soft sort are regularised projections onto the permutahedron P(w) = conv{w_σ}
(paper §3-§5):

- ``l2`` (Q): P_Q(z, w) = argmin_{μ ∈ P(w)} ½‖μ - z‖²;
- ``kl`` (E): P_E(z, w) = log argmin_{μ ∈ P(e^w)} KL(μ, e^z).

Both reduce to an isotonic regression solved by pool adjacent violators (paper Prop. 3): with σ
sorting z descending and s = z_σ, v = argmin_{v_1 >= ... >= v_n} of ½‖v - (s - w)‖² (block value =
mean of s - w) or of ⟨e^{s-v}, 1⟩ + ⟨e^w, v⟩ (block value = LSE(s_B) - LSE(w_B)); the projection is
s - v, unsorted. O(n log n): one sort, then O(n) PAV (a numba kernel looping over the batch).

diffrank orientation (descending, rank 1 = largest), with ρ = (n, n-1, ..., 1) and ε = 1/β the
``regularization_strength``:

- soft rank: r = P_Q(-θ/ε, ρ) (l2) or exp(P_E(-θ/ε, log ρ)) (kl) — ``torchsort.soft_rank(-θ)``;
- soft sort: P_Q(ρ/ε, θ) = ρ/ε - iso(ρ/ε - θ_sorted) (l2), or ρ/ε - v with block value
  LSE(ρ/ε) - LSE(θ_sorted) (kl) — ``-torchsort.soft_sort(-θ)``.

torchsort's ascending functions are :func:`diffrank.functional.soft_rank` / :func:`diffrank.functional.soft_sort`
with ``method="fast_soft_sort", beta=1/ε`` (equal for ``l2``, the default).

The Jacobian of the isotonic step is block diagonal: within a block every row equals 1/|B| (l2) or
softmax of the block's entries that depend on θ (kl) (paper Lemma 2 / §5). The backward pass applies it
exactly in O(n) in a custom ``torch.autograd.Function``. The PAV pass runs on the CPU (CUDA inputs are
copied to the host and back).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

from diffrank.operators.base import SOFT_RANK, SOFT_SORT, RankingOperator

REGULARIZATIONS = ("l2", "kl")


@numba.njit(cache=True, nogil=True)
def _pav(y, wp, kl, weight_from_y, v, wts, start):  # pragma: no cover - compiled
    """Decreasing isotonic regression of every row (Blondel et al. 2020, Alg. PAV).

    l2 (``kl`` False): block value = mean(y_B); weight = 1/|B|.
    kl: block value = LSE(y_B) - LSE(wp_B); weight = softmax over the block of y (``weight_from_y``) or wp.
    Writes the solution ``v``, the Jacobian row weights ``wts`` and each position's block ``start``.
    """
    B, n = y.shape
    bstart = np.empty(n + 1, np.int64)
    acc1 = np.empty(n, y.dtype)  # l2: sum of y; kl: LSE(y_B)
    acc2 = np.empty(n, y.dtype)  # l2: count; kl: LSE(wp_B)
    for b in range(B):
        nb = 0
        for i in range(n):
            bstart[nb] = i
            if kl:
                acc1[nb] = y[b, i]
                acc2[nb] = wp[b, i]
            else:
                acc1[nb] = y[b, i]
                acc2[nb] = 1.0
            nb += 1
            while nb > 1:
                p, q = nb - 2, nb - 1
                if kl:
                    violated = acc1[p] - acc2[p] < acc1[q] - acc2[q]
                else:
                    violated = acc1[p] * acc2[q] < acc1[q] * acc2[p]
                if not violated:
                    break
                if kl:
                    m = max(acc1[p], acc1[q])
                    acc1[p] = m + np.log(np.exp(acc1[p] - m) + np.exp(acc1[q] - m))
                    m = max(acc2[p], acc2[q])
                    acc2[p] = m + np.log(np.exp(acc2[p] - m) + np.exp(acc2[q] - m))
                else:
                    acc1[p] += acc1[q]
                    acc2[p] += acc2[q]
                nb -= 1
        bstart[nb] = n
        for j in range(nb):
            if kl:
                val = acc1[j] - acc2[j]
            else:
                val = acc1[j] / acc2[j]
            for i in range(bstart[j], bstart[j + 1]):
                v[b, i] = val
                start[b, i] = bstart[j]
                if not kl:
                    wts[b, i] = 1.0 / acc2[j]
                elif weight_from_y:
                    wts[b, i] = np.exp(y[b, i] - acc1[j])
                else:
                    wts[b, i] = np.exp(wp[b, i] - acc2[j])


@numba.njit(cache=True, nogil=True)
def _block_vjp(g, wts, start, out):  # pragma: no cover - compiled
    """out_j = wts_j · Σ_{i ∈ block(j)} g_i: Jᵀg for the block-diagonal isotonic Jacobian."""
    B, n = g.shape
    for b in range(B):
        i = 0
        while i < n:
            s = start[b, i]
            j = i
            tot = 0.0
            while j < n and start[b, j] == s:
                tot += g[b, j]
                j += 1
            for m in range(i, j):
                out[b, m] = wts[b, m] * tot
            i = j


def _isotonic(y: Tensor, wp: Tensor | None, regularization: str, weight_from_y: bool):
    """Run PAV on CPU numpy views; returns (v, wts, start) as tensors on y's device."""
    yn = y.detach().cpu().contiguous().numpy()
    wn = yn if wp is None else wp.detach().cpu().contiguous().numpy()
    v = np.empty_like(yn)
    wts = np.empty_like(yn)
    start = np.empty(yn.shape, np.int64)
    _pav(yn, wn, regularization == "kl", weight_from_y, v, wts, start)
    dev = y.device
    return torch.from_numpy(v).to(dev), torch.from_numpy(wts).to(dev), torch.from_numpy(start).to(dev)


def _jt(g: Tensor, wts: Tensor, start: Tensor) -> Tensor:
    gn = g.detach().cpu().contiguous().numpy().astype(wts.cpu().numpy().dtype, copy=False)
    out = np.empty_like(gn)
    _block_vjp(gn, wts.cpu().numpy(), start.cpu().numpy(), out)
    return torch.from_numpy(out).to(g.device)


@numba.njit(cache=True, nogil=True)
def _block_relative_nb(x, start, kl, out):  # pragma: no cover - compiled
    """out_i = x_i minus the mean (l2) or LSE (kl) of its block, every term taken relative to the block's first
    entry; see :func:`_block_relative`."""
    B, n = x.shape
    for b in range(B):
        i = 0
        while i < n:
            j = i
            while j < n and start[b, j] == start[b, i]:
                j += 1
            x0 = x[b, i]
            if kl:
                top = 0.0
                for m in range(i, j):
                    top = max(top, x[b, m] - x0)
                tot = 0.0
                for m in range(i, j):
                    tot += np.exp(x[b, m] - x0 - top)
                centre = top + np.log(tot)
            else:
                tot = 0.0
                for m in range(i, j):
                    tot += x[b, m] - x0
                centre = tot / (j - i)
            for m in range(i, j):
                out[b, m] = (x[b, m] - x0) - centre
            i = j


def _block_relative(x: Tensor, start: Tensor, regularization: str) -> Tensor:
    """x minus its block's mean (l2) or LSE (kl), computed relative to the block's first entry.

    ``x - v`` with ``v`` the isotonic solution cancels catastrophically once |x| is large next to the ranks
    (|s| >= 1e10 gave ranks such as [0, 0, 0, 4, 0, 0]); entries of one block share a block start
    (``start``), so subtracting the first entry first makes a singleton block exactly 0.
    """
    xn = x.detach().cpu().contiguous().numpy()
    out = np.empty_like(xn)
    _block_relative_nb(xn, start.cpu().numpy(), regularization == "kl", out)
    return torch.from_numpy(out).to(x.device)


def _rho(n: int, like: Tensor) -> Tensor:
    return torch.arange(n, 0, -1, dtype=like.dtype, device=like.device).expand(like.shape[0], n)


class _SoftRank(torch.autograd.Function):
    @staticmethod
    def forward(ctx, theta: Tensor, eps: float, regularization: str) -> Tensor:
        z = -theta / eps
        s, order = z.sort(dim=-1, descending=True)
        rho = _rho(theta.shape[-1], theta)
        w = rho if regularization == "l2" else rho.log()
        _, wts, start = _isotonic(s - rho if regularization == "l2" else s, None if regularization == "l2" else w,
                                  regularization, True)
        # s - v = (s - block mean / LSE of s) + block mean / LSE of w, without the cancellation of s - v
        mu_sorted = _block_relative(s, start, regularization) - _block_relative(w, start, regularization) + w
        mu = torch.empty_like(s).scatter_(-1, order, mu_sorted)
        out = mu if regularization == "l2" else mu.exp()
        ctx.eps, ctx.reg = eps, regularization
        ctx.save_for_backward(order, wts, start, out)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        order, wts, start, out = ctx.saved_tensors
        if ctx.reg == "kl":
            g = g * out
        gs = g.gather(-1, order)
        gz_sorted = gs - _jt(gs, wts, start)
        gz = torch.empty_like(gz_sorted).scatter_(-1, order, gz_sorted)
        return -gz / ctx.eps, None, None


class _SoftSort(torch.autograd.Function):
    @staticmethod
    def forward(ctx, theta: Tensor, eps: float, regularization: str) -> Tensor:
        s, order = theta.sort(dim=-1, descending=True)
        w = _rho(theta.shape[-1], theta) / eps
        if regularization == "l2":
            _, wts, start = _isotonic(w - s, None, "l2", True)
        else:
            _, wts, start = _isotonic(w, s, "kl", False)
        ctx.save_for_backward(order, wts, start)
        # w - v = (w - block mean / LSE of w) + block mean / LSE of s (see _block_relative)
        return _block_relative(w, start, regularization) - _block_relative(s, start, regularization) + s

    @staticmethod
    def backward(ctx, g: Tensor):
        order, wts, start = ctx.saved_tensors
        gs = _jt(g, wts, start)
        return torch.empty_like(gs).scatter_(-1, order, gs), None, None


class FastSoftSort(RankingOperator):
    """Blondel et al. (2020) soft sort / soft rank as a ranking operator (no P, no top-k membership).

    Args:
        beta: inverse temperature; ``regularization_strength`` ε = 1/β.
        regularization: ``"l2"`` (quadratic, P_Q) or ``"kl"`` (entropic, P_E).

    Shapes: ``soft_rank(scores (B, n))`` / ``soft_sort(scores (B, n))`` → ``(B, n)``. ``forward`` and
    ``topk_membership`` raise (these operators give values, not probabilities).

    Raises:
        ValueError: beta <= 0, unknown regularization; ``forward`` / ``topk_membership`` always.
    """

    capabilities = frozenset({SOFT_SORT, SOFT_RANK})
    permutation_equivariant = True
    hard_beta = 100.0

    def __init__(self, beta: float = 1.0, regularization: str = "l2") -> None:
        super().__init__(beta)
        if regularization not in REGULARIZATIONS:
            raise ValueError(f"regularization must be one of {REGULARIZATIONS}, got {regularization!r}")
        self.regularization = regularization
        self.regularization_strength = 1.0 / self.beta

    @classmethod
    def with_strength(cls, regularization_strength: float, regularization: str = "l2") -> FastSoftSort:
        """The operator for a given ε (torchsort's ``regularization_strength``) instead of β = 1/ε.

        Raises:
            ValueError: ε <= 0 or an unknown regularization.
        """
        if not regularization_strength > 0:
            raise ValueError(f"regularization_strength must be > 0, got {regularization_strength}")
        op = cls(1.0 / regularization_strength, regularization)
        op.regularization_strength = float(regularization_strength)  # exact, not 1 / (1 / ε)
        return op

    def _soft_rank(self, scores: Tensor) -> Tensor:
        """Soft ranks, 1 = largest (paper §5 "soft ranking"): r = P_Q(-θ/ε, ρ) (l2) or exp P_E(-θ/ε, log ρ) (kl),
        ``torchsort.soft_rank(-θ)``; Σ r = n(n+1)/2 exactly for l2."""
        return _SoftRank.apply(scores, self.regularization_strength, self.regularization)

    def _soft_sort(self, scores: Tensor) -> Tensor:
        """Soft sort, descending (paper §5 "soft sorting"): P_Q(ρ/ε, θ) (l2; Σ = Σ θ exactly) or its kl form,
        ``-torchsort.soft_sort(-θ)``."""
        return _SoftSort.apply(scores, self.regularization_strength, self.regularization)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, regularization={self.regularization!r}"
