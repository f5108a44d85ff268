"""Smooth top-k SVM losses (Berrada, Zisserman, Kumar, ICLR 2018), the baselines of Petersen et al. 2022.

Smooth top-k SVM with margin α = 1 and temperature τ (Berrada et al. 2018, eq. (10)-(11); the margin
enters as α/τ and the scores as s/(kτ), as in the paper and the reference implementation):

    L_{k,τ}(s, y) = τ log Σ_{Ȳ ∈ 𝒴_k} exp(α 1[y ∉ Ȳ]/τ + Σ_{j∈Ȳ} s_j/(kτ))
                  - τ log Σ_{Ȳ ∈ 𝒴_k, y ∈ Ȳ} exp(Σ_{j∈Ȳ} s_j/(kτ)),

𝒴_k being the k-subsets of the classes. With x = s/(kτ) and x̄ the scores without the label,
Σ_{Ȳ∌y} e^{Σx} = e_k(e^{x̄}) and Σ_{Ȳ∋y} e^{Σx} = e^{x_y} e_{k-1}(e^{x̄}), where e_j are elementary symmetric
polynomials (Berrada et al. §4). So

    L = τ [logaddexp(log e_k + α/τ, x_y + log e_{k-1}) - (x_y + log e_{k-1})].

log e_j (j <= k) is computed in log space by divide and conquer over the polynomial Π_i (1 + e^{x̄_i} t)
truncated to degree k (Berrada et al. §4.1, Alg. 1): log n levels of pairwise products, each a log-space
convolution (logsumexp over the anti-diagonals), O(B n k²) time. Every quantity stays in log space, so
automatic differentiation through the logsumexps is exact and stable; the reference code's recursive
backward with its p-th order approximation is therefore not needed.

``SmoothHardTopKLoss`` (the reference code's default baseline) uses, per sample, the hard top-k SVM
max(0, mean of the top k of (x̄ + α) - (sum of the top k-1 of x̄ + s_y)/k) whenever
s_[k] - s_[k+1] >= kτ log(1000), the smooth loss otherwise. Both return the batch mean.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from diffrank.losses.validation import check_logits_labels

_HARD_SWITCH = 1e3  # the reference code's threshold
_ABSENT = -1e30  # log-weight of a class left out of the polynomial (finite: keeps logsumexp gradients NaN-free)


def log_elementary_symmetric(log_x: Tensor, k: int) -> Tensor:
    """log e_j(exp(log_x)) for j = 0..k, by divide and conquer in log space (Berrada et al. 2018, §4.1).

    Args:
        log_x: ``(B, n)`` floating, finite (use a very negative value such as -1e30 to leave an entry out).
        k: highest degree, ``1 <= k``.

    Returns:
        ``(B, k + 1)``: column j is log of the sum over all j-subsets of the product of their exp(log_x).
        Degrees above the number of present entries come out as about -1e30.
    """
    B, n = log_x.shape
    size = 1 << max(0, (n - 1).bit_length())
    poly = log_x.new_full((B, size, k + 1), _ABSENT)
    poly[:, :, 0] = 0.0  # log 1
    poly[:, :n, 1] = log_x
    if size > n:
        poly[:, n:, 1] = _ABSENT
    deg = torch.arange(k + 1, device=log_x.device)
    other = deg.view(-1, 1) - deg.view(1, -1)  # (m, a) -> m - a
    valid = other >= 0
    idx = other.clamp_min(0)
    mask = torch.zeros(k + 1, k + 1, dtype=log_x.dtype, device=log_x.device).masked_fill(~valid, -math.inf)
    while poly.shape[1] > 1:
        a, b = poly[:, 0::2], poly[:, 1::2]  # (B, G, k+1) each
        # c_m = LSE_{a <= m} (A_a + B_{m-a}); the a = 0 term is always finite, so no all -inf row
        terms = a.unsqueeze(-2) + b[..., idx] + mask  # (B, G, m, a)
        poly = torch.logsumexp(terms, dim=-1)
    return poly[:, 0]


def _check_k_tau(k: int, tau: float, n_classes: int | None) -> tuple[int, float]:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    tau = float(tau)
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a finite positive number, got {tau}")
    if n_classes is not None and not (isinstance(n_classes, int) and k < n_classes):
        raise ValueError(f"n_classes must be an integer > k = {k}, got {n_classes!r}")
    return k, tau


def _check_batch(logits: Tensor, labels: Tensor, k: int, n_classes: int | None) -> None:
    check_logits_labels(logits, labels)
    n = logits.shape[1]
    if n_classes is not None and n != n_classes:
        raise ValueError(f"logits have {n} classes, the loss was built for n_classes = {n_classes}")
    if k >= n:
        raise ValueError(f"the top-k SVM needs k < n: k = {k}, n = {n} classes")


def _split(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(scores with the label's entry replaced by -1e30, label scores (B,))."""
    is_label = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, labels.view(-1, 1).long(), True)
    return logits.masked_fill(is_label, _ABSENT), logits.gather(1, labels.view(-1, 1).long()).squeeze(1)


def smooth_topk_svm(logits: Tensor, labels: Tensor, k: int, tau: float, alpha: float = 1.0) -> Tensor:
    """Per-sample smooth top-k SVM loss L_{k,τ} (Berrada et al. 2018, eq. (11)).

    Args:
        logits: ``(B, n)`` floating (half precision is computed in float32); labels: ``(B,)`` integer.
        k: top-k size, 1 <= k < n. tau: temperature τ > 0. alpha: margin.

    Returns:
        ``(B,)`` losses (>= 0).
    """
    x = (logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits) / (k * tau)
    others, x_y = _split(x, labels)
    log_e = log_elementary_symmetric(others, k)
    with_y = x_y + log_e[:, k - 1]
    return tau * (torch.logaddexp(log_e[:, k] + alpha / tau, with_y) - with_y)


def hard_topk_svm(logits: Tensor, labels: Tensor, k: int, alpha: float = 1.0) -> Tensor:
    """Per-sample hard top-k SVM (Lapin et al. 2015; Berrada et al. 2018, eq. (6)).

    max(0, mean of top k of (s_j + α, j ≠ y) - (sum of top k-1 of s_j, j ≠ y, + s_y)/k), shape ``(B,)``.
    """
    others, s_y = _split(logits, labels)
    top = others.topk(k, dim=1).values  # the label's entry is -1e30: never selected since k < n
    return torch.clamp((top + alpha).mean(1) - (top[:, : k - 1].sum(1) + s_y) / k, min=0)


class SmoothTopKLoss(nn.Module):
    """Smooth top-k SVM loss (Berrada et al. 2018, eq. (11)), margin 1, batch mean.

    Args:
        k: top-k size (1 <= k < n). tau: temperature τ > 0 (reference default 1).
        n_classes: optional number of classes n, checked against the logits.

    Call: ``loss(logits (B, n) float, labels (B,) int64)`` → scalar (float32 for half-precision logits).

    Raises:
        ValueError / TypeError: bad k, tau, n_classes; bad logits / labels (2-D, floating, finite; integer
            labels in [0, n)); k >= n.
    """

    def __init__(self, k: int = 5, tau: float = 1.0, n_classes: int | None = None) -> None:
        super().__init__()
        self.k, self.tau = _check_k_tau(k, tau, n_classes)
        self.n_classes = n_classes

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        _check_batch(logits, labels, self.k, self.n_classes)
        return smooth_topk_svm(logits, labels, self.k, self.tau).mean()

    def extra_repr(self) -> str:
        return f"k={self.k}, tau={self.tau}, n_classes={self.n_classes}"


class SmoothHardTopKLoss(SmoothTopKLoss):
    """Smooth top-k SVM that switches per sample to the hard top-k SVM (Berrada et al. 2018, §4.2).

    The hard loss is used where s_[k] - s_[k+1] >= kτ log(1000) (the smooth loss is then within
    numerical noise of it); otherwise the smooth loss. Same arguments, call and errors as
    :class:`SmoothTopKLoss`.
    """

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        _check_batch(logits, labels, self.k, self.n_classes)
        x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        top = x.detach().topk(self.k + 1, dim=1).values
        hard = (top[:, self.k - 1] - top[:, self.k]) >= self.k * self.tau * math.log(_HARD_SWITCH)
        loss = torch.where(hard, hard_topk_svm(x, labels, self.k), smooth_topk_svm(x, labels, self.k, self.tau))
        return loss.mean()
