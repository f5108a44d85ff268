"""Exact shortest paths on k x k grids with vertex costs (the Warcraft task; Vlastelica et al., ICLR 2020, §5.1;
Petersen's thesis §2.4).

The grid is a graph whose vertices are the k² cells; every cell is joined to its (up to) eight neighbours
(8-neighbourhood). Costs live on the vertices: the cost of a path is the sum of the costs of *all* cells it
visits, start (0, 0) and goal (k-1, k-1) included. As a directed graph this is the edge weight c[v] on every
edge u -> v plus the constant c[start], so Dijkstra's algorithm applies for costs >= 0.

Implementation: one binary-heap Dijkstra per map, compiled with numba, over the whole batch in one call
(float64 arithmetic whatever the input dtype; float32 inputs are exact in float64).

Deterministic tie-breaking. Distances are equal when they agree to a relative tolerance of ``RTOL``
(float64 sums of the same costs in a different order differ in the last bits). The heap settles cells by
(distance, row-major index). The predecessor of a cell v is, among its neighbours settled before v whose
distance + c[v] equals v's distance, the one with the smallest row-major index ``r * k + c``. For costs > 0
every optimal predecessor is settled before v, so the rule reads "the smallest-index neighbour on some
optimal path to v"; the returned path is the trace-back of these predecessors from the goal. Zero costs are
allowed: the predecessor tree is acyclic by construction (a predecessor is always settled first).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

RTOL = 1e-10
"""Relative tolerance under which two path costs count as equal (for tie-breaking only)."""

# 8-neighbourhood in row-major order of the offset, so that a smaller neighbour index is met first
_DR = np.array([-1, -1, -1, 0, 0, 1, 1, 1], dtype=np.int64)
_DC = np.array([-1, 0, 1, -1, 1, -1, 0, 1], dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _heap_push(keys, nodes, size, key, node):
    i = size
    keys[i] = key
    nodes[i] = node
    while i > 0:
        parent = (i - 1) >> 1
        pk, pn = keys[parent], nodes[parent]
        if pk < key or (pk == key and pn <= node):
            break
        keys[i], nodes[i] = pk, pn
        i = parent
    keys[i] = key
    nodes[i] = node
    return size + 1


@numba.njit(cache=True, nogil=True)
def _heap_pop(keys, nodes, size):
    key, node = keys[0], nodes[0]
    size -= 1
    if size > 0:
        lk, ln = keys[size], nodes[size]
        i = 0
        while True:
            child = 2 * i + 1
            if child >= size:
                break
            if child + 1 < size and (keys[child + 1] < keys[child]
                                     or (keys[child + 1] == keys[child] and nodes[child + 1] < nodes[child])):
                child += 1
            if keys[child] < lk or (keys[child] == lk and nodes[child] < ln):
                keys[i], nodes[i] = keys[child], nodes[child]
                i = child
            else:
                break
        keys[i] = lk
        nodes[i] = ln
    return key, node, size


@numba.njit(cache=True, nogil=True)
def _dijkstra_batch(costs, dr, dc, rtol):
    """costs (B, k, k) float64 >= 0 -> (paths (B, k, k) uint8, dist (B, k, k) float64)."""
    b_count, k = costs.shape[0], costs.shape[1]
    n = k * k
    paths = np.zeros((b_count, k, k), dtype=np.uint8)
    dists = np.empty((b_count, k, k), dtype=np.float64)
    dist = np.empty(n, dtype=np.float64)
    pred = np.empty(n, dtype=np.int64)
    done = np.empty(n, dtype=np.bool_)
    keys = np.empty(8 * n + 1, dtype=np.float64)
    nodes = np.empty(8 * n + 1, dtype=np.int64)
    goal = n - 1
    for b in range(b_count):
        c = costs[b].ravel()
        dist[:] = np.inf
        pred[:] = -1
        done[:] = False
        dist[0] = c[0]
        size = _heap_push(keys, nodes, 0, c[0], 0)
        while size > 0:
            d, u, size = _heap_pop(keys, nodes, size)
            if done[u]:
                continue  # stale heap entry (lazy deletion)
            done[u] = True
            ur, uc = u // k, u % k
            for j in range(8):
                vr, vc = ur + dr[j], uc + dc[j]
                if vr < 0 or vr >= k or vc < 0 or vc >= k:
                    continue
                v = vr * k + vc
                if done[v]:
                    continue
                nd = d + c[v]
                tol = rtol * max(abs(nd), abs(dist[v])) if dist[v] < np.inf else 0.0
                if nd < dist[v] - tol:
                    dist[v] = nd
                    pred[v] = u
                    size = _heap_push(keys, nodes, size, nd, v)
                elif nd <= dist[v] + tol and u < pred[v]:
                    pred[v] = u
        v = goal
        while v >= 0:
            paths[b, v // k, v % k] = 1
            v = pred[v]
        dists[b] = dist.reshape(k, k)
    return paths, dists


@numba.njit(cache=True, nogil=True)
def _count_batch(costs, dists, dr, dc, rtol):
    """Number of optimal start-to-goal paths per map (float64, exact up to 2**53), costs > 0."""
    b_count, k = costs.shape[0], costs.shape[1]
    n = k * k
    counts = np.zeros(b_count, dtype=np.float64)
    cnt = np.empty(n, dtype=np.float64)
    for b in range(b_count):
        c = costs[b].ravel()
        ds = dists[b].ravel()
        # with positive costs the tight edges u -> v (ds[u] + c[v] = ds[v]) form a DAG ordered by distance
        order = np.argsort(ds, kind="mergesort")
        cnt[:] = 0.0
        cnt[0] = 1.0
        for i in range(n):
            v = order[i]
            if v == 0:
                continue
            vr, vc = v // k, v % k
            total = 0.0
            for j in range(8):
                ur, uc = vr + dr[j], vc + dc[j]
                if ur < 0 or ur >= k or uc < 0 or uc >= k:
                    continue
                u = ur * k + uc
                if ds[u] < ds[v] and abs(ds[u] + c[v] - ds[v]) <= rtol * ds[v]:
                    total += cnt[u]
            cnt[v] = total
        counts[b] = cnt[n - 1]
    return counts


def _check_costs(costs: np.ndarray) -> None:
    if costs.ndim != 3 or costs.shape[1] != costs.shape[2] or costs.shape[1] < 1:
        raise ValueError(f"costs must have shape (B, k, k) with k >= 1, got {tuple(costs.shape)}")
    if not np.issubdtype(costs.dtype, np.floating):
        raise ValueError(f"costs must be a floating array, got dtype {costs.dtype}")
    if costs.size and not np.isfinite(costs).all():
        raise ValueError("costs must be finite (found NaN or inf)")
    if costs.size and (costs < 0).any():
        raise ValueError(f"costs must be >= 0 (Dijkstra), found minimum {costs.min()}")


def shortest_paths_numpy(costs: np.ndarray, return_distances: bool = False):
    """Exact minimum-cost paths from the top-left to the bottom-right cell of each grid (numpy in, numpy out).

    Args:
        costs: ``(B, k, k)`` float vertex costs >= 0 (any float dtype; computed in float64).
        return_distances: also return the distance map.

    Returns:
        ``paths (B, k, k)`` uint8 0/1, the tie-broken optimal path (module docstring), start and goal
        included; with ``return_distances`` also ``dist (B, k, k)`` float64, the cost of a cheapest path from
        (0, 0) to every cell, both end cells counted (``dist[:, -1, -1]`` is the optimal path cost).

    Raises:
        ValueError: shape not ``(B, k, k)``, non-float dtype, negative or non-finite costs.

    Source: Dijkstra (1959) on the vertex-cost 8-neighbourhood grid of Vlastelica et al. (ICLR 2020, §5.1).
    """
    costs = np.asarray(costs)
    _check_costs(costs)
    paths, dist = _dijkstra_batch(np.ascontiguousarray(costs, dtype=np.float64), _DR, _DC, RTOL)
    return (paths, dist) if return_distances else paths


def count_optimal_paths(costs: np.ndarray | Tensor) -> np.ndarray:
    """Number of distinct minimum-cost start-to-goal paths of each grid (1 = the label is unique).

    Two path costs are equal when they agree to the relative tolerance ``RTOL`` (module docstring).

    Args:
        costs: ``(B, k, k)`` float vertex costs > 0 (numpy or torch, any float dtype).

    Returns:
        ``(B,)`` float64 counts (exact below 2**53).

    Raises:
        ValueError: as :func:`shortest_paths_numpy`, and for zero costs (zero-cost cycles make the count
            ill-defined).

    Source: path counting on the DAG of tight edges of Dijkstra's distances (Vlastelica et al., ICLR 2020,
    §5.1 grid; label ties count as misses of the exact-match metric, Petersen's thesis §2.4).
    """
    if isinstance(costs, Tensor):
        costs = costs.detach().to("cpu", torch.float64).numpy()
    costs = np.ascontiguousarray(costs, dtype=np.float64) if np.issubdtype(np.asarray(costs).dtype, np.floating) \
        else np.asarray(costs)
    _check_costs(costs)
    if costs.size and (costs <= 0).any():
        raise ValueError("count_optimal_paths needs costs > 0 (zero-cost cycles)")
    _, dist = _dijkstra_batch(costs, _DR, _DC, RTOL)
    return _count_batch(costs, dist, _DR, _DC, RTOL)


def shortest_paths(costs: Tensor) -> Tensor:
    """Exact minimum-cost path indicator on each k x k grid: top-left (0, 0) to bottom-right (k-1, k-1).

    8-neighbourhood; the path cost is the sum of the costs of all visited cells, start and goal included.
    Ties between optimal paths are broken deterministically (module docstring: smallest row-major index of
    the predecessor, distances equal to a relative ``RTOL``). Runs on the CPU (numba); no gradient.

    Args:
        costs: ``(B, k, k)`` float vertex costs >= 0, any float dtype and device.

    Returns:
        ``(B, k, k)`` 0/1 indicator of the path, same dtype and device as ``costs``.

    Raises:
        ValueError: shape not ``(B, k, k)``, non-float dtype, negative or non-finite costs.

    Source: Vlastelica et al. (ICLR 2020, §5.1, the Warcraft shortest-path task); Petersen's thesis §2.4.
    """
    if not isinstance(costs, Tensor):
        raise ValueError(f"costs must be a torch.Tensor, got {type(costs).__name__}")
    if not costs.is_floating_point():
        raise ValueError(f"costs must be a floating tensor, got dtype {costs.dtype}")
    host = costs.detach().to("cpu", torch.float64).numpy()
    paths = shortest_paths_numpy(host)
    return torch.from_numpy(paths).to(device=costs.device, dtype=costs.dtype)


def path_costs(costs: Tensor, paths: Tensor) -> Tensor:
    """Cost of each path: the sum of the vertex costs of the cells it visits.

    Args:
        costs: ``(B, k, k)`` float vertex costs.
        paths: ``(B, k, k)`` 0/1 path indicator (e.g. from :func:`shortest_paths`), same device.

    Returns:
        ``(B,)`` ``Σ_cells costs · paths``, in the dtype of ``costs · paths``; differentiable in both.

    Raises:
        ValueError: shapes not equal or not ``(B, k, k)``.

    Source: the path cost of Vlastelica et al. (ICLR 2020, §5.1) and their cost-ratio metric.
    """
    if costs.ndim != 3 or costs.shape[1] != costs.shape[2] or tuple(paths.shape) != tuple(costs.shape):
        raise ValueError(f"costs and paths must both have shape (B, k, k), got {tuple(costs.shape)} "
                         f"and {tuple(paths.shape)}")
    return (costs * paths).sum(dim=(-2, -1))
