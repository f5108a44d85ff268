"""diffrank.compat.torchsort: torchsort's README examples and a few of its properties through the adapter (its
own tests/test_ops.py also passes unchanged from a clone through the adapter), and parity with torchsort when it
is installed (``make torchsort``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import diffrank.compat.torchsort as torchsort

F64 = torch.float64
X = torch.tensor([[8, 0, 5, 3, 2, 1, 6, 7, 9]])  # torchsort README: an integer tensor


@pytest.fixture
def every_torch_warning():
    """torch's once-per-process warnings (TORCH_WARN_ONCE) given at every occurrence, so that a test sees them
    whatever ran before it."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def test_readme_values_and_integer_input():
    """README: soft_sort / soft_rank of an int64 tensor (promoted to the default float dtype, as torchsort's
    ``values * (1/ε)`` promotes it)."""
    out = torchsort.soft_sort(X, regularization_strength=1.0)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, torch.arange(9.0).view(1, 9) + 5 / 9, atol=1e-4, rtol=0)
    torch.testing.assert_close(torchsort.soft_sort(X, regularization_strength=0.1),
                               torch.tensor([[0.0, 1, 2, 3, 5, 6, 7, 8, 9]]))
    torch.testing.assert_close(torchsort.soft_rank(X), torch.tensor([[8.0, 1, 5, 4, 3, 2, 6, 7, 9]]))
    torch.testing.assert_close(torchsort.soft_rank(X, "kl"), torchsort.soft_rank(X.double(), "kl").float())


def test_readme_gradient_and_spearman():
    """README: ∂ soft_sort(x)[0, 0] / ∂x = 1/9 everywhere; the Spearman example's 0.8321 and its gradient."""
    x = torch.tensor([[8.0, 0, 5, 3, 2, 1, 6, 7, 9]], requires_grad=True)
    (g,) = torch.autograd.grad(torchsort.soft_sort(x)[0, 0], x)
    torch.testing.assert_close(g, torch.full((1, 9), 1 / 9))

    def spearmanr(pred, target, **kw):
        pred, target = torchsort.soft_rank(pred, **kw), torchsort.soft_rank(target, **kw)
        pred = pred - pred.mean()
        pred = pred / pred.norm()
        target = target - target.mean()
        target = target / target.norm()
        return (pred * target).sum()

    pred = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], requires_grad=True)
    spearman = spearmanr(pred, torch.tensor([[5.0, 6.0, 7.0, 8.0, 7.0]]))
    torch.testing.assert_close(spearman, torch.tensor(0.8321), atol=1e-4, rtol=0)
    (g,) = torch.autograd.grad(spearman, pred)
    torch.testing.assert_close(g, torch.tensor([[-5.5470e-02, 0.0, 5.5470e-02, 1.1094e-01, -1.1094e-01]]), atol=1e-4,
                               rtol=0)


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_properties(reg):
    """Ascending; the hard ranks / sort as ε → 0; l2 keeps the row sums (ranks n(n+1)/2, sort Σ x); monotone."""
    x = torch.randn(4, 12, dtype=F64, generator=torch.Generator().manual_seed(0))
    hard_ranks = x.argsort(1).argsort(1).to(F64) + 1
    torch.testing.assert_close(torchsort.soft_rank(x, reg, 1e-3), hard_ranks)
    torch.testing.assert_close(torchsort.soft_sort(x, reg, 1e-3), x.sort(1).values)
    for eps in (0.3, 1.0, 5.0):
        s = torchsort.soft_sort(x, reg, eps)
        assert (s[:, 1:] >= s[:, :-1] - 1e-12).all()
        if reg == "l2":
            torch.testing.assert_close(torchsort.soft_rank(x, reg, eps).sum(1), torch.full((4,), 78.0, dtype=F64))
            torch.testing.assert_close(s.sum(1), x.sum(1))


def test_errors_and_options():
    """torchsort's messages for a non-2-D tensor and an unknown regularization; ε <= 0 and NaN raise; a tensor ε
    that requires grad is learnable (β = 1/ε)."""
    with pytest.raises(ValueError, match="2d-tensor"):
        torchsort.soft_rank(torch.randn(5))
    with pytest.raises(ValueError, match="'l2' or 'kl'"):
        torchsort.soft_sort(torch.randn(2, 5), regularization="l1")
    with pytest.raises(ValueError, match="regularization_strength"):
        torchsort.soft_rank(torch.randn(2, 5), regularization_strength=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        torchsort.soft_rank(torch.tensor([[1.0, float("nan")]]))
    eps = torch.tensor(0.5, dtype=F64, requires_grad=True)
    x = torch.randn(2, 6, dtype=F64, generator=torch.Generator().manual_seed(1))
    assert torch.autograd.gradcheck(lambda e: torchsort.soft_rank(x, "l2", e), (eps,))
    assert torch.autograd.gradcheck(lambda e: torchsort.soft_sort(x, "kl", e), (eps,))
    half = torchsort.soft_rank(x.half())
    assert half.dtype == torch.float16


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_parity_with_torchsort(reg):
    """Values and gradients equal torchsort's, float64 and float32, continuous and integer-valued (tied) scores."""
    peer = pytest.importorskip("torchsort")
    gen = torch.Generator().manual_seed(2)
    for x in (torch.randn(8, 30, dtype=F64, generator=gen) * 3, torch.randint(0, 6, (8, 30), generator=gen).to(F64)):
        g = torch.randn(8, 30, dtype=F64, generator=gen)
        for eps in (0.1, 1.0, 10.0):
            for name in ("soft_rank", "soft_sort"):
                a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
                ya, yb = getattr(torchsort, name)(a, reg, eps), getattr(peer, name)(b, reg, eps)
                torch.testing.assert_close(ya, yb, atol=1e-9, rtol=1e-9)
                torch.testing.assert_close(torch.autograd.grad(ya, a, g)[0], torch.autograd.grad(yb, b, g)[0],
                                           atol=1e-9, rtol=1e-9)
                torch.testing.assert_close(getattr(torchsort, name)(x.float(), reg, eps),
                                           getattr(peer, name)(x.float(), reg, eps), atol=1e-4, rtol=1e-5)


def test_benchmark_suite_smoke(monkeypatch):
    """The ``torchsort_parity`` benchmark suite's table: one row per (function, B, n), the ratio torchsort / ours."""
    import argparse

    from diffrank.benchmark import DEFAULT_SUITES, torchsort_parity

    assert "torchsort_parity" in DEFAULT_SUITES
    monkeypatch.setattr(torchsort_parity, "BATCHES", (2,))
    monkeypatch.setattr(torchsort_parity, "SIZES", (50,))
    [(title, rows)] = torchsort_parity.run(argparse.Namespace(quick=True, max_seconds=0.05))
    assert "torchsort" in title and [(r["function"], r["B"], r["n"]) for r in rows] == [("soft_rank", 2, 50),
                                                                                        ("soft_sort", 2, 50)]
    for r in rows:
        assert r["ratio (torchsort / ours)"] == "-" or float(r["ratio (torchsort / ours)"]) > 0


def test_complex_values_are_refused_rather_than_ranked_by_their_real_parts():
    """Promoting a complex tensor to float keeps only its real parts (torch merely warns), so [1+5j, 2-9j, 3+0j] was
    ranked as [1, 2, 3]; complex values raise, naming 'values'. Integer and bool values are still promoted."""
    with pytest.raises(TypeError, match=r"'values' must be real .*complex64"):
        torchsort.soft_rank(torch.tensor([[1 + 5j, 2 - 9j, 3 + 0j]]))
    with pytest.raises(TypeError, match="'values' must be real"):
        torchsort.soft_sort(torch.tensor([[1 + 5j, 2 - 9j]], dtype=torch.complex128))
    with pytest.raises(TypeError, match="'values' must be a torch.Tensor"):
        torchsort.soft_rank([[1.0, 2.0]])
    assert torchsort.soft_rank(torch.tensor([[True, False]])).dtype == torch.get_default_dtype()


@pytest.mark.parametrize("eps", [
    float("inf"), float("nan"), -1.0, "2", True, 1e-320,
    torch.tensor([1.0, 2.0]), np.array([1.0, 2.0]), torch.tensor(1.0, device="meta"), torch.tensor(1 + 0j),
    torch.tensor(-1.0, dtype=F64, requires_grad=True), torch.tensor(0.0, dtype=F64, requires_grad=True),
    torch.tensor(float("nan"), dtype=F64, requires_grad=True),
], ids=lambda e: repr(e).replace(" ", ""))
@pytest.mark.parametrize("function", ["soft_rank", "soft_sort"])
def test_a_bad_regularization_strength_is_named_as_such(function, eps):
    """The caller passes ε, never a β: every refusal names regularization_strength (ε = inf was reported as 'beta
    (inverse temperature) ... got 0.0', a tensor ε = 0 as '... got inf', a two-element tensor ε as torch's 'only one
    element tensors can be converted')."""
    with pytest.raises(ValueError, match=r"regularization_strength \(ε = 1/β\)") as e:
        getattr(torchsort, function)(X.double(), regularization_strength=eps)
    assert "beta" not in str(e.value)


def test_one_element_regularization_strengths_are_read_as_numbers():
    """A NumPy scalar or one-element array ε, or a one-element tensor, is that number."""
    want = torchsort.soft_rank(X, regularization_strength=0.5)
    for eps in (np.float64(0.5), np.array([0.5]), torch.tensor([0.5]), torch.tensor(0.5, dtype=F64)):
        torch.testing.assert_close(torchsort.soft_rank(X, regularization_strength=eps), want)


def test_a_learnable_regularization_strength_converts_no_tensor_that_requires_grad(every_torch_warning):
    """A tensor ε that requires grad gets its gradient without torch's 'Converting a tensor with requires_grad=True to
    a scalar' warning (which the operator's float(β) gave; it fails a run under -W error)."""
    eps = torch.tensor(0.7, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchsort.soft_rank(X.double(), regularization_strength=eps).pow(2).sum().backward()
        torchsort.soft_sort(X.double(), "kl", regularization_strength=eps).sum().backward()
    assert eps.grad is not None and torch.isfinite(eps.grad)
