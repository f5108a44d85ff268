"""Comparator networks: exact sorting / selection in the hard limit for every n, reference sizes, caching."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from diffrank.operators.networks import bitonic, build, hard_evaluate, odd_even, splitter_selection

ALL_SIZES = list(range(2, 1025))
# default suite: every n up to 40, powers of two ± 1, and a random sample; ALL sizes under -m slow
_rng = np.random.default_rng(0)
SOME_SIZES = sorted(set(range(2, 41)) | {2 ** e + o for e in range(6, 11) for o in (-1, 0, 1) if 2 ** e + o <= 1024}
                    | set(_rng.choice(np.arange(41, 1025), 25, replace=False).tolist()))


def _untied(B, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g) for _ in range(B)]).double()


def _check_sorts(n):
    x = _untied(8, n, n)
    want = x.sort(dim=1, descending=True).values
    for net in (bitonic(n), odd_even(n)):
        assert torch.equal(hard_evaluate(net, x), want), f"{net.kind} n={n} does not sort"
    for k in (1, 2, 5, 10):
        if k <= n:
            got = hard_evaluate(splitter_selection(n, k), x)[:, :k]
            assert torch.equal(got, want[:, :k]), f"splitter n={n} k={k} misses the top k"


@pytest.mark.parametrize("n", SOME_SIZES)
def test_hard_networks_sort_sampled_sizes(n):
    _check_sorts(n)


@pytest.mark.slow
def test_hard_networks_sort_every_size_to_1024():
    for n in ALL_SIZES:
        _check_sorts(n)


def test_reference_bitonic_failure_sizes_sort_here():
    # first sizes where the reference construction fails (docs/conventions.md), with 0/1 inputs too (0-1 principle)
    for n in (22, 38, 42, 46, 54, 70, 300):
        x = torch.randint(0, 2, (256, n)).double()
        assert torch.equal(hard_evaluate(bitonic(n), x), x.sort(dim=1, descending=True).values)
        _check_sorts(n)


@pytest.mark.parametrize("n", [3, 7, 16, 33])
def test_splitter_with_k_equal_n_sorts(n):
    x = _untied(16, n, 5)
    assert torch.equal(hard_evaluate(splitter_selection(n, n), x), x.sort(dim=1, descending=True).values)


# (n, k) -> (layers, comparators) of the reference code (difftopk; paper App. B: n = 1024 -> 22 layers)
SPLITTER_SIZES = {(8, 2): (5, 14), (16, 5): (10, 50), (16, 1): (4, 32), (16, 2): (6, 36), (32, 5): (14, 111),
                  (50, 5): (15, 181), (64, 5): (15, 240), (100, 5): (17, 385), (100, 10): (27, 528),
                  (1000, 5): (22, 5085), (1024, 5): (22, None)}
BITONIC_SIZES = {16: (10, 80), 32: (15, 240), 50: (21, 492), 64: (21, 672), 100: (28, 1334), 1000: (55, 27268)}


@pytest.mark.parametrize("nk", list(SPLITTER_SIZES))
def test_splitter_sizes_match_reference(nk):
    net = splitter_selection(*nk)
    layers, comps = SPLITTER_SIZES[nk]
    assert net.num_layers == layers
    if comps is not None:
        assert net.num_comparators == comps


def test_splitter_worked_example():
    # difftopk's n = 8, k = 2 network in the original (= our) frame
    net = splitter_selection(8, 2)
    pairs = [sorted(zip(layer.hi.tolist(), layer.lo.tolist())) for layer in net.layers]
    assert pairs == [[(0, 4), (1, 5), (2, 6), (3, 7)], [(0, 2), (1, 3), (4, 6), (5, 7)],
                     [(0, 1), (2, 3), (4, 5), (6, 7)], [(1, 4)], [(1, 2)]]


@pytest.mark.parametrize("n", list(BITONIC_SIZES))
def test_bitonic_sizes(n):
    # padded real comparators happen to equal the reference's counts (which keep identity pseudo-comparators)
    assert (bitonic(n).num_layers, bitonic(n).num_comparators) == BITONIC_SIZES[n]


@pytest.mark.parametrize("n", [8, 16, 50, 100])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_splitter_identical_to_difftopk(n, k, capsys):
    networks = pytest.importorskip("difftopk.networks")
    ref = networks.sparse_splitter_selection_network(n, k)  # prints; ascending frame, min -> a
    ours = splitter_selection(n, k)
    assert len(ref) == ours.num_layers
    for layer_ref, layer in zip(ref, ours.layers):
        split_a, split_b = layer_ref[0], layer_ref[1]
        c = layer.size
        a, b = split_a[:c].argmax(1), split_b[:c].argmax(1)
        mirrored = sorted(zip((n - 1 - b).tolist(), (n - 1 - a).tolist()))  # max -> n-1-b in our frame
        assert mirrored == sorted(zip(layer.hi.tolist(), layer.lo.tolist()))


def test_layers_are_disjoint_and_blocks_consistent():
    for net in (odd_even(9), bitonic(37), bitonic(64), splitter_selection(100, 10)):
        for layer in net.layers:
            wires = np.concatenate([layer.hi, layer.lo])
            assert len(np.unique(wires)) == len(wires)
            if layer.block is not None:
                off, nb, d = layer.block
                first = np.minimum(layer.hi, layer.lo)
                assert np.array_equal(np.sort(first), off + (np.arange(nb)[:, None] * 2 * d + np.arange(d)).ravel())


def test_built_fast_and_cached():
    for fn in (lambda: odd_even(10_000), lambda: bitonic(10_000), lambda: splitter_selection(10_000, 5)):
        t0 = time.perf_counter()
        a = fn()
        assert time.perf_counter() - t0 < 1.0
        assert fn() is a


def test_bad_sizes():
    with pytest.raises(ValueError, match="n >= 1"):
        bitonic(0)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        splitter_selection(5, 6)
    with pytest.raises(ValueError, match="known: odd_even"):
        build("bubble", 5)
    with pytest.raises(ValueError, match=r"shape \(B, 5\)"):
        hard_evaluate(bitonic(5), torch.zeros(2, 4))
