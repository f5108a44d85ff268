"""difftopk's ``DiffTopkNet`` and ``TopKCrossEntropyLoss`` on diffrank's operators and loss, with difftopk's defaults.

Porting is ``from diffrank.compat.difftopk import DiffTopkNet, TopKCrossEntropyLoss``. difftopk (Petersen et al.,
ICML 2022; github.com/Felix-Petersen/difftopk) differs from diffrank's own entry points in its defaults, which this
module states explicitly:

- ``DiffTopkNet``: steepness β = 10, ``distribution="cauchy"``, λ = 0.25 (diffrank's ``difftopk_bitonic`` config has
  the ImageNet README setting instead: ``logistic_phi``, λ 0.5, β 1).
- ``TopKCrossEntropyLoss``: ``top1_mode="sm"`` (softmax for the top-1 term; diffrank's loss defaults to ``"eq4"``,
  the paper's Eq. 4, difftopk's ``"smce"``), ``art_lambda=0.25``, ``distribution=None`` (a network method then
  needs it, as in difftopk). difftopk builds its splitter network for k = len(p_k), diffrank's loss for the largest
  k with P_K(k) > 0: the top rows of the two are the same (tested).

Orientation: ``DiffTopkNet`` returns ``(None, X)`` with ``X`` ``(B, n, k)`` indexed ``[batch, item, position]``, the
top-1 in the last column, so that ``x @ X`` is the top k in ascending order (``X[b, c, k - 1 - r]`` =
diffrank's ``P[b, r, c]``, docs/conventions.md). ``sparse`` only selects difftopk's implementation (its sparse
path needs ``torch-sparse``); diffrank's bidirectional evaluation never forms an n × n matrix, so both give the
same numbers here. For the bitonic network with n not a power of two see :mod:`diffrank.compat.diffsort`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from diffrank.compat.diffsort import check_count, check_vectors, peer_distribution
from diffrank.losses.topk_cross_entropy import TopKCrossEntropyLoss as _Loss
from diffrank.operators.base import check_beta
from diffrank.operators.neuralsort import NeuralSort
from diffrank.operators.softsort import SoftSort
from diffrank.operators.sorting_network import ComparatorNetwork

#: difftopk's ``DiffTopkNet`` defaults (its ``difftopk.py``)
NET_DEFAULTS = {"sparse": False, "steepness": 10.0, "art_lambda": 0.25, "distribution": "cauchy"}
#: difftopk's ``TopKCrossEntropyLoss`` defaults (its ``losses.py``)
LOSS_DEFAULTS = {"m": None, "distribution": None, "art_lambda": 0.25, "top1_mode": "sm"}

NETWORKS = ("bitonic", "odd_even", "splitter_selection")
# difftopk's network methods -> diffrank's network (sparse or not is only difftopk's implementation)
LOSS_NETWORKS = {"bitonic": "bitonic", "bitonic__non_sparse": "bitonic", "odd_even": "odd_even",
                 "splitter_selection": "splitter_selection"}


class DiffTopkNet(nn.Module):
    """Drop-in for ``difftopk.DiffTopkNet``: the k top rows of a relaxed comparator network.

    Args:
        sorting_network_type: ``"bitonic"``, ``"odd_even"`` or ``"splitter_selection"`` (difftopk: sparse only).
        size: n, the number of values per set.
        k: the number of top ranks, 1 <= k <= n.
        sparse: difftopk's implementation switch (see the module docstring); default False.
        device: accepted for difftopk's signature and ignored (networks are built on the input's device).
        steepness: β (default 10.0). art_lambda: λ of ``logistic_phi`` (default 0.25).
        interpolation_type: difftopk's deprecated alias of ``distribution``.
        distribution: the sigmoid (default ``"cauchy"``; :mod:`diffrank.operators.sigmoids`).

    Call: ``forward(vectors (B, size))`` → ``(None, X (B, size, k))`` in the dtype of ``vectors``, with
    ``vectors[b] @ X[b]`` the soft top k in ascending order (top-1 last).

    Raises:
        ValueError: an unknown network or distribution, ``"splitter_selection"`` with ``sparse=False`` (difftopk
            has no dense splitter), ``size`` < 1, k outside [1, size], ``steepness`` not a finite number > 0,
            disagreeing ``interpolation_type`` / ``distribution``, or ``vectors`` not ``(B, size)``.
        TypeError: ``size`` or ``k`` not an integer (a real k such as 2.7 is refused, not truncated).
    """

    def __init__(self, sorting_network_type: str, size: int, k: int, sparse: bool = NET_DEFAULTS["sparse"],
                 device: str | torch.device | None = "cpu", steepness: float = NET_DEFAULTS["steepness"],
                 art_lambda: float = NET_DEFAULTS["art_lambda"], interpolation_type: str | None = None,
                 distribution: str = NET_DEFAULTS["distribution"]) -> None:
        super().__init__()
        if sorting_network_type not in NETWORKS:
            raise ValueError(f"sorting_network_type must be one of {NETWORKS}, got {sorting_network_type!r}")
        if sorting_network_type == "splitter_selection" and not sparse:
            raise ValueError("difftopk builds the splitter selection network only with sparse=True")
        size = check_count(size, "size", "the number of values per set")
        k = check_count(k, "k", "the number of top ranks; difftopk takes no real-valued k")
        if k > size:
            raise ValueError(f"k must satisfy 1 <= k <= size = {size}, got {k}")
        distribution = peer_distribution(distribution, interpolation_type, "difftopk")
        self.sorting_network_type, self.size, self.k, self.sparse = sorting_network_type, size, k, sparse
        self.steepness, self.art_lambda, self.distribution = steepness, art_lambda, distribution
        self.operator = ComparatorNetwork(beta=check_beta(steepness, learnable=True, name="steepness"),
                                          sigmoid=distribution, art_lambda=art_lambda, network=sorting_network_type)

    def forward(self, vectors: Tensor) -> tuple[None, Tensor]:
        """``(None, X (B, n, k))`` in difftopk's orientation (see the class docstring)."""
        check_vectors(vectors, self.size)
        rows = self.operator.topk_rows(vectors, self.k)  # (B, k, n), row 0 = the largest
        return None, rows.flip(1).transpose(1, 2)


class TopKCrossEntropyLoss(nn.Module):
    """Drop-in for ``difftopk.TopKCrossEntropyLoss`` (Petersen et al. 2022, Eq. 2 / 4), mean over the batch.

    Args:
        diffsort_method: ``"bitonic"``, ``"bitonic__non_sparse"``, ``"odd_even"``, ``"splitter_selection"``,
            ``"neuralsort"`` or ``"softsort"``.
        inverse_temperature: β (the networks' steepness; τ = 1/β for NeuralSort / SoftSort).
        p_k: the weights P_K(1), …, P_K(K), summing to 1.
        n: the number of classes.
        m: the m-subset size (None: all n), max k < m < n as in difftopk.
        distribution: the sigmoid of a network method (difftopk's default None: a network method needs it).
        art_lambda: λ of ``logistic_phi`` (default 0.25; difftopk's README passes None for other sigmoids).
        device: accepted for difftopk's signature and ignored.
        top1_mode: ``"sm"`` (difftopk's default), ``"smce"`` (Eq. 4) or ``"sort"``.

    Call: ``loss(outputs (B, n), labels (B,) int64)`` → scalar; the computation is
    :class:`diffrank.losses.topk_cross_entropy.TopKCrossEntropyLoss` on the operator above.

    Raises:
        ValueError: an unknown method or top1_mode, a network method without ``distribution``, P_K not summing to 1,
            n < 2, m outside (max k, n), ``inverse_temperature`` not a finite number > 0, and (at the call) outputs
            with other than n classes and the errors of diffrank's loss (bad logits, labels).
        TypeError: ``n`` or ``m`` not an integer.
    """

    def __init__(self, diffsort_method: str, inverse_temperature: float, p_k: Sequence[float], n: int,
                 m: int | None = LOSS_DEFAULTS["m"], distribution: str | None = LOSS_DEFAULTS["distribution"],
                 art_lambda: float | None = LOSS_DEFAULTS["art_lambda"], device: str | torch.device | None = "cpu",
                 top1_mode: str = LOSS_DEFAULTS["top1_mode"]) -> None:
        super().__init__()
        try:
            p_k = [float(p) for p in p_k]
        except (TypeError, ValueError):
            raise ValueError(f"p_k must be a sequence of numbers P_K(1), …, P_K(K) summing to 1, got {p_k!r}") from None
        if not 0.9999 < sum(p_k) < 1.0001:
            raise ValueError(f"P_K does not sum up to 1: {p_k} sums up to {sum(p_k)}")
        k = len(p_k)
        n = check_count(n, "n", "the number of classes", low=2)
        if m is not None:
            m = check_count(m, "m", "the m-subset size, or None for all n classes")
            if not k < m < n:
                raise ValueError(f"difftopk needs len(p_k) = {k} < m < n = {n}, got m = {m}")
        inverse_temperature = check_beta(inverse_temperature, learnable=True, name="inverse_temperature")
        if diffsort_method in LOSS_NETWORKS:
            if distribution is None:
                raise ValueError(f"diffsort_method={diffsort_method!r} needs a distribution (the sigmoid), e.g. "
                                 "'cauchy' or 'logistic_phi'")
            operator = ComparatorNetwork(beta=inverse_temperature, sigmoid=distribution,
                                         art_lambda=0.25 if art_lambda is None else art_lambda,
                                         network=LOSS_NETWORKS[diffsort_method])
        elif diffsort_method == "neuralsort":
            operator = NeuralSort(beta=inverse_temperature)
        elif diffsort_method == "softsort":
            operator = SoftSort(beta=inverse_temperature)
        else:
            raise ValueError(f"unknown diffsort_method {diffsort_method!r}; known: "
                             f"{(*LOSS_NETWORKS, 'neuralsort', 'softsort')}")
        if top1_mode not in ("sm", "smce", "sort"):
            raise ValueError(f"top1_mode must be 'sm', 'smce' or 'sort', got {top1_mode!r}")
        self.diffsort_method, self.inverse_temperature, self.p_k, self.n, self.m = (
            diffsort_method, inverse_temperature, p_k, n, m)
        self.top1_mode = top1_mode
        self.loss = _Loss(operator, p_k, m=m, top1_mode=top1_mode)

    def forward(self, outputs: Tensor, labels: Tensor) -> Tensor:
        """The mean loss of ``outputs (B, n)`` against ``labels (B,)``: a scalar.

        Raises:
            ValueError: ``outputs`` whose last dimension is not the ``n`` the loss was built with; the errors of
                diffrank's loss (bad logits, labels).
        """
        if isinstance(outputs, Tensor) and outputs.dim() >= 1 and outputs.shape[-1] != self.n:
            raise ValueError(f"outputs must have n = {self.n} classes (the loss was built with n={self.n}), got shape "
                             f"{tuple(outputs.shape)}")
        return self.loss(outputs, labels)
