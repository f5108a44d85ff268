"""The Triton autograd Functions of NeuralSort, SoftSort and the fused Sinkhorn under ``torch.func`` (vmap rules,
``setup_context``) and double backward: exact for NeuralSort / SoftSort (their recorded backward is PyTorch
operations), refused with :class:`DoubleBackwardError` for the fused Sinkhorn. The PyTorch path is the reference."""

from __future__ import annotations

import pytest
import torch
from kernel_devices import DEVICE, ON_DEVICE

from diffrank.operators import NeuralSort, SinkhornSort, SoftSort
from diffrank.operators.base import DoubleBackwardError

pytestmark = [pytest.mark.triton, ON_DEVICE]

K = 3
MAKERS = {
    "neuralsort": lambda backend: NeuralSort(beta=1.3, backend=backend),
    "softsort": lambda backend: SoftSort(beta=1.3, backend=backend),
    # a few plain iterations: the interpreter runs each one in Python
    "sinkhorn": lambda backend: SinkhornSort(beta=10.0, backend=backend, tolerance=None, max_iter=3,
                                             epsilon_start=None),
}


def _rows(name: str, backend: str):
    op = MAKERS[name](backend)
    return lambda s: op(s, k=K)


def _scores(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(DEVICE)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_vmap_grad_and_jacrev_match_the_pytorch_path(name):
    kern, ref = _rows(name, "triton"), _rows(name, "torch")
    xs = _scores(2, 3, 5)
    torch.testing.assert_close(torch.func.vmap(kern)(xs), torch.stack([ref(x) for x in xs]))
    x = xs[0]
    w = _scores(3, K, 5, seed=1)
    loss = lambda f: lambda s: (f(s) * w).sum()  # noqa: E731
    torch.testing.assert_close(torch.func.grad(loss(kern))(x), torch.func.grad(loss(ref))(x))
    torch.testing.assert_close(torch.func.jacrev(kern)(x), torch.func.jacrev(ref)(x))


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_double_backward_of_the_kernels_is_exact(name):
    x = _scores(2, 5).requires_grad_()
    assert torch.autograd.gradgradcheck(_rows(name, "triton"), (x,))


def test_fused_sinkhorn_refuses_double_backward_and_names_the_alternative():
    x = _scores(2, 5).requires_grad_()
    p = _rows("sinkhorn", "triton")(x)
    (g,) = torch.autograd.grad((p * _scores(2, K, 5, seed=1)).sum(), x, create_graph=True)
    with pytest.raises(DoubleBackwardError, match="backend='torch'"):
        torch.autograd.grad(g.sum(), x)


def test_learnable_beta_needs_the_pytorch_path():
    beta = torch.tensor(1.0, requires_grad=True)
    with pytest.raises(ValueError, match="fixed beta"):
        NeuralSort(beta=beta, backend="triton")
    with pytest.raises(ValueError, match="fixed beta"):
        SoftSort(beta=beta, backend="triton")
    # 'auto' runs PyTorch for a learnable β (the kernels take a float), so ∂/∂β reaches the tensor
    NeuralSort(beta=beta, backend="auto")(_scores(2, 5).float()).sum().backward()
    assert beta.grad is not None
