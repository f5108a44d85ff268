"""Hessian Newton losses through the sorting networks (thesis Table 7.3): the fused network's double backward
(exact) and the plain autograd ops of ``twice_differentiable=True`` give the same Hessians, equal to central
differences of the fused network's gradient."""

from __future__ import annotations

import pytest
import torch

from diffrank.losses.newton import NewtonLoss, per_sample_derivatives
from diffrank.losses.sorting import SortingBCELoss
from diffrank.operators.sorting_network import ComparatorNetwork


@pytest.mark.parametrize("sigmoid, network", [("cauchy", "odd_even"), ("logistic", "odd_even"),
                                              ("logistic_phi", "bitonic")])
def test_hessian_of_the_twice_differentiable_network_equals_differences_of_the_fused_gradient(sigmoid, network):
    torch.manual_seed(0)
    y, values = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    fused = SortingBCELoss(ComparatorNetwork(beta=4.0, sigmoid=sigmoid, network=network))
    plain = SortingBCELoss(ComparatorNetwork(beta=4.0, sigmoid=sigmoid, network=network, twice_differentiable=True))
    value, grads, hessians = per_sample_derivatives(plain, y, values)
    fused_value, fused_grads, fused_hessians = per_sample_derivatives(fused, y, values)
    torch.testing.assert_close(value, fused_value)
    torch.testing.assert_close(grads, fused_grads)
    torch.testing.assert_close(fused_hessians, hessians)
    h = 1e-5
    for j in range(5):
        e = torch.zeros_like(y)
        e[:, j] = h
        up = per_sample_derivatives(fused, y + e, values, hessian=False)[1]
        down = per_sample_derivatives(fused, y - e, values, hessian=False)[1]
        torch.testing.assert_close(hessians[:, :, j], (up - down) / (2 * h), atol=1e-5, rtol=1e-4)
    assert hessians.abs().max() > 1e-3  # a real curvature, not a zero Hessian passing the check
    for loss_fn in (fused, plain):
        assert torch.isfinite(NewtonLoss(loss_fn, "hessian", 0.01)(y.clone().requires_grad_(True), values))
