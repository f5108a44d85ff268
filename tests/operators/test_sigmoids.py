"""Relaxed-swap sigmoids: values by hand, limits, closed-form slopes, gradcheck, dtypes, errors."""

from __future__ import annotations

import math

import pytest
import torch

from diffrank.operators.sigmoids import SIGMOIDS, swap_slope, swap_weight

NAMES = list(SIGMOIDS)


def test_unknown_sigmoid_lists_known():
    with pytest.raises(ValueError, match="known sigmoids: logistic, logistic_phi, gaussian"):
        swap_weight(torch.zeros(1), 1.0, "tanh")


@pytest.mark.parametrize("name", NAMES)
def test_half_at_zero_and_limits(name):
    d = torch.tensor([0.0, 1e4, -1e4], dtype=torch.float64)
    a = swap_weight(d, 10.0, name, 0.25)
    assert a[0] == 0.5
    assert a[1] > 1 - 1e-3 and a[2] < 1e-3
    big = torch.linspace(-5, 5, 101, dtype=torch.float64)
    assert (swap_weight(big, 3.0, name, 0.5).diff() >= 0).all()  # increasing in d


def test_values_by_hand():
    d = torch.tensor([0.3], dtype=torch.float64)
    b = 2.0
    v = b * 0.3
    assert swap_weight(d, b, "logistic").item() == pytest.approx(1 / (1 + math.exp(-v)))
    assert swap_weight(d, b, "logistic_phi", 0.5).item() == pytest.approx(1 / (1 + math.exp(-b * 0.3 / 0.3 ** 0.5)))
    assert swap_weight(d, b, "gaussian").item() == pytest.approx(0.5 * (1 + math.erf(v / math.sqrt(2))))
    # code scale: reciprocal(β) = thesis f_R with β_thesis = β / 4 (thesis Eq. 3.22)
    bt = b / 4
    assert swap_weight(d, b, "reciprocal").item() == pytest.approx(0.5 * 2 * bt * 0.3 / (1 + 2 * bt * 0.3) + 0.5)
    assert swap_weight(d, b, "cauchy").item() == pytest.approx(math.atan(v) / math.pi + 0.5)
    assert swap_weight(d, b, "optimal").item() == pytest.approx(1 - 1 / (16 * v))  # v > 1/4 (thesis Eq. 3.24)
    assert swap_weight(-d, b, "optimal").item() == pytest.approx(1 / (16 * v))
    assert swap_weight(d / 10, b, "optimal").item() == pytest.approx(v / 10 + 0.5)


@pytest.mark.parametrize("name", NAMES)
def test_slope_matches_autograd(name):
    d = torch.linspace(-3, 3, 61, dtype=torch.float64)
    d = d[d.abs() > 1e-9].requires_grad_()
    (g,) = torch.autograd.grad(swap_weight(d, 1.7, name, 0.4).sum(), d)
    torch.testing.assert_close(swap_slope(d.detach(), 1.7, name, 0.4), g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(name):
    d = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: swap_weight(x, 2.5, name, 0.5), (d,))


@pytest.mark.parametrize("name", NAMES)
def test_no_nan_gradient_at_zero(name):
    d = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(swap_weight(d, 2.0, name, 0.5).sum(), d)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_evaluated_in_float32(name, dtype):
    d = torch.randn(50)
    a = swap_weight(d.to(dtype), 4.0, name, 0.5)
    assert a.dtype == dtype
    torch.testing.assert_close(a.float(), swap_weight(d.to(dtype).float(), 4.0, name, 0.5), atol=4e-3, rtol=0)
