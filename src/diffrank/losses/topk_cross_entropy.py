"""The top-k cross-entropy of Petersen, Kuehne, Borgelt, Deussen (ICML 2022), Eq. 2 and Eq. 4.

ℓ(s, y) = -log Σ_k P_K(k) · Pr(y ∈ top-k), Pr(y ∈ top-k) = Σ_{r<=k} P[r, y] (Eq. 2), where P is the
relaxed permutation of the scores produced by a ranking operator (rows = ranks, rank 1 = largest).
Swapping the sums: Σ_k P_K(k) Σ_{r<=k} P[r, y] = Σ_r w_r P[r, y] with w_r = Σ_{k>=r} P_K(k).

Top-1 handling (``top1_mode``; Petersen et al. 2022, Eq. 4, and their reference code):

- ``"eq4"`` — the paper's Eq. 4 (the reference code's ``smce``):
  ℓ = P_K(1) · CE(s, y) - (1 - P_K(1)) · log q_y, q_y = Σ_{k>=2} P_K(k) Pr(y ∈ top-k).
  As in the reference code, q is not renormalised by 1 - P_K(1): that only adds a constant.
- ``"sm"`` — the reference code's default: p_y = P_K(1) · softmax(s)_y + Σ_{k>=2} P_K(k) Pr(y ∈ top-k),
  ℓ = -log p_y.
- ``"sort"`` — Eq. 2 as written: every k, k = 1 included, through the operator.

Probabilities are squeezed affinely into [1e-7, 1 - 1e-7] before the log, exactly as the reference
code does (p·(1 - 2e-7) + 1e-7); this is its only safeguard and keeps parity of values and gradients.

m-subset (§3.2 of the paper): only m of the n classes are ranked: the ground truth first, then the
m - 1 highest-scoring other classes in descending score order (the order matters for sorting networks,
which are not permutation equivariant). Softmax terms are then also over the m-subset, and classes
outside it get no gradient — both as in the reference code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffrank.losses.pk import PK
from diffrank.losses.validation import call_operator, index_labels, logits_labels_checks
from diffrank.operators.base import TOPK_MEMBERSHIP, RankingOperator, raise_failed, require

TOP1_MODES = ("eq4", "sm", "sort")
_CLAMP = 1e-7


def _squeezed_log(p: Tensor) -> Tensor:
    return torch.log(p * (1 - 2 * _CLAMP) + _CLAMP)


def m_subset(logits: Tensor, labels: Tensor, m: int) -> Tensor:
    """The m-subset of Petersen et al. 2022 §3.2: ground-truth score first, then the top m - 1 others.

    Args:
        logits: ``(B, n)`` floating.
        labels: ``(B,)`` int64 in ``[0, n)``.
        m: subset size, ``2 <= m <= n``.

    Returns:
        ``(B, m)`` scores; the ground truth is column 0, the rest in descending order.
    """
    gt = logits.gather(1, labels.unsqueeze(1))
    masked = logits.scatter(1, labels.unsqueeze(1), float("-inf"))
    others = masked.topk(m - 1, dim=1, sorted=True).values
    return torch.cat([gt, others], dim=1)


class TopKCrossEntropyLoss(nn.Module):
    """Top-k cross-entropy loss (Petersen et al. 2022, Eq. 2 / Eq. 4), mean over the batch.

    Args:
        operator: a ranking operator providing ``topk_membership`` (every P operator does).
        p_k: :class:`PK` or a list of weights P_K(1), P_K(2), ...
        m: m-subset size (None = rank all n classes). Must satisfy max k < m <= n.
        top1_mode: ``"eq4"`` (paper Eq. 4, reference ``smce``), ``"sm"`` (reference default) or ``"sort"``.

    Call: ``loss(logits (B, n) float, labels (B,) integer)`` → scalar of the logits' dtype (float32 for
    half-precision logits: the operator runs in float32). Labels of any integer dtype (cast to int64:
    :func:`~diffrank.losses.validation.index_labels`).

    Raises:
        ValueError: unknown top1_mode, an operator without top-k membership, invalid P_K (see :class:`PK`),
            m <= max k or m > n, k > n, bad logits or labels (see ``check_logits_labels``).
    """

    def __init__(self, operator: RankingOperator, p_k: PK | Sequence[float], m: int | None = None,
                 top1_mode: str = "eq4") -> None:
        super().__init__()
        if top1_mode == "smce":  # the reference code's name for Eq. 4
            top1_mode = "eq4"
        if top1_mode not in TOP1_MODES:
            raise ValueError(f"top1_mode must be one of {TOP1_MODES} (or 'smce' = 'eq4'), got {top1_mode!r}")
        if p_k is None:
            raise ValueError("TopKCrossEntropyLoss needs P_K: choose one with pk=<name> or pk.weights=[...]")
        self.p_k = p_k if isinstance(p_k, PK) else PK(p_k)
        self.top1_mode = top1_mode
        if m is not None:
            m = int(m)
            if m <= self.p_k.k_max:
                raise ValueError(f"m-subset size m = {m} must be larger than the largest k of P_K "
                                 f"({self.p_k.k_max}, P_K = {list(self.p_k.weights)})")
        self.m = m
        start = 1 if top1_mode == "sort" else 2
        self._ks = self.p_k.support(start)
        if self._ks:
            if operator is None:
                raise ValueError(f"P_K = {list(self.p_k.weights)} needs a ranking operator (operator is None)")
            require(operator, TOPK_MEMBERSHIP, "TopKCrossEntropyLoss")
        self.operator = operator
        self._w_cache: dict = {}

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Mean top-k cross-entropy of ``logits (B, n)`` against ``labels (B,)``: a scalar, float32 for half logits.

        Host synchronisations: one. The label-range check is read together with the operator's own check of
        its input (:func:`diffrank.losses.validation.call_operator`); without an operator call (P_K = [1]
        only) the finite-logits and label checks are read together here.
        """
        # with an operator the finite check is the operator's (on the scores it ranks): do not repeat it, unless
        # it only sees the m-subset (a -inf logit outside it must still be an error)
        checks = logits_labels_checks(logits, labels, finite=not self._ks or self.m is not None)
        labels = index_labels(labels)
        n = logits.shape[1]
        if self.p_k.k_max > n:
            raise ValueError(f"P_K puts mass on k = {self.p_k.k_max} > n = {n} classes")
        if self.m is not None and self.m > n:
            raise ValueError(f"m-subset size m = {self.m} exceeds the number of classes n = {n} "
                             "(set loss.m=null to rank all classes)")
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        # an out-of-range label must surface as the check's ValueError, not as an indexing error (or a CUDA
        # device assert) raised before the check is read: index with clamped labels until then
        safe = labels.clamp(0, n - 1) if checks and self._ks else labels
        if self.m is not None:
            scores = m_subset(logits, safe, self.m)
            target = torch.zeros_like(labels)
        else:
            scores, target = logits, safe
        pk = self.p_k.weights
        if self._ks:
            with torch.autocast(device_type=scores.device.type, enabled=False):
                member = call_operator(self.operator.topk_membership, scores, self._ks, checks=checks)
            member_y = member.gather(2, target.view(-1, 1, 1).expand(-1, member.shape[1], 1)).squeeze(2)
            mix = member_y @ self._weights(member_y)  # Σ_k P_K(k) Pr(y ∈ top-k), (B,)
        else:
            raise_failed(checks)
            mix = scores.new_zeros(scores.shape[0])
        if self.top1_mode == "sort":
            return -_squeezed_log(mix).mean()
        p1 = pk[0]
        if self.top1_mode == "sm":
            soft = torch.softmax(scores, dim=1).gather(1, target.unsqueeze(1)).squeeze(1)
            return -_squeezed_log(p1 * soft + mix).mean()
        loss = p1 * F.cross_entropy(scores, target) if p1 > 0 else scores.new_zeros(())
        if self._ks:
            loss = loss - _squeezed_log(mix).mean() * (1.0 - p1)
        return loss

    def _weights(self, like: Tensor) -> Tensor:
        """P_K(k) for the operator's ks, ``(len(ks),)`` in ``like``'s dtype and device, built once per
        (dtype, device): a host-to-device copy every step would synchronise."""
        key = (like.dtype, like.device)
        w = self._w_cache.get(key)
        if w is None:
            w = torch.tensor([self.p_k.weights[k - 1] for k in self._ks], dtype=like.dtype).to(like.device)
            self._w_cache[key] = w
        return w

    def extra_repr(self) -> str:
        return f"p_k={list(self.p_k.weights)}, m={self.m}, top1_mode={self.top1_mode!r}"
