"""Where the kernel tests run, and the PyTorch-vs-Triton comparison they share.

The kernels run compiled on CUDA tensors, and on CPU tensors only under the interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 where there is no GPU); ``DEVICE`` hosts the tests that run on one device only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
ON_DEVICE = pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="needs CUDA or TRITON_INTERPRET=1")
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="CPU kernels need TRITON_INTERPRET=1")),
           pytest.param("cuda", marks=[pytest.mark.gpu,
                                       pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def both_backends(make: Callable[[str], nn.Module], s: Tensor, k: int) -> list[tuple[Tensor, Tensor, nn.Module]]:
    """P (top ``k`` rows), ∂⟨P, W⟩/∂s and the operator, from ``make("torch")`` and ``make("triton")``, for the
    same random weights W."""
    out, w = [], None
    for backend in ("torch", "triton"):
        x = s.clone().requires_grad_()
        op = make(backend)
        p = op(x, k=k)
        if w is None:
            w = torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(p)
        (p.float() * w.float()).sum().backward()
        out.append((p, x.grad, op))
    return out
