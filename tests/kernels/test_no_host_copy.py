"""No method of :mod:`diffrank.functional` moves data to the host on CUDA: every operator config, every
method it serves, forward and backward, with the device-to-host transfers recorded at the dispatcher.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every ATen operation, those the autograd engine
runs in the backward included: a copy from a CUDA tensor to the host (``_to_copy`` / ``copy_`` to a CPU tensor,
``.cpu()``, ``.numpy()``'s copy) and a scalar read (``_local_scalar_dense``: ``.item()``, ``bool()``, ``.tolist()``)
are recorded with their number of elements. The validation's one read of its flags
(:func:`diffrank.operators.base.raise_failed`) and solvers' convergence checks read a handful of elements; the
score-sized copies of a host path (B × n elements) fail the test.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from diffrank import functional as F
from diffrank.operators import load
from diffrank.operators.base import PERMUTATION, SOFT_RANK, SOFT_SORT, TOPK_MEMBERSHIP
from diffrank.registry import list_options

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: the most elements a legitimate read moves (validation flags, a convergence check)
SMALL = 16
B, N = 4, 64  # B × N = 256 elements: a copy of the scores is far above SMALL


class HostTransfers(TorchDispatchMode):
    """Records (operation, elements) of every device-to-host transfer while active."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        name = func.__name__
        if name.startswith("_local_scalar_dense") and src is not None and src.is_cuda:
            self.seen.append((name, 1))
        elif isinstance(out, torch.Tensor) and not out.is_cuda:
            cuda_in = [a for a in args if isinstance(a, torch.Tensor) and a.is_cuda]
            if cuda_in and (name.startswith(("_to_copy", "copy_", "to.", "_copy_from"))):
                self.seen.append((name, max(a.numel() for a in cuda_in)))
        return out


def _calls(op) -> list[tuple[str, object]]:
    caps = op.capabilities
    out = []
    if SOFT_SORT in caps:
        out += [("soft_sort", lambda x: F.soft_sort(x, method=op)),
                ("soft_sort desc", lambda x: F.soft_sort(x, method=op, descending=True))]
    if SOFT_RANK in caps:
        out += [("soft_rank", lambda x: F.soft_rank(x, method=op))]
    if TOPK_MEMBERSHIP in caps or PERMUTATION in caps:
        out += [("topk_membership", lambda x: F.topk_membership(x, 3, method=op))]
    if PERMUTATION in caps:
        out += [("permutation_matrix", lambda x: F.permutation_matrix(x, method=op))]
    return out


@pytest.mark.parametrize("name", list_options("operator"))
def test_no_method_moves_data_to_the_host(name):
    op = load(name).cuda()
    x = torch.randn(B, N, generator=torch.Generator().manual_seed(0)).cuda()
    for label, call in _calls(op):
        xx = x.clone().requires_grad_()
        call(xx).sum().backward()  # compiles / verifies the kernels outside the recording (guarded_call's probe)
        xx = x.clone().requires_grad_()
        with HostTransfers() as rec:
            out = call(xx)
            (out * torch.linspace(0, 1, out.shape[-1], device="cuda")).sum().backward()
        torch.cuda.synchronize()
        big = [(op_name, size) for op_name, size in rec.seen if size > SMALL]
        assert not big, f"{name}.{label}: device-to-host transfers of score size {big} (all: {rec.seen})"
