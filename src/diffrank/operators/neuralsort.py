"""NeuralSort (Grover, Wang, Zweig, Ermon, ICLR 2019), top rows only.

P̂[r, :] = softmax(((n + 1 - 2r) · s - A_s 1) / τ) for ranks r = 1..n (rank 1 = largest), with
A_s 1 the row sums Σ_l |s_j - s_l| (Grover et al. 2019, Eq. 5; Petersen et al. 2022 §2.2).
τ = 1/β.

Why it is fast: the row sums come from one sort and prefix sums (O(n log n)) instead of the n x n
matrix A_s (difftopk forms A_s and multiplies it by a ones matrix, O(n³)); only the requested r rows
are ever formed, so time and memory are O(B · r · n). With ``backend`` ``"triton"`` (or ``"auto"`` on CUDA)
the rows come from fused kernels (``src/diffrank/kernels/neuralsort.py``: a streaming softmax per rank row, the logits
never stored) and the row sums still from the sort here, so no n x n tensor exists forward or backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.backend import check_backend, use_triton
from diffrank.operators.base import RankingOperator, beta_repr


def abs_diff_row_sums(scores: Tensor) -> Tensor:
    """Σ_l |s_j - s_l| for every item j, in O(n log n) via a sort and prefix sums.

    Args:
        scores: ``(B, n)`` floating tensor.

    Returns:
        ``(B, n)`` tensor of row sums of ``|s_j - s_l|``, same dtype; differentiable (the gradient is
        that of the exact sum: sign(s_j - s_l) summed, 0 at ties).
    """
    n = scores.shape[-1]
    v, order = scores.sort(dim=-1)
    prefix = v.cumsum(dim=-1)  # prefix[i] = v_0 + ... + v_i
    total = prefix[..., -1:]
    i = torch.arange(n, device=scores.device, dtype=scores.dtype)
    below = v * i - (prefix - v)  # Σ_{l<i} (v_i - v_l)
    above = (total - prefix) - v * (n - 1 - i)  # Σ_{l>i} (v_l - v_i)
    sums_sorted = below + above
    return sums_sorted.scatter(-1, order, sums_sorted)  # out of place: vmap has a batching rule for it


class NeuralSort(RankingOperator):
    """NeuralSort relaxed permutation, rows = ranks (rank 1 = largest), computing only the top rows.

    Args:
        beta: inverse temperature β = 1/τ (Grover et al.'s τ); > 0. Default 0.5, the config's value
            (``configs/operator/neuralsort.yaml``: the difftopk README's ImageNet heads).
            A 0-d tensor that requires grad is learnable (:attr:`learnable_beta`; autograd gives ∂/∂β, on the
            PyTorch path: the kernels take a fixed β).
        backend: ``"auto"`` (Triton kernels on CUDA inputs, PyTorch elsewhere), ``"torch"`` or ``"triton"``
            (see :mod:`diffrank.operators.backend`); both compute the same rows.

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``; each row sums to 1 (a softmax);
    columns sum to ≈ 1 only (Grover et al. 2019, §3: P̂ is unimodal row-stochastic).

    Second derivatives are exact on both paths (the kernels' backward is differentiable). Under ``torch.compile``
    the PyTorch path compiles with ``fullgraph=True``.

    Raises:
        ValueError: for beta <= 0, an unknown backend, or ``backend="triton"`` with a learnable β; see
            :class:`RankingOperator` for input errors.
    """

    permutation_equivariant = True
    learnable_beta = True
    hard_beta = 200.0

    def __init__(self, beta: float | Tensor = 0.5, backend: str = "auto") -> None:
        super().__init__(beta)
        self.backend = check_backend(backend)
        if self.backend == "triton" and isinstance(self.beta, Tensor):
            raise ValueError("the Triton kernels take a fixed beta; a learnable (tensor) beta needs backend='torch' "
                             "or 'auto' (which then runs PyTorch)")

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Top ``k`` (or all n) rows of P̂ (Grover et al. 2019, Eq. 5). Shapes as in the class docstring."""
        n = scores.shape[-1]
        r = n if k is None else k
        if not isinstance(self.beta, Tensor) and use_triton(self.backend, scores):
            from diffrank.kernels.neuralsort import neuralsort_topk_rows

            return neuralsort_topk_rows(scores, abs_diff_row_sums(scores), r, self.beta)
        ranks = torch.arange(1, r + 1, device=scores.device, dtype=scores.dtype)
        scale = (n + 1 - 2 * ranks).view(1, r, 1)  # (1, r, 1)
        logits = scale * scores.unsqueeze(1) - abs_diff_row_sums(scores).unsqueeze(1)
        return torch.softmax(logits * self.beta, dim=-1)

    def extra_repr(self) -> str:
        return f"beta={beta_repr(self.beta)}, backend={self.backend!r}"
