"""A learnable inverse temperature β (a tensor that requires grad) for the pure-PyTorch operators NeuralSort, SoftSort
and SinkhornSort, operator and functional API; and the data-dependent checks under tracing: skipped under vmap and
torch.compile (documented in diffrank.operators.base), unchanged in eager calls and under torch.func.grad."""

from __future__ import annotations

import warnings

import numpy as np
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


LEARNABLE = [m for m in available() if type(load(m)).learnable_beta]


def _call(op, x):
    """The operator's soft ranks, or its top-2 memberships for a top-k-only operator."""
    return op.soft_rank(x) if "soft_rank" in op.capabilities else op.topk_membership(x, [2])


@pytest.mark.parametrize("bad", [-2.0, 0.0, float("nan"), float("inf")])
@pytest.mark.parametrize("method", LEARNABLE)
def test_a_learnable_beta_is_checked_at_every_call(method, bad):
    """An optimiser step can take a learnable β through 0 after construction, where alone it was checked: NeuralSort
    then gave ranks up to 9.5 of 5 items, LapSum and fast soft sort the order reversed, LapSum at β = 0 all 3.0,
    Sinkhorn 'math domain error' or NaN with a convergence warning. Every call checks it now, naming beta and its
    value and the parametrisation that prevents it."""
    beta = torch.nn.Parameter(torch.tensor(2.0, dtype=torch.float64))
    op = load(method, beta=beta)
    x = torch.tensor([[0.3, -1.0, 2.0, 0.5, 1.1]], dtype=torch.float64)
    _call(op, x)
    beta.data.fill_(bad)
    with pytest.raises(
        ValueError,
        match=rf"beta \(inverse temperature\) of \w+ must be a finite positive number, got "
        rf"{bad}.*softplus",
    ):
        _call(op, x)
    beta.data.fill_(1.5)  # back in range: the operator works again
    assert torch.isfinite(_call(op, x)).all()


def test_every_public_method_checks_a_learnable_beta_in_the_scores_host_read(monkeypatch):
    """forward, topk_membership, soft_sort and soft_rank (and an empty batch) each check a tensor β; the check is read
    with the scores' NaN / inf check, one host read per call (a float β adds nothing: its CPU check is numpy's)."""
    from diffrank.operators import base

    reads = []
    real = base.raise_failed
    monkeypatch.setattr(base, "raise_failed", lambda checks: (reads.append(len(checks)), real(checks))[1])
    beta = torch.nn.Parameter(torch.tensor(2.0, dtype=torch.float64))
    op = NeuralSort(beta=beta)
    x = _scores(2, 5)
    for call in (
        lambda s: op(s),
        lambda s: op(s, 2),
        lambda s: op.topk_membership(s, [1, 2]),
        op.soft_sort,
        op.soft_rank,
    ):
        reads.clear()
        call(x)
        assert reads == [2]  # one read: the scores' check and β's together
        beta.data.fill_(-1.0)
        for s in (x, x[:0]):
            with pytest.raises(ValueError, match="got -1.0"):
                call(s)
        beta.data.fill_(2.0)
    reads.clear()
    NeuralSort(beta=2.0).soft_rank(x)
    assert reads == []


def test_the_beta_check_is_skipped_where_no_value_can_be_read():
    """Under vmap (and torch.compile) no value can be read: the check is skipped with the other data-dependent checks,
    as documented (docs/api.md, 'Learnable temperature'); eagerly and under torch.func.grad it raises."""
    beta = torch.nn.Parameter(torch.tensor(-1.0, dtype=torch.float64))
    op = NeuralSort(beta=torch.nn.Parameter(torch.tensor(2.0, dtype=torch.float64)))
    op.beta.data.fill_(-1.0)
    x = _scores(2, 5)
    assert torch.func.vmap(op.soft_rank)(x.unsqueeze(0)).shape == (1, 2, 5)  # no error: the result is undefined
    with pytest.raises(ValueError, match="got -1.0"):
        torch.func.grad(lambda s: op.soft_rank(s).square().sum())(x)
    with pytest.raises(ValueError, match="got -1.0"):
        F.soft_rank(x, method="neuralsort", beta=beta)  # the functional API: refused at construction


def test_a_softplus_parametrised_beta_stays_positive_and_learns():
    """The documented parametrisation: beta = softplus(raw), in the call (functional API) or registered on the
    operator (torch.nn.utils.parametrize); a raw value an optimiser drives far below 0 still gives a β > 0, and the
    gradient reaches raw."""
    import torch.nn.utils.parametrize as parametrize

    class Softplus(nn.Module):
        def forward(self, raw):
            return nn.functional.softplus(raw)

        def right_inverse(self, beta):
            return beta + torch.log(-torch.expm1(-beta))

    x = _scores(2, 5)
    raw = nn.Parameter(torch.tensor(-30.0, dtype=torch.float64))
    F.soft_rank(x, method="lapsum", beta=nn.functional.softplus(raw)).square().sum().backward()
    assert raw.grad is not None and torch.isfinite(raw.grad)
    op = SoftSort(beta=nn.Parameter(torch.tensor(2.0, dtype=torch.float64)))
    parametrize.register_parametrization(op, "beta", Softplus())
    torch.testing.assert_close(op.beta, torch.tensor(2.0, dtype=torch.float64))
    op.parametrizations.beta.original.data.fill_(-30.0)
    out = op.soft_rank(x)  # β ≈ 1e-13: valid, no error
    out.sum().backward()
    assert torch.isfinite(out).all() and op.parametrizations.beta.original.grad is not None


@pytest.fixture
def every_torch_warning():
    """torch's once-per-process warnings given at every occurrence, so that a test sees them whatever ran first."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def test_a_learnable_beta_is_never_converted_to_a_python_scalar_with_its_graph(every_torch_warning):
    """FastSoftSort read a tensor β with float(β) at construction: torch's 'Converting a tensor with
    requires_grad=True to a scalar' warning (an error under -W error). Every value read is of β.detach() now."""
    x = _scores(2, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for method in LEARNABLE:
            beta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
            op = load(method, beta=beta)
            repr(op)
            _call(op, x).sum().backward()
            F.soft_rank(x, method="fast_soft_sort", beta=beta)
    assert load("fast_soft_sort", beta=beta).regularization_strength == pytest.approx(1 / 1.3)


@pytest.mark.parametrize(
    "beta",
    [
        "2",
        True,
        np.array([1.0, 2.0]),
        torch.tensor([1.0, 2.0]),
        torch.tensor(2 + 0j),
        torch.tensor(1.0, device="meta", requires_grad=True),
        torch.tensor(1.0, device="meta"),
    ],
    ids=repr,
)
def test_a_beta_that_is_not_one_real_number_is_named(beta):
    """β as a string or bool (read by float() as 2 and 1), a two-element array or tensor (failing in float()), a
    complex or a meta tensor (failing in .item()): each raises a ValueError naming beta."""
    with pytest.raises(ValueError, match=r"beta \(inverse temperature\)"):
        F.soft_rank(_scores(2, 5), method="neuralsort", beta=beta)
    with pytest.raises(ValueError, match=r"beta \(inverse temperature\)"):
        load("neuralsort", beta=beta)


def test_one_element_arrays_and_tensors_are_the_number():
    """A NumPy scalar or one-element array, or a one-element tensor, is that β (an array of shape (1,) failed with
    'only 0-dimensional arrays can be converted to Python scalars')."""
    x = _scores(2, 5)
    want = F.soft_rank(x, method="neuralsort", beta=2.0)
    for beta in (np.float64(2.0), np.array([2.0]), np.array(2.0), torch.tensor([2.0]), torch.tensor(2)):
        torch.testing.assert_close(F.soft_rank(x, method="neuralsort", beta=beta), want)
