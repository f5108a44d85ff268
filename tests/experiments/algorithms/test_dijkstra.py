"""Exact grid Dijkstra (diffrank.experiments.algorithms.dijkstra) against scipy's shortest_path on the same graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from diffrank.experiments.algorithms.dijkstra import path_costs, shortest_paths, shortest_paths_numpy


def _grid_graph(c: np.ndarray) -> csr_matrix:
    """The 8-neighbourhood digraph of one (k, k) grid with weight c[v] on every edge u -> v."""
    k = c.shape[0]
    rows, cols, weights = [], [], []
    for r in range(k):
        for q in range(k):
            for dr in (-1, 0, 1):
                for dq in (-1, 0, 1):
                    r2, q2 = r + dr, q + dq
                    if (dr or dq) and 0 <= r2 < k and 0 <= q2 < k:
                        rows.append(r * k + q)
                        cols.append(r2 * k + q2)
                        # csgraph reads explicit zeros as "no edge": a tiny positive weight keeps zero costs
                        weights.append(max(float(c[r2, q2]), 1e-300))
    return csr_matrix((weights, (rows, cols)), shape=(k * k, k * k))


def _reference_cost(c: np.ndarray) -> float:
    """Optimal start-to-goal cost by scipy: vertex cost c[v] on every edge u -> v, plus c[start]."""
    k = c.shape[0]
    return float(shortest_path(_grid_graph(c), method="D", directed=True, indices=0)[k * k - 1] + c[0, 0])


def _assert_connected_path(p: np.ndarray, chain: bool = True) -> None:
    """p (k, k) 0/1 is a simple 8-connected chain from (0, 0) to (k-1, k-1)."""
    k = p.shape[0]
    cells = {tuple(x) for x in np.argwhere(p > 0.5)}
    assert (0, 0) in cells and (k - 1, k - 1) in cells
    seen, frontier = {(0, 0)}, [(0, 0)]
    while frontier:
        r, q = frontier.pop()
        for dr in (-1, 0, 1):
            for dq in (-1, 0, 1):
                nb = (r + dr, q + dq)
                if nb in cells and nb not in seen:
                    seen.add(nb)
                    frontier.append(nb)
    assert seen == cells, "path cells are not one 8-connected component"
    # a chain: the end cells have one path neighbour, the others two (an optimal path has no shortcuts when
    # costs are positive; k = 1 is the single cell)
    if chain and k > 1:
        degree = {c: sum((c[0] + dr, c[1] + dq) in cells for dr in (-1, 0, 1) for dq in (-1, 0, 1) if dr or dq)
                  for c in cells}
        assert degree[(0, 0)] == 1 and degree[(k - 1, k - 1)] == 1
        assert all(d == 2 for c, d in degree.items() if c not in ((0, 0), (k - 1, k - 1)))


@pytest.mark.parametrize("k", [2, 3, 5, 12])
@pytest.mark.parametrize("kind", ["uniform", "tiles"])
def test_optimal_cost_and_connected_path(k, kind):
    rng = np.random.default_rng(k)
    if kind == "uniform":
        c = rng.uniform(0.05, 10.0, size=(40, k, k))
    else:  # a handful of terrain costs: many exact ties between optimal paths
        c = rng.choice(np.array([0.8, 1.2, 5.3, 7.7, 9.2]), size=(40, k, k))
    costs = torch.from_numpy(c).float()
    paths = shortest_paths(costs)
    assert paths.shape == costs.shape and paths.dtype == costs.dtype
    assert set(paths.unique().tolist()) <= {0.0, 1.0}
    got = path_costs(costs.double(), paths.double()).numpy()
    ref = np.array([_reference_cost(x) for x in costs.double().numpy()])
    np.testing.assert_allclose(got, ref, rtol=1e-9)
    for p in paths.numpy():
        _assert_connected_path(p)


def test_distances_match_scipy_everywhere():
    rng = np.random.default_rng(0)
    c = rng.uniform(0.1, 3.0, size=(3, 6, 6))
    _, dist = shortest_paths_numpy(c, return_distances=True)
    for b in range(3):
        full = shortest_path(_grid_graph(c[b]), method="D", indices=0)
        np.testing.assert_allclose(dist[b].ravel(), full + c[b, 0, 0], rtol=1e-12)


def test_known_path_and_tie_breaking():
    # uniform costs: every monotone diagonal-ish path of k cells is optimal, the unique one with k cells is the
    # main diagonal (any other route needs more cells)
    paths = shortest_paths(torch.ones(1, 5, 5))
    assert torch.equal(paths[0], torch.eye(5))
    # a cheap corridor along the first row and the last column beats the diagonal
    c = torch.full((1, 4, 4), 10.0)
    c[0, 0, :] = 1.0
    c[0, :, 3] = 1.0
    p = shortest_paths(c)[0]
    # the corridor touches the goal from (2, 3) or diagonal shortcut (0, 2) -> (1, 3): both cost 1 per cell;
    # the path with fewer cells wins: (0,0) (0,1) (0,2) (1,3) (2,3) (3,3) = 6 cells
    assert p.sum() == 6 and p[0, 0] == p[0, 1] == p[0, 2] == p[1, 3] == p[2, 3] == p[3, 3] == 1
    # exact tie between two mirror-image paths: the predecessor with the smaller row-major index wins
    c = torch.tensor([[[1.0, 1.0, 9.0], [1.0, 9.0, 1.0], [9.0, 1.0, 1.0]]])
    # (0,0)->(0,1)->(1,2)->(2,2) and (0,0)->(1,0)->(2,1)->(2,2) both cost 4; (2,2)'s optimal predecessors are
    # (1,2) (index 5) and (2,1) (index 7): 5 wins
    p = shortest_paths(c)[0]
    assert p.tolist() == [[1, 1, 0], [0, 0, 1], [0, 0, 1]]
    # deterministic: the same answer on repeated calls and on a permuted batch
    c = torch.from_numpy(np.random.default_rng(1).choice([1.0, 2.0], size=(30, 8, 8)))
    a = shortest_paths(c)
    assert torch.equal(a, shortest_paths(c))
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a[perm], shortest_paths(c[perm]))


def test_zero_costs_and_single_cell():
    p = shortest_paths(torch.zeros(2, 4, 4))
    assert p[:, 0, 0].eq(1).all() and p[:, 3, 3].eq(1).all()
    for x in p.numpy():
        _assert_connected_path(x, chain=False)
        assert path_costs(torch.zeros(1, 4, 4), torch.from_numpy(x)[None]).item() == 0.0
    assert shortest_paths(torch.tensor([[[2.5]]])).tolist() == [[[1.0]]]
    assert shortest_paths(torch.zeros(0, 3, 3)).shape == (0, 3, 3)


def test_dtype_device_and_no_grad():
    c = torch.rand(4, 5, 5, dtype=torch.float64, requires_grad=True)
    p = shortest_paths(c)
    assert p.dtype == torch.float64 and not p.requires_grad
    assert shortest_paths(c.detach().half()).dtype == torch.float16
    pc = path_costs(c, p)
    pc.sum().backward()
    assert torch.equal(c.grad, p)


@pytest.mark.parametrize("bad", [
    torch.rand(3, 4), torch.rand(2, 3, 4), torch.rand(2, 0, 0), torch.tensor([[[1.0, -0.1], [1.0, 1.0]]]),
    torch.tensor([[[1.0, float("nan")], [1.0, 1.0]]]), torch.tensor([[[1.0, float("inf")], [1.0, 1.0]]]),
    torch.ones(1, 3, 3, dtype=torch.int64),
])
def test_bad_input(bad):
    with pytest.raises(ValueError):
        shortest_paths(bad)


def test_path_costs_shapes():
    c = torch.rand(2, 3, 3)
    assert path_costs(c, torch.ones(2, 3, 3)).shape == (2,)
    with pytest.raises(ValueError):
        path_costs(c, torch.ones(2, 4, 4))


def test_count_optimal_paths():
    from diffrank.experiments.algorithms.dijkstra import count_optimal_paths

    # uniform costs on 3 x 3: the diagonal is the only 3-cell path
    assert count_optimal_paths(np.ones((1, 3, 3))).tolist() == [1.0]
    # the mirror-image tie of test_known_path_and_tie_breaking: two optimal paths
    c = np.array([[[1.0, 1.0, 9.0], [1.0, 9.0, 1.0], [9.0, 1.0, 1.0]]])
    assert count_optimal_paths(c).tolist() == [2.0]
    # brute force on 3 x 3 grids with two cost levels: enumerate all simple 8-connected paths
    rng = np.random.default_rng(3)
    c = rng.choice([1.0, 2.0], size=(20, 3, 3))
    cells = [(r, q) for r in range(3) for q in range(3)]

    def walk(path, cost, grid, best):
        r, q = path[-1]
        if (r, q) == (2, 2):
            best.append(cost)
            return
        for r2, q2 in cells:
            if max(abs(r2 - r), abs(q2 - q)) == 1 and (r2, q2) not in path:
                walk(path + [(r2, q2)], cost + grid[r2, q2], grid, best)

    for grid, got in zip(c, count_optimal_paths(torch.from_numpy(c))):
        costs = []
        walk([(0, 0)], grid[0, 0], grid, costs)
        costs = np.array(costs)
        assert got == np.isclose(costs, costs.min()).sum()
    with pytest.raises(ValueError):
        count_optimal_paths(np.zeros((1, 2, 2)))
