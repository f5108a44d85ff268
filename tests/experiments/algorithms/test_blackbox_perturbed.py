"""Blackbox Dijkstra (Vlastelica et al. 2020) and perturbed Fenchel-Young (Berthet et al. 2020): gradients and
losses against hand computations on a 3x3 grid."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.algorithms.blackbox import BlackboxDijkstra, blackbox_shortest_paths, hamming_loss
from diffrank.experiments.algorithms.dijkstra import shortest_paths
from diffrank.experiments.algorithms.perturbed import PerturbedFenchelYoung, fenchel_young_loss, perturbed_paths

# 3x3 costs whose optimum is the diagonal (cost 3); with the centre expensive the unique optimum becomes
# (0,0) (0,1) (1,2) (2,2) (cost 4; the other detour (1,0) (2,1) costs 5)
COSTS = torch.tensor([[[1.0, 1.0, 2.0], [1.0, 1.0, 1.0], [3.0, 2.0, 1.0]]], dtype=torch.float64)
DIAG = torch.eye(3, dtype=torch.float64).unsqueeze(0)
DETOUR = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]], dtype=torch.float64)


def test_hand_example_is_what_dijkstra_says():
    assert torch.equal(shortest_paths(COSTS), DIAG)
    raised = COSTS.clone()
    raised[0, 1, 1] = 6.0
    assert torch.equal(shortest_paths(raised), DETOUR)


def test_blackbox_forward_and_backward_by_hand():
    costs = COSTS.clone().requires_grad_()
    y = blackbox_shortest_paths(costs, lam=5.0)
    assert torch.equal(y, DIAG)
    g = torch.zeros_like(COSTS)
    g[0, 1, 1] = 1.0   # dL/dy: the centre on the path costs loss -> c' = c + 5·g puts 6 on the centre
    y.backward(g)
    # -(y - y_λ)/λ with y_λ = DETOUR
    expected = -(DIAG - DETOUR) / 5.0
    assert torch.allclose(costs.grad, expected)
    assert costs.grad[0, 1, 1] == pytest.approx(-0.2) and costs.grad[0, 0, 1] == pytest.approx(0.2)


def test_blackbox_zero_gradient_when_perturbation_does_not_change_the_path():
    costs = COSTS.clone().requires_grad_()
    g = torch.zeros_like(COSTS)
    g[0, 1, 1] = 0.1   # c'(centre) = 1.5: the diagonal (3.5) still beats the detour (4)
    blackbox_shortest_paths(costs, lam=5.0).backward(g)
    assert torch.equal(costs.grad, torch.zeros_like(COSTS))


def test_hamming_loss_by_hand():
    pred = torch.tensor([[[1.0, 1.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    label = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 1.0]]])
    assert float(hamming_loss(pred, label)) == pytest.approx(1.0)  # one wrong cell in each map
    assert float(hamming_loss(torch.full((1, 2, 2), 0.5), label[:1])) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="differ"):
        hamming_loss(pred, label[:, :1])


def test_blackbox_loss_gradient_is_the_formula_with_the_hamming_gradient():
    costs = COSTS.clone().requires_grad_()
    BlackboxDijkstra(lam=5.0).loss(costs, DETOUR).backward()
    # dL/dŷ = 1 - 2y (B = 1): +1 on the centre (off the label), -1 on the detour cells
    perturbed = torch.clamp(COSTS + 5.0 * (1 - 2 * DETOUR), min=0.0)
    expected = -(DIAG - shortest_paths(perturbed)) / 5.0
    assert torch.allclose(costs.grad, expected)
    assert costs.grad.abs().sum() > 0


def test_blackbox_errors():
    with pytest.raises(ValueError, match="lam"):
        BlackboxDijkstra(lam=0.0)
    with pytest.raises(ValueError, match="lam"):
        blackbox_shortest_paths(COSTS, lam=-1.0)


def test_fenchel_young_small_noise_by_hand():
    # σ -> 0: y_σ = y*(c) = DIAG; loss = cost(label) - cost(optimum) = 4 - 3; ∂L/∂c = label - y*
    costs = COSTS.clone().requires_grad_()
    loss = fenchel_young_loss(costs, DETOUR, sigma=1e-7, samples=4)
    assert float(loss.detach()) == pytest.approx(1.0, abs=1e-5)
    loss.backward()
    assert torch.allclose(costs.grad, DETOUR - DIAG)


def test_fenchel_young_zero_loss_and_gradient_at_the_optimum():
    costs = COSTS.clone().requires_grad_()
    loss = fenchel_young_loss(costs, DIAG, sigma=1e-7, samples=2)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-5)
    assert torch.equal(costs.grad, torch.zeros_like(COSTS))


def test_fenchel_young_gradient_is_label_minus_perturbed_mean():
    g = torch.Generator().manual_seed(0)
    costs = (torch.rand(4, 5, 5, generator=g, dtype=torch.float64) * 3).requires_grad_()
    labels = shortest_paths(costs.detach().flip(-1))
    torch.manual_seed(7)
    loss = fenchel_young_loss(costs, labels, sigma=1.0, samples=10)
    loss.backward()
    torch.manual_seed(7)
    y_sigma, f_sigma = perturbed_paths(costs, sigma=1.0, samples=10)
    assert torch.allclose(costs.grad, (labels - y_sigma) / 4)
    assert torch.allclose(loss, (f_sigma + (costs.detach() * labels).sum((1, 2))).mean())
    # y_σ is a mean of paths: in [0, 1], start and goal always 1, not a single path for σ = 1
    assert float(y_sigma.min()) >= 0 and float(y_sigma.max()) <= 1
    assert torch.allclose(y_sigma[:, 0, 0], torch.ones(4, dtype=torch.float64))
    assert ((y_sigma > 0) & (y_sigma < 1)).any()
    # F_σ ≥ max_y ⟨θ, y⟩ (Jensen): the loss is >= cost(label) - cost(optimum) ≥ 0 in expectation; here per batch
    assert float(loss.detach()) >= 0


def test_perturbed_object_and_errors():
    alg = PerturbedFenchelYoung(sigma=0.5, samples=3)
    assert alg.name == "perturbed" and alg.samples == 3
    with pytest.raises(ValueError, match="sigma"):
        PerturbedFenchelYoung(sigma=0.0)
    with pytest.raises(ValueError, match="samples"):
        PerturbedFenchelYoung(samples=0)
    with pytest.raises(ValueError, match="differ"):
        alg.loss(COSTS, DIAG[:, :2])
    with pytest.raises(ValueError, match="finite"):
        alg.loss(torch.full_like(COSTS, float("nan")), DIAG)
