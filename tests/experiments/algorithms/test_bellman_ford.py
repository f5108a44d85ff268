"""Relaxed Bellman-Ford (thesis §2.4): hard limit = Dijkstra, gradients, loops, T-conorms, errors."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.algorithms.bellman_ford import (
    RelaxedBellmanFord,
    relaxed_distances,
    relaxed_trace_back,
    t_conorm,
)
from diffrank.experiments.algorithms.dijkstra import shortest_paths


def _grids(b: int, k: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    # continuous costs: ties between optimal paths have probability 0, so the optimum is unique
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(b, k, k, generator=g, dtype=dtype) * 9 + 0.5)


@pytest.mark.parametrize("loop", ["for", pytest.param("while", marks=pytest.mark.slow)])
def test_converges_to_exact_path_as_beta_grows(loop):
    costs = _grids(20, 10)
    exact = shortest_paths(costs)
    errors = []
    for beta in (1.0, 3.0, 10.0, 30.0, 100.0):
        path = RelaxedBellmanFord(beta=beta, sweeps=30, loop=loop, while_beta=50.0).path(costs)
        errors.append(float((path - exact).abs().sum((1, 2)).mean()))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.25
    hard = RelaxedBellmanFord(beta=100.0, sweeps=30, loop=loop, while_beta=50.0).path(costs)
    assert torch.equal(hard.round(), exact)


def test_distances_match_exact_in_the_hard_limit():
    costs = _grids(5, 6, seed=1)
    d, pred = relaxed_distances(costs, beta=1e4, sweeps=40)
    from diffrank.experiments.algorithms.dijkstra import shortest_paths_numpy

    _, exact = shortest_paths_numpy(costs.numpy(), return_distances=True)
    # our source is reset to 0: its cost is not counted
    expected = torch.from_numpy(exact) - costs[:, :1, :1]
    assert torch.allclose(d, expected, atol=1e-6)
    assert torch.allclose(pred.sum(1), torch.ones(5, 6, 6, dtype=torch.float64))


@pytest.mark.parametrize("loop,conorm", [("for", "probabilistic"),
                                         pytest.param("while", "probabilistic", marks=pytest.mark.slow),
                                         pytest.param("for", "hamacher", marks=pytest.mark.slow),
                                         pytest.param("while", "hamacher", marks=pytest.mark.slow)])
def test_gradcheck_float64_4x4(loop, conorm):
    costs = _grids(1, 4, seed=2).requires_grad_()
    kw = dict(beta=1.0, sweeps=5, steps=6, loop=loop, t_conorm=conorm, p=3.0, while_beta=5.0)
    assert torch.autograd.gradcheck(RelaxedBellmanFord(**kw).path, (costs,), eps=1e-6, atol=1e-5)
    labels = shortest_paths(costs.detach().flip(-1))
    a = RelaxedBellmanFord(loss="l2", **kw)  # the norm: the loss with the most delicate gradient
    assert torch.autograd.gradcheck(lambda c: a.loss(c, labels), (costs,), eps=1e-6, atol=1e-5)


def test_float32_gradients_finite_on_12x12():
    costs = _grids(8, 12, dtype=torch.float32).requires_grad_()
    alg = RelaxedBellmanFord(beta=10.0, sweeps=25)
    loss = alg.loss(costs, shortest_paths(costs.detach().flip(-1)))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(costs.grad).all()
    assert costs.grad.abs().sum() > 0


def test_while_equals_for_when_the_for_loop_is_long_enough():
    costs = _grids(20, 8, seed=3)
    exact = shortest_paths(costs)
    longest = int(exact.sum((1, 2)).max())
    kw = dict(beta=200.0, sweeps=30)
    p_for = RelaxedBellmanFord(loop="for", steps=longest + 5, **kw).path(costs)
    p_while = RelaxedBellmanFord(loop="while", steps=60, while_beta=60.0, **kw).path(costs)
    assert torch.equal(p_for.round(), exact)
    assert torch.allclose(p_while, p_for, atol=1e-3)
    # a for loop that stops short misses cells near the source; the while loop does not
    p_short = RelaxedBellmanFord(loop="for", steps=longest - 2, **kw).path(costs)
    assert not torch.allclose(p_short, exact, atol=0.5)


@pytest.mark.parametrize("conorm", ["probabilistic", "hamacher", "yager1"])
@pytest.mark.parametrize("loop", ["for", "while"])
@pytest.mark.parametrize("beta", [0.1, 2.0, 50.0])
def test_path_values_in_unit_interval(conorm, loop, beta):
    path = RelaxedBellmanFord(beta=beta, sweeps=25, loop=loop, t_conorm=conorm, p=5.0).path(_grids(6, 12))
    assert path.shape == (6, 12, 12)
    assert float(path.min()) >= 0.0 and float(path.max()) <= 1.0
    assert torch.isfinite(path).all()
    # the goal is on the path (the while loop's zero-iteration term, weight σ(-β_while/2), lacks it)
    assert float(path[:, -1, -1].min()) > 1 - 1e-4


def test_t_conorms_by_hand():
    a, b = torch.tensor([0.5, 0.0, 1.0, 0.7]), torch.tensor([0.5, 0.3, 0.4, 0.6])
    assert torch.allclose(t_conorm(a, b), torch.tensor([0.75, 0.3, 1.0, 0.88]))
    assert torch.allclose(t_conorm(a, b, "hamacher", 1.0), t_conorm(a, b))  # p = 1: probabilistic sum
    assert torch.allclose(t_conorm(a, b, "hamacher", 2.0), (a + b) / (1 + a * b))  # p = 2: Einstein sum
    assert torch.allclose(t_conorm(a, b, "yager1"), torch.tensor([1.0, 0.3, 1.0, 1.0]))
    with pytest.raises(ValueError, match="T-conorm"):
        t_conorm(a, b, "max")
    with pytest.raises(ValueError, match="p > 0"):
        t_conorm(a, b, "hamacher", 0.0)


def test_losses_by_hand():
    costs = _grids(3, 5, seed=4)
    labels = shortest_paths(costs.flip(-2))  # another path: a non-zero loss
    alg = RelaxedBellmanFord(beta=2.0, sweeps=10)
    diff = (alg.path(costs) - labels).flatten(1)
    for kind, expected in (("l1", diff.abs().sum(1).mean()), ("l2sq", diff.pow(2).sum(1).mean()),
                           ("l2", diff.pow(2).sum(1).sqrt().mean())):
        got = RelaxedBellmanFord(beta=2.0, sweeps=10, loss=kind).loss(costs, labels)
        assert torch.allclose(got, expected)
    exact = RelaxedBellmanFord(beta=1e3, sweeps=10, loss="l2").loss(costs, shortest_paths(costs))
    assert float(exact) < 1e-3


def test_trace_back_of_a_hand_made_pointer_field():
    # 3x3, every cell points to its upper-left neighbour where it has one: the diagonal path
    pred = torch.zeros(1, 9, 3, 3)
    pred[0, 0, 1:, 1:] = 1.0   # offset (-1, -1)
    pred[0, 1, 1:, 0] = 1.0    # first column: up
    pred[0, 3, 0, 1:] = 1.0    # first row: left
    pred[0, 4, 0, 0] = 1.0     # the source stays
    path = relaxed_trace_back(pred, steps=5)
    assert torch.equal(path[0], torch.eye(3))


def test_errors():
    alg = RelaxedBellmanFord()
    with pytest.raises(ValueError, match=">= 0"):
        alg.path(-torch.ones(1, 4, 4))
    with pytest.raises(ValueError, match="finite"):
        alg.path(torch.full((1, 4, 4), float("nan")))
    with pytest.raises(ValueError, match="shape"):
        alg.path(torch.ones(4, 4))
    with pytest.raises(ValueError, match="too large"):
        alg.path(torch.full((1, 4, 4), 1e9))
    with pytest.raises(ValueError, match="differ"):
        alg.loss(torch.ones(1, 4, 4), torch.ones(1, 5, 5))
    for kwargs, msg in (({"loss": "l3"}, "loss"), ({"loop": "until"}, "loop"), ({"t_conorm": "max"}, "T-conorm"),
                        ({"beta": 0.0}, "beta"), ({"sweeps": 0}, "sweeps"),
                        ({"t_conorm": "hamacher", "p": -1.0}, "p > 0")):
        with pytest.raises(ValueError, match=msg):
            RelaxedBellmanFord(**kwargs)
