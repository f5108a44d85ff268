"""The Warcraft algorithms of thesis chapter 7: stochastic smoothing of the loss / of the algorithm, RESGRO with
the exact path's Hamming distance, the perturbed optimizer's own derivatives, and Newton losses on top."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.algorithms.bellman_ford import RelaxedBellmanFord
from diffrank.experiments.algorithms.dijkstra import shortest_paths
from diffrank.experiments.algorithms.newton import AlgorithmLoss, NewtonAlgorithm, with_newton
from diffrank.experiments.algorithms.perturbed import PerturbedFenchelYoung
from diffrank.experiments.algorithms.sampling import (
    ResgroDijkstra,
    SmoothedAlgorithmDijkstra,
    SmoothedLossDijkstra,
    exact_paths,
    per_map_loss,
)


def _maps(b=4, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    costs = torch.rand(b, k, k, generator=g, dtype=torch.float64) * 5 + 0.1
    labels = shortest_paths(torch.rand(b, k, k, generator=g, dtype=torch.float64) * 5 + 0.1)
    return costs, labels


def test_smoothed_loss_with_tiny_noise_is_the_hamming_distance_of_the_exact_path():
    costs, labels = _maps()
    value = SmoothedLossDijkstra(samples=5, sigma=1e-9).loss(costs, labels)
    hamming = (shortest_paths(costs) - labels).abs().flatten(1).sum(1).mean()
    assert hamming > 0 and value.item() == pytest.approx(hamming.item())


def test_smoothed_loss_gradient_is_its_per_map_estimate():
    costs, labels = _maps()
    alg = SmoothedLossDijkstra(samples=7, sigma=0.5)
    leaf = costs.clone().requires_grad_(True)
    torch.manual_seed(3)
    alg.loss(leaf, labels).backward()
    torch.manual_seed(3)
    _, grads, hessians = alg.per_sample_derivatives(costs.flatten(1), labels, hessian=True)
    torch.testing.assert_close(leaf.grad.flatten(1) * len(costs), grads)
    assert hessians.shape == (4, 25, 25) and torch.allclose(hessians, hessians.transpose(1, 2))


def test_smoothed_algorithm_with_tiny_noise_is_the_exact_path():
    costs, labels = _maps()
    alg = SmoothedAlgorithmDijkstra(samples=4, sigma=1e-9, loss="l2sq")
    leaf = costs.clone().requires_grad_(True)
    torch.testing.assert_close(alg.path(leaf).detach(), shortest_paths(costs))
    loss = alg.loss(leaf, labels)
    assert loss.item() == pytest.approx(per_map_loss(shortest_paths(costs), labels, "l2sq").mean().item())
    loss.backward()
    assert leaf.grad.shape == costs.shape and torch.isfinite(leaf.grad).all()


def test_negative_candidate_costs_are_clamped_for_dijkstra():
    costs = -torch.ones(1, 3, 3)
    assert exact_paths(costs).sum() >= 2  # a path from corner to corner on all-zero costs


@pytest.mark.parametrize("subset_size, sets", [(None, None), (3, 5)])
def test_resgro_target_is_the_best_candidate_by_hamming(subset_size, sets):
    """One-set: c − B·∇ is the candidate whose exact path is closest to the label. Bootstrapped: the mean of the
    winners of random K-subsets, which never beats the best single candidate's Hamming distance."""
    costs, labels = _maps(b=3)
    m, sigma = 6, 1.5
    alg = ResgroDijkstra(samples=m, subset_size=subset_size, sets=sets, sigma=sigma)
    leaf = costs.clone().requires_grad_(True)
    torch.manual_seed(5)
    alg.loss(leaf, labels).backward()
    target = costs - len(costs) * leaf.grad
    torch.manual_seed(5)
    cands = costs.unsqueeze(0) + sigma * torch.randn((m, *costs.shape), dtype=costs.dtype)
    hamming = (exact_paths(cands.flatten(0, 1)).view_as(cands) - labels).abs().flatten(2).sum(2)  # (M, B)
    if subset_size is None:
        best = cands[hamming.argmin(0), torch.arange(3)]
        torch.testing.assert_close(target, best)
    else:
        distance = ((target.unsqueeze(0) - cands).flatten(2).norm(dim=2))  # the target is a mean of candidates
        assert (distance.min(0).values < sigma * 5 * 5).all()
        assert hamming.min(0).values.sum() <= hamming.float().mean(0).sum()


def test_resgro_with_the_label_as_exact_path_keeps_the_costs():
    costs, _ = _maps()
    loss = ResgroDijkstra(samples=4, sigma=1e-9).loss(costs, shortest_paths(costs))
    assert loss.item() < 1e-15


def test_fenchel_young_derivatives_are_the_losses_and_symmetric():
    costs, labels = _maps(b=3, k=4)
    po = PerturbedFenchelYoung(sigma=0.7, samples=5)
    leaf = costs.clone().requires_grad_(True)
    torch.manual_seed(11)
    value = po.loss(leaf, labels)
    value.backward()
    torch.manual_seed(11)
    v, grads, hessians = po.per_sample_derivatives(costs.flatten(1), labels, hessian=True)
    assert v.item() == pytest.approx(value.item())
    torch.testing.assert_close(grads, leaf.grad.flatten(1) * 3)
    torch.testing.assert_close(hessians, hessians.transpose(1, 2))
    with pytest.raises(ValueError, match="k\\*k"):
        po.per_sample_derivatives(costs, labels)


def test_fenchel_young_hessian_is_unbiased_for_the_jacobian_of_the_perturbed_path():
    """E[y(θ + σZ) Zᵀ] / σ is the Jacobian of y_σ (Berthet et al. Prop. 3.1): its action on a direction v matches
    the central difference of y_σ along v, both estimated from many draws (common random numbers)."""
    torch.manual_seed(0)
    costs, labels = _maps(b=1, k=3, seed=2)
    po = PerturbedFenchelYoung(sigma=1.0, samples=40000)
    _, _, h = po.per_sample_derivatives(costs.flatten(1), labels, hessian=True)
    v = torch.zeros(9, dtype=costs.dtype)
    v[4] = 1.0  # the centre cell's cost
    eps = 0.3
    g = torch.Generator().manual_seed(1)
    z = torch.randn(40000, 9, generator=g, dtype=costs.dtype)

    def y_sigma(c):  # E[path(c − σZ)] = y_σ(θ = −c), with the same draws
        return exact_paths((c.flatten() - z).view(-1, 3, 3)).flatten(1).mean(0)

    # ∂y_σ/∂θ · v = −∂y_σ/∂c · v; the Hessian in c is ∇²_θ F = ∂y_σ/∂θ
    fd = -(y_sigma(costs + eps * v.view(1, 3, 3)) - y_sigma(costs - eps * v.view(1, 3, 3))) / (2 * eps)
    torch.testing.assert_close(h[0] @ v, fd, atol=0.03, rtol=0)


def test_fisher_newton_step_on_the_relaxed_bellman_ford_equals_a_hand_computed_one():
    costs, labels = _maps(b=3, k=4)
    alg = RelaxedBellmanFord(beta=2.0, sweeps=8)
    lam = 0.5
    grads = []
    for i in range(3):  # per-map gradients, one map at a time
        leaf = costs[i:i + 1].clone().requires_grad_(True)
        alg.loss(leaf, labels[i:i + 1]).backward()
        grads.append(leaf.grad.flatten())
    g = torch.stack(grads)
    fisher = g.T @ g / 3 + lam * torch.eye(16, dtype=g.dtype)
    z = costs.flatten(1) - torch.linalg.solve(fisher, g.T).T
    leaf = costs.clone().requires_grad_(True)
    newton = NewtonAlgorithm(alg, "fisher", tikhonov=lam)
    value = newton.loss(leaf, labels)
    value.backward()
    torch.testing.assert_close(leaf.grad.flatten(1), (costs.flatten(1) - z) / 3)
    assert value.item() == pytest.approx((0.5 * (z - costs.flatten(1)).pow(2).sum(1)).mean().item())
    with torch.no_grad():  # validation: the algorithm's own loss
        assert newton.loss(costs, labels).item() == pytest.approx(alg.loss(costs, labels).item())


def test_with_newton_and_its_refusals():
    alg = SmoothedAlgorithmDijkstra(samples=2)
    assert with_newton(alg, "none") is alg
    wrapped = with_newton(alg, "hessian", 1.0, _target_="ignored")
    assert isinstance(wrapped, NewtonAlgorithm) and wrapped.name == "smoothed_algorithm+hessian"
    costs, labels = _maps(b=2, k=4)
    with pytest.raises(ValueError, match="fisher"):  # no second derivatives through the smoothed algorithm
        wrapped.loss(costs.clone().requires_grad_(True), labels)
    assert torch.isfinite(with_newton(alg, "fisher", 1.0).loss(costs.clone().requires_grad_(True), labels))
    with pytest.raises(ValueError, match="variant"):
        with_newton(alg, "newton", 1.0)
    with pytest.raises(ValueError, match="loss\\(costs, true_paths\\)"):
        AlgorithmLoss(object())
    with pytest.raises(ValueError, match="k\\*k"):
        AlgorithmLoss(alg)(costs.flatten(1)[:, :5], labels)


@pytest.mark.parametrize("alg", [SmoothedLossDijkstra(samples=2), SmoothedAlgorithmDijkstra(samples=2),
                                 ResgroDijkstra(samples=2)], ids=lambda a: a.name)
def test_bad_inputs_raise(alg):
    costs, labels = _maps(b=2, k=4)
    with pytest.raises(ValueError, match="differ in shape"):
        alg.loss(costs, labels[:, :3])
    bad = costs.clone()
    bad[0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        alg.loss(bad, labels)
    with pytest.raises(ValueError):
        type(alg)(samples=0)
