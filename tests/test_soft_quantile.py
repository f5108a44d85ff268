"""``diffrank.functional.soft_quantile`` / ``soft_median``: torch.quantile's interpolation and shapes, its values in the
hard limit for every method with a soft sort (and exactly with ``hard=True``), gradchecks, clear errors for bad q."""

from __future__ import annotations

import pytest
import torch

import diffrank.functional as F
from diffrank.operators import available
from helpers import load_deterministic as load

SORTING = [name for name in available() if "soft_sort" in load(name).capabilities]
# Sinkhorn stops at a marginal tolerance, a non-smooth rule: gradchecked with a fixed number of iterations
FIXED = {"sinkhorn": {"tolerance": None, "max_iter": 60}, "gumbel_sinkhorn": {"tolerance": None, "max_iter": 60}}
LEVELS = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.7, 0.9, 1.0], dtype=torch.float64)


def _spaced(B=16, n=8, seed=0, dtype=torch.float64):
    """Scores spaced >= 0.5 apart (the operators' ``hard_beta`` contract), shuffled."""
    g = torch.Generator().manual_seed(seed)
    perms = torch.stack([torch.randperm(n, generator=g) for _ in range(B)]).to(dtype)
    return perms * 0.5 + torch.rand(B, n, generator=g, dtype=dtype) * 0.05


def test_every_sorting_method_is_covered():
    assert {"neuralsort", "softsort", "sinkhorn", "fast_soft_sort", "lapsum", "diffsort_bitonic",
            "relaxed_bubble_sort", "gumbel_sinkhorn", "neuralsort_stochastic"} <= set(SORTING)


@pytest.mark.parametrize("method", SORTING)
def test_large_beta_is_torch_quantile(method):
    """At 10 × the method's hard_beta the quantiles are within 1e-6 of torch.quantile (float64, n = 8, gaps >= 0.5:
    measured worst 2.2e-7, the Cauchy networks; 4e-13 Sinkhorn, <= 1e-15 the others); hard=True is torch.quantile to
    one rounding."""
    x = _spaced()
    beta = 10 * load(method).hard_beta
    want = torch.quantile(x, LEVELS, dim=-1)
    torch.testing.assert_close(F.soft_quantile(x, LEVELS, method=method, beta=beta), want, atol=1e-6, rtol=0)
    soft = F.soft_quantile(x, LEVELS, method=method, beta=1.0 / 8)  # far from hard: the test can fail
    assert (soft - want).abs().max() > 1e-2
    x32 = x.float()
    got = F.soft_quantile(x32, LEVELS.float(), method=method, beta=1.0, hard=True)
    # to one rounding: torch.quantile's vectorised lerp (fused multiply-add) rounds differently from torch.lerp
    torch.testing.assert_close(got, torch.quantile(x32, LEVELS.float(), dim=-1), atol=1e-6, rtol=1e-6)


def test_error_free_network_is_torch_quantile():
    x = _spaced(seed=2) * 3
    got = F.soft_median(x, method="diffsort_odd_even", beta=1.0, error_free=True)
    torch.testing.assert_close(got, torch.quantile(x, 0.5, dim=-1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("q", [0.3, torch.tensor(0.3), torch.tensor([0.0, 0.3, 1.0])])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_shapes_and_interpolation_are_torch_quantiles(q, keepdim, dim):
    x = torch.randn(3, 7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = torch.quantile(x, q.double() if isinstance(q, torch.Tensor) else q, dim=dim, keepdim=keepdim)
    got = F.soft_quantile(x, q, method="neuralsort", dim=dim, keepdim=keepdim, hard=True)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-15, rtol=1e-15)
    # the soft value is the same lerp of the soft-sorted values: interpolation checked by hand at q = 0.3, n = 7
    v = F.soft_sort(x, method="neuralsort", dim=1)  # h = 1.8: 0.2 v[1] + 0.8 v[2]
    torch.testing.assert_close(F.soft_quantile(x, 0.3, method="neuralsort", dim=1), 0.2 * v[:, 1] + 0.8 * v[:, 2])


def test_median_is_the_half_quantile():
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(F.soft_median(x, method="lapsum", beta=3.0), F.soft_quantile(x, 0.5, method="lapsum",
                                                                                              beta=3.0))
    torch.testing.assert_close(F.soft_median(x, method="softsort", hard=True, keepdim=True),
                               torch.quantile(x, 0.5, dim=-1, keepdim=True), atol=1e-15, rtol=1e-15)  # even n: mean


@pytest.mark.parametrize("method", SORTING)
def test_gradcheck(method):
    """float64 gradcheck in the scores and in q (scores spaced ~1/β apart: inside the soft regime)."""
    if not load(method).exact_gradient:
        pytest.skip(f"{method}: a Monte-Carlo gradient (tests/operators/test_perturbed.py)")
    beta = float(load(method).beta)
    x = (torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 2 / beta).requires_grad_()
    q = torch.tensor([0.3, 0.55], dtype=torch.float64, requires_grad=True)  # h = 1.2, 2.2: away from the kinks
    opts = FIXED.get(method, {})
    assert torch.autograd.gradcheck(lambda s, lv: F.soft_quantile(s, lv, method=method, **opts), (x, q))


def test_bad_q():
    x = torch.randn(2, 5)
    for bad in (-0.1, 1.5, float("nan"), torch.tensor([0.2, 1.01]), torch.tensor(float("nan"))):
        with pytest.raises(ValueError, match=r"q must lie in \[0, 1\]"):
            F.soft_quantile(x, bad, method="neuralsort")
    for bad in (torch.tensor([0, 1]), torch.tensor(True), True, "0.5", None, 1j):
        with pytest.raises(TypeError, match="q must be"):
            F.soft_quantile(x, bad, method="neuralsort")
    with pytest.raises(ValueError, match="0-d or a 1-d"):
        F.soft_quantile(x, torch.full((2, 2), 0.5), method="neuralsort")
    with pytest.raises(ValueError, match="soft_sort"):
        F.soft_quantile(x, 0.5, method="soft_topk")
    with pytest.raises(TypeError, match="x must be"):
        F.soft_quantile([1.0, 2.0], 0.5, method="neuralsort")
    # integer levels as Python numbers are fine (torch.quantile takes q = 0 / 1 as floats)
    torch.testing.assert_close(F.soft_quantile(x, 1, method="neuralsort", hard=True), x.max(-1).values)


def test_an_out_of_range_level_under_vmap_is_clamped_not_extrapolated():
    """Under vmap the range check of q cannot read it: a level of -0.5 gave a lerp with weight -2.5, a value below
    the row's minimum. h is clamped to [0, n - 1], so such a level gives the q = 0 (or q = 1) result, and NaN gives
    NaN; in range the result is unchanged."""
    torch.manual_seed(5)
    x = torch.randn(3, 6, dtype=torch.float64)
    q = torch.tensor([0.2, -0.5, 1.7], dtype=torch.float64)
    out = torch.func.vmap(lambda r, level: F.soft_quantile(r, level, method="neuralsort"))(x, q)
    eager = torch.stack([F.soft_quantile(x[i], level, method="neuralsort")
                         for i, level in enumerate((0.2, 0.0, 1.0))])
    torch.testing.assert_close(out, eager)
    assert x[1].min() <= out[1] and out[2] <= x[2].max()
    nan = torch.func.vmap(lambda r, level: F.soft_quantile(r, level, method="lapsum"))(
        x[:1], torch.tensor([float("nan")], dtype=torch.float64))
    assert nan.isnan().all()


def test_q_on_the_meta_device_is_named():
    """A meta-device q failed with torch's 'Cannot copy out of meta tensor; no data!'."""
    with pytest.raises(ValueError, match="q is on the meta device"):
        F.soft_quantile(torch.randn(2, 5), torch.empty(2, device="meta"), method="lapsum")
