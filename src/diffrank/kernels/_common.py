"""Launch helpers the kernel modules share: block sizes and the accumulation dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def block_size(n: int, cap: int | None = 1024) -> int:
    """The power-of-two block covering ``n`` elements (at least 16; at most ``cap`` when given)."""
    b = triton.next_power_of_2(max(int(n), 16))
    return b if cap is None else min(cap, b)


def row_item_blocks(n: int) -> tuple[int, int]:
    """(BLOCK of the row programs, BLOCK of the item programs) for rows of n items (NeuralSort, SoftSort)."""
    block = block_size(n)
    return block, min(block, 256)  # narrower item blocks: more programs per sample in the backward


def acc(dtype: torch.dtype):
    """The Triton accumulation dtype: float64 for float64 inputs, float32 otherwise."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def acc_torch(dtype: torch.dtype) -> torch.dtype:
    """:func:`acc` as a torch dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def beta_tensor(beta: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """β as a one-element tensor of the accumulation dtype of ``dtype`` on ``device``: a Python float argument would
    reach a kernel rounded to float32 (a fill: no host copy)."""
    return torch.full((1,), beta, dtype=acc_torch(dtype), device=device)
