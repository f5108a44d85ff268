"""Contract tests for every operator config: the config folder drives the listing (like timm's tests).

A new ``configs/operator/<name>.yaml`` is tested here the moment it exists. What is checked depends on
the operator's declared ``capabilities`` and the attributes that :class:`RankingOperator` declares
(``doubly_stochastic``, ``permutation_equivariant``, ``hard_beta``).
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from diffrank.operators import available
from diffrank.operators.base import (
    ALL_CAPABILITIES,
    PERMUTATION,
    SOFT_RANK,
    SOFT_SORT,
    TOPK_MEMBERSHIP,
    RankingOperator,
)
from helpers import load_deterministic as load  # stochastic operators without noise (helpers)

NAMES = available()
CONTRACT_ATTRIBUTES = ("capabilities", "doubly_stochastic", "permutation_equivariant", "hard_beta", "sums_to_k")
PUBLIC = ("forward", "topk_membership", "soft_sort", "soft_rank")


def _caps(name):
    return load(name).capabilities


def _untied(B, n, seed=0, spacing=0.5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    perms = torch.stack([torch.randperm(n, generator=g) for _ in range(B)])
    jitter = torch.rand(B, n, generator=g) * 0.1
    return (perms.to(dtype) + jitter.to(dtype)) * spacing / 1.0


def _hard_p(scores):
    B, n = scores.shape
    order = scores.argsort(dim=1, descending=True)
    p = torch.zeros(B, n, n, dtype=scores.dtype)
    p.scatter_(2, order.unsqueeze(-1), 1.0)
    return p


def _with(cap):
    return [pytest.param(n, id=n) for n in NAMES if cap in _caps(n)]


def _calls(op):
    """One call per capability of ``op``: (capability, function of the scores)."""
    calls = {PERMUTATION: lambda s: op(s, k=2), TOPK_MEMBERSHIP: lambda s: op.topk_membership(s, [1, 3]),
             SOFT_SORT: op.soft_sort, SOFT_RANK: op.soft_rank}
    return [(cap, fn) for cap, fn in calls.items() if cap in op.capabilities]


def test_registry_is_not_empty():
    assert {"neuralsort", "softsort", "sinkhorn"} <= set(NAMES)


def test_base_declares_the_contract():
    """The attributes the contract reads and the public methods are the base class's (template)."""
    for attr in CONTRACT_ATTRIBUTES:
        assert attr in vars(RankingOperator), attr
    assert RankingOperator.capabilities == ALL_CAPABILITIES
    assert RankingOperator.doubly_stochastic is False and RankingOperator.permutation_equivariant is False
    for name in NAMES:
        op = load(name)
        assert isinstance(op, RankingOperator)
        for method in PUBLIC:
            owner = next(c for c in type(op).__mro__ if method in vars(c))
            assert owner is RankingOperator, f"{name} overrides the public {method}"
        assert op.capabilities <= ALL_CAPABILITIES and op.capabilities
        assert isinstance(op.doubly_stochastic, bool) and isinstance(op.permutation_equivariant, bool)
        assert math.isfinite(op.hard_beta) and op.hard_beta > 0


@pytest.mark.parametrize("name", NAMES)
def test_validation_synchronises_at_most_once(name, monkeypatch):
    """Each public call reads tensor data on the host at most once before its hook runs (hooks stubbed).

    The host reads are counted by wrapping every Tensor method that returns a Python value from the data."""
    op = load(name)
    reads = []
    for method in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, _method=method, **kwargs):
            reads.append(_method)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    hooks = {"_permutation": lambda x, k: x, "_topk_membership": lambda x, ks: x,
             "_soft_sort": lambda x: x, "_soft_rank": lambda x: x}
    for hook, stub in hooks.items():
        monkeypatch.setattr(op, hook, stub)
    s = torch.randn(4, 6)
    for cap, fn in _calls(op):
        reads.clear()
        fn(s)
        assert len(reads) <= 1, f"{name} {cap}: {len(reads)} host reads ({reads})"


def test_unknown_operator_lists_known():
    with pytest.raises(ValueError, match="known operators: .*sinkhorn"):
        load("no_such_operator")


@pytest.mark.parametrize("name", NAMES)
def test_bad_beta(name):
    for beta in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="beta"):
            load(name, beta=beta)


@pytest.mark.parametrize("name", NAMES)
def test_bad_scores(name):
    op = load(name)
    caps = op.capabilities
    call = (lambda s: op(s)) if PERMUTATION in caps else (
        (lambda s: op.topk_membership(s, [1])) if TOPK_MEMBERSHIP in caps else
        (lambda s: op.soft_rank(s)) if SOFT_RANK in caps else (lambda s: op.soft_sort(s)))
    with pytest.raises(ValueError, match="2-D"):
        call(torch.randn(5))
    with pytest.raises(TypeError, match="floating"):
        call(torch.arange(10).view(2, 5))
    bad = torch.randn(2, 5)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        call(bad)
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        call(bad)


@pytest.mark.parametrize("name", NAMES)
def test_bad_k(name):
    op = load(name)
    s = torch.randn(2, 5)
    if PERMUTATION in op.capabilities:
        for k in (0, 6, -1):
            with pytest.raises(ValueError, match="k must satisfy"):
                op(s, k=k)
        with pytest.raises(TypeError):
            op(s, k=2.5)
    if TOPK_MEMBERSHIP in op.capabilities:
        with pytest.raises(ValueError, match="k must satisfy"):
            op.topk_membership(s, [1, 6])


@pytest.mark.parametrize("name", [n for n in NAMES if PERMUTATION not in _caps(n)])
def test_missing_capability_is_a_clear_error(name):
    with pytest.raises(ValueError, match="provides only"):
        load(name)(torch.randn(2, 5))


@pytest.mark.parametrize("name", _with(PERMUTATION))
def test_shapes_and_row_sums(name):
    op = load(name)
    s = torch.randn(3, 7, dtype=torch.float64)
    p = op(s)
    assert p.shape == (3, 7, 7) and p.dtype == torch.float64
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 7, dtype=torch.float64), atol=1e-6, rtol=0)
    assert (p >= -1e-12).all()
    pk = op(s, k=3)
    assert pk.shape == (3, 3, 7)
    torch.testing.assert_close(pk, p[:, :3], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", [n for n in NAMES if PERMUTATION in _caps(n) and load(n).doubly_stochastic])
def test_column_sums_doubly_stochastic(name):
    op = load(name)
    schedule = getattr(op, "schedule", None)  # iterative operators: columns are exact to their tolerance
    tol = (1e-6 if schedule is None else schedule.tolerance) * 1.01 + 1e-9
    p = op(torch.randn(4, 9, dtype=torch.float64))
    assert (p.sum(-2) - 1).abs().max() <= tol


@pytest.mark.parametrize("name", _with(PERMUTATION))
def test_converges_to_hard_permutation(name):
    s = _untied(4, 8)
    hard = _hard_p(s)
    soft = load(name, beta=1.0 / 8)(s)  # far from hard: the test can fail
    assert (soft - hard).abs().max() > 1e-2
    err = (load(name, beta=load(name).hard_beta)(s) - hard).abs().max()
    assert err < 1e-3, f"{name}: max |P - P_hard| = {err:.3g} at beta = hard_beta"


def gradcheck_capability(op, capability: str) -> None:
    """float64 ``gradcheck`` of one capability of ``op`` at its own β on untied scores (2, 5): for
    ``"permutation"`` the full P and its top 2 rows (every Jacobian entry), else the method of that capability
    (top-k membership for ks = [1, 3]) in gradcheck's fast mode: one random projection uᵀJv, which a wrong
    Jacobian misses only with probability 0, for a tenth of the time (sinkhorn's full check takes seconds).

    Raises:
        AssertionError: the analytical gradient differs from the finite differences (the message names the
            capability and carries gradcheck's report).
    """
    s = torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    fns = [fn for cap, fn in _calls(op) if cap == capability]
    if capability == PERMUTATION:
        fns.append(lambda x: op(x))
    assert fns, f"{type(op).__name__} does not provide {capability}"
    for fn in fns:
        try:
            torch.autograd.gradcheck(fn, (s,), eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=capability != PERMUTATION)
        except GradcheckError as err:
            raise AssertionError(f"{type(op).__name__}.{capability}: wrong gradient\n{err}") from None


@pytest.mark.parametrize("name, capability", [pytest.param(n, c, id=f"{n}-{c}") for n in NAMES
                                              for c in sorted(_caps(n))])
def test_gradcheck_every_capability(name, capability):
    """Every capability, not only P: a soft_rank-only operator with a wrong gradient fails here
    (test_planted_wrong_soft_rank_gradient_fails). An operator whose gradient is a Monte-Carlo estimate
    (``exact_gradient`` False) is checked against its enumerated expectation instead
    (tests/operators/test_perturbed.py)."""
    op = load(name)
    if not op.exact_gradient:
        pytest.skip(f"{name}: the gradient is an estimate of the expectation's (tests/operators/test_perturbed.py)")
    gradcheck_capability(op, capability)


class _ScaledRankGradient(torch.autograd.Function):
    """R_i = 1 + Σ_j σ(β (s_j - s_i)) - 1/2 (a pairwise soft rank) whose backward is 3 × the true gradient."""

    @staticmethod
    def rank(s, beta):
        return torch.sigmoid(beta * (s.unsqueeze(-2) - s.unsqueeze(-1))).sum(-1) + 0.5

    @staticmethod
    def forward(ctx, s, beta):
        ctx.save_for_backward(s)
        ctx.beta = beta
        return _ScaledRankGradient.rank(s, beta)

    @staticmethod
    def backward(ctx, g):
        with torch.enable_grad():
            x = ctx.saved_tensors[0].detach().requires_grad_()
            (grad,) = torch.autograd.grad(_ScaledRankGradient.rank(x, ctx.beta), x, g)
        return 3 * grad, None


class PlantedSoftRank(RankingOperator):
    """A planted soft_rank-only operator: right values, gradient wrong by a factor 3."""

    capabilities = frozenset({SOFT_RANK})
    permutation_equivariant = True

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__(beta)

    def _soft_rank(self, x):
        return _ScaledRankGradient.apply(x, self.beta)


def test_planted_wrong_soft_rank_gradient_fails(tmp_path, monkeypatch):
    """The planted operator, registered through a config in a temporary config folder, fails the gradcheck of
    the contract (when only P-providing operators were gradchecked, it passed every test)."""
    module = types.ModuleType("diffrank_planted")
    module.PlantedSoftRank = PlantedSoftRank
    monkeypatch.setitem(sys.modules, module.__name__, module)
    (tmp_path / "operator").mkdir()
    (tmp_path / "operator" / "planted.yaml").write_text("_target_: diffrank_planted.PlantedSoftRank\nbeta: 1.0\n")
    monkeypatch.setenv("DIFFRANK_CONFIG_DIR", str(tmp_path))
    assert available() == ["planted"]
    op = load("planted")
    s = _untied(3, 7)
    ranks = s.argsort(dim=1, descending=True).argsort(dim=1).to(s.dtype) + 1
    torch.testing.assert_close(load("planted", beta=op.hard_beta).soft_rank(s), ranks, atol=1e-2, rtol=0)
    for capability in sorted(op.capabilities):
        with pytest.raises(AssertionError, match="PlantedSoftRank.soft_rank: wrong gradient"):
            gradcheck_capability(op, capability)


@pytest.mark.parametrize("name", [n for n in NAMES if PERMUTATION in _caps(n) and load(n).permutation_equivariant])
def test_permutation_equivariance(name):
    op = load(name)
    s = torch.randn(3, 6, dtype=torch.float64)
    perm = torch.randperm(6)
    torch.testing.assert_close(op(s[:, perm]), op(s)[:, :, perm], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", _with(TOPK_MEMBERSHIP))
def test_topk_membership(name):
    op = load(name)
    s = torch.randn(3, 8, dtype=torch.float64)
    m = op.topk_membership(s, [1, 3, 5])
    assert m.shape == (3, 3, 8) and m.dtype == torch.float64
    if op.sums_to_k:
        torch.testing.assert_close(m.sum(-1), torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64).expand(3, 3),
                                   atol=1e-4, rtol=1e-4)
    else:  # a per-item threshold (DFTopK): memberships in [0, 1], the sum only in the hard limit (below)
        assert ((m >= 0) & (m <= 1)).all()
    hard = load(name, beta=op.hard_beta).topk_membership(_untied(3, 8), [3])[:, 0]
    expect = torch.zeros(3, 8, dtype=torch.float64).scatter_(1, _untied(3, 8).topk(3, dim=1).indices, 1.0)
    assert (hard - expect).abs().max() < 1e-3


@pytest.mark.parametrize("name", _with(SOFT_SORT))
def test_soft_sort_limit(name):
    s = _untied(3, 7)
    out = load(name, beta=load(name).hard_beta).soft_sort(s)
    assert out.shape == (3, 7)
    torch.testing.assert_close(out, s.sort(dim=1, descending=True).values, atol=1e-3, rtol=0)


@pytest.mark.parametrize("name", _with(SOFT_RANK))
def test_soft_rank_limit(name):
    s = _untied(3, 7)
    out = load(name, beta=load(name).hard_beta).soft_rank(s)
    ranks = s.argsort(dim=1, descending=True).argsort(dim=1).to(s.dtype) + 1
    torch.testing.assert_close(out, ranks, atol=1e-2, rtol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_the_float32_result_cast_back(name, dtype):
    op = load(name)
    s = torch.randn(2, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    for cap, fn in _calls(op):
        out = fn(s)
        assert out.dtype == dtype and torch.isfinite(out.float()).all(), cap
        assert torch.equal(out, fn(s.float()).to(dtype)), f"{name} {cap}"


def test_integer_like_k_and_non_numeric_beta():
    """k as numpy.int64 (what an index into a numpy array gives) is an integer; beta='abc' names beta."""
    import numpy as np

    op = load("neuralsort")
    s = torch.randn(2, 5)
    torch.testing.assert_close(op.topk_membership(s, [np.int64(2)]), op.topk_membership(s, [2]))
    with pytest.raises(TypeError, match="k must be an integer"):
        op.topk_membership(s, [np.float64(2.0)])
    with pytest.raises(ValueError, match="beta .* got 'abc'"):
        load("neuralsort", beta="abc")


@pytest.mark.parametrize("name", NAMES)
def test_meta_device_scores_are_named(name):
    """Meta-device scores ended in torch's "Tensor.item() cannot be called on meta tensors"."""
    op = load(name)
    for _, fn in _calls(op):
        with pytest.raises(ValueError, match="meta device"):
            fn(torch.empty(2, 5, device="meta"))
