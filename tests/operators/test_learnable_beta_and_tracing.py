"""A learnable inverse temperature β (a tensor that requires grad) for the pure-PyTorch operators NeuralSort, SoftSort
and SinkhornSort, operator and functional API; and the data-dependent checks under tracing: skipped under vmap and
torch.compile (documented in diffrank.operators.base), unchanged in eager calls and under torch.func.grad."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffrank import functional as F
from diffrank.operators import NeuralSort, SinkhornSort, SoftSort, available, load

MAKERS = {
    "neuralsort": NeuralSort,
    "softsort": SoftSort,
    # a fixed number of iterations: a data-dependent stop would make the function of β piecewise
    "sinkhorn": lambda beta: SinkhornSort(beta=beta, tolerance=None, max_iter=40),
}


def _scores(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("method", ["forward", "soft_rank", "topk_membership"])
def test_gradcheck_in_beta(name, method):
    x = _scores(2, 5)
    beta = torch.tensor(1.7 if name != "sinkhorn" else 8.0, dtype=torch.float64, requires_grad=True)
    args = ([2],) if method == "topk_membership" else ()
    f = lambda b: getattr(MAKERS[name](b), method)(x, *args)  # noqa: E731
    assert torch.autograd.gradcheck(f, (beta,))
    assert torch.autograd.gradgradcheck(f, (beta,))


@pytest.mark.parametrize("name", ["neuralsort", "softsort", "sinkhorn"])
def test_functional_beta_tensor_is_not_cached(name):
    beta = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    x = _scores(2, 5)
    grads = []
    for _ in range(2):  # each call builds its graph afresh: a cached operator would hold the first call's
        (g,) = torch.autograd.grad(F.soft_rank(x, method=name, beta=beta).pow(2).sum(), beta)
        grads.append(g)
    torch.testing.assert_close(grads[0], grads[1])
    # the same derivative as the operator built with that β
    (want,) = torch.autograd.grad((6 - load(name, beta=beta).soft_rank(x)).pow(2).sum(), beta)  # ascending
    torch.testing.assert_close(grads[0], want)
    beta.grad = None
    F.soft_sort(x, method=name, beta=beta).sum().backward()
    assert beta.grad is not None and torch.isfinite(beta.grad)


def test_functional_beta_tensor_without_grad_is_a_float_and_cached():
    x = _scores(2, 5)
    a = F.soft_rank(x, method="neuralsort", beta=torch.tensor(2.0))
    torch.testing.assert_close(a, F.soft_rank(x, method="neuralsort", beta=2.0))
    assert ("neuralsort", (("beta", 2.0),)) in F._CACHE


@pytest.mark.parametrize("method", available())
def test_a_tensor_beta_is_learned_or_refused(method):
    """Every config: an operator whose class declares ``learnable_beta`` fills ``beta.grad`` through
    :mod:`diffrank.functional`; any other refuses the tensor at construction (never a silently detached β)."""
    op = load(method)
    beta = torch.tensor(float(op.beta), dtype=torch.float64, requires_grad=True)
    x = _scores(2, 5) * (2.0 / float(op.beta))
    if "topk_membership" in op.capabilities:
        f = lambda: F.topk_membership(x, 2, method=method, beta=beta)  # noqa: E731
    else:
        f = lambda: F.soft_rank(x, method=method, beta=beta)  # noqa: E731
    if not type(op).learnable_beta:
        with pytest.raises(ValueError, match="cannot learn beta"):
            f()
        return
    f().mul(_scores(2, 5)).sum().backward()
    assert beta.grad is not None and torch.isfinite(beta.grad)


def test_parameter_beta_is_registered_and_shown():
    beta = nn.Parameter(torch.tensor(3.0))
    op = NeuralSort(beta=beta, backend="torch")
    assert list(op.parameters()) == [beta]
    assert "beta=3(learnable)" in repr(op)
    op.soft_rank(_scores(2, 5).float()).sum().backward()
    assert beta.grad is not None


def test_sinkhorn_learnable_beta_keeps_its_range_check():
    with pytest.raises(ValueError, match="out of float32's range"):
        SinkhornSort(beta=torch.tensor(1e9, requires_grad=True))(_scores(2, 5).float())


def test_nan_check_runs_eagerly_and_under_func_grad_and_is_skipped_under_vmap():
    x = _scores(2, 5)
    x[0, 1] = float("nan")
    f = lambda s: F.soft_rank(s, method="neuralsort").sum()  # noqa: E731
    with pytest.raises(ValueError, match="non-finite"):
        f(x)
    with pytest.raises(ValueError, match="non-finite"):
        torch.func.grad(f)(x)
    # under vmap no value can be read: the check is skipped (documented), and the NaN stays in its own row
    out = torch.func.vmap(lambda s: F.soft_rank(s, method="neuralsort"))(x.unsqueeze(0))
    assert out[0, 0].isnan().any() and not out[0, 1].isnan().any()
