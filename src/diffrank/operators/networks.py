"""Comparator networks for differentiable sorting (odd-even, bitonic) and top-k (splitter selection).

Orientation (our frame, the same as the ranking contract): output wire 0 receives the LARGEST value,
output wire r the (r+1)-th largest. A comparator is an ordered pair ``(hi, lo)`` of wires: the larger of
the two values goes to ``hi``, the smaller to ``lo``. A layer is two int64 arrays ``hi``, ``lo`` of the
same length c whose 2c wires are distinct; wires not in the layer are idle.

Wires are *tracks*: track j starts with input item j. Networks that route some values by fixed swaps
(the padded bitonic network below) end with the largest value on track ``out_perm[0]``, the r-th on
``out_perm[r]``; ``out_perm = None`` means the identity.

Constructions (all in numpy, vectorised per layer; every builder is cached with ``functools.lru_cache``
on its integer arguments, and every network is built in well under a second for n = 10 000):

- :func:`odd_even` — odd-even transposition sort (Knuth TAOCP vol. 3, §5.3.4 ex. 37; diffsort's
  ``odd_even_network``): n layers of adjacent comparators, diffsort's network read from the top, so
  our relaxed P equals theirs after the orientation map (docs/conventions.md). Odd-even
  layers repeat with period 2, so the n layers share two layer objects: memory O(n), not O(n²).
- :func:`bitonic` — Batcher's bitonic sorter on P2 = 2^⌈log2 n⌉ wires (thesis §3.2.2), mirrored so that it
  sorts in descending order. For n < P2 the wires n … P2-1 carry -∞ sentinels and are resolved at
  construction time (see :func:`bitonic`): this is a correct sorting network for every n, unlike the
  reference construction, which fails for 708 of the sizes n ≤ 1024 (docs/conventions.md, "Bitonic
  networks for every n (−∞ sentinels)").
- :func:`splitter_selection` — the splitter selection network of Petersen et al. 2022, Appendix B
  (as constructed in the difftopk code): the k largest values end, sorted, on wires 0 … k-1; k = n sorts.

:func:`hard_evaluate` runs a network with exact min / max (for tests and for the hard limit).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from diffrank.operators.base import constant


@dataclass(eq=False)
class Layer:
    """One layer of disjoint comparators on ``n`` wires.

    Attributes:
        hi: ``(c,)`` int64 wires that receive the larger value.
        lo: ``(c,)`` int64 wires that receive the smaller value.
        n: number of wires.
    """

    hi: np.ndarray
    lo: np.ndarray
    n: int
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        """Number of comparators c."""
        return int(self.hi.shape[0])

    @functools.cached_property
    def block(self) -> tuple[int, int, int] | None:
        """``(offset, nblocks, d)`` if the layer's wire pairs are exactly {(o + 2dq + j, o + 2dq + j + d) :
        q < nblocks, j < d} (odd-even and power-of-two bitonic layers), else ``None``.

        Such a layer is a strided view of the wires, (nblocks, 2, d), so it is evaluated without gathers.
        """
        if self.size == 0:
            return None
        first = np.minimum(self.hi, self.lo)
        second = np.maximum(self.hi, self.lo)
        d = int(second[0] - first[0])
        if not (second - first == d).all() or self.size % d:
            return None
        off, nb = int(first.min()), self.size // d
        expect = off + (np.arange(nb)[:, None] * 2 * d + np.arange(d)[None, :]).ravel()
        if off + 2 * d * nb > self.n or not np.array_equal(np.sort(first), expect):
            return None
        return off, nb, d

    def tensors(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The layer as a wire permutation and a direction sign, cached per (device, dtype).

        Returns:
            ``partner`` ``(n,)`` int64 with ``partner[hi] = lo``, ``partner[lo] = hi``, ``partner[w] = w`` for
            idle wires; ``sign`` ``(n,)`` of ``dtype``: +1 on ``hi`` wires, -1 on ``lo`` wires, 0 on idle ones,
            so that ``sign * (x - x[partner])`` is x_hi - x_lo on both wires of a comparator.
        """
        key = (torch.device(device), dtype)
        out = self._cache.get(key)
        if out is None:
            partner = np.arange(self.n, dtype=np.int64)
            partner[self.hi] = self.lo
            partner[self.lo] = self.hi
            sign = np.zeros(self.n, dtype=np.float64)
            sign[self.hi] = 1.0
            sign[self.lo] = -1.0
            out = constant(lambda: (torch.from_numpy(partner).to(device),
                                    torch.from_numpy(sign).to(device=device, dtype=dtype)))
            self._cache[key] = out
        return out


@dataclass(eq=False)
class Network:
    """A comparator network (see the module docstring for the orientation).

    Attributes:
        kind: ``"odd_even"``, ``"bitonic"`` or ``"splitter_selection"``.
        n: number of wires = items.
        k: the network guarantees exact ranks 0 … k-1 on its top outputs (k = n for sorting networks).
        layers: the layers in execution order (a layer object may repeat).
        out_perm: ``(n,)`` int64 track holding rank r at the end, or ``None`` for the identity.
    """

    kind: str
    n: int
    k: int
    layers: tuple[Layer, ...]
    out_perm: np.ndarray | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def num_layers(self) -> int:
        """Number of layers (network depth)."""
        return len(self.layers)

    @property
    def num_comparators(self) -> int:
        """Total number of comparators over all layers."""
        return sum(layer.size for layer in self.layers)

    def out_perm_tensor(self, device: torch.device) -> Tensor | None:
        """``out_perm`` as an int64 tensor on ``device`` (cached), or ``None``."""
        if self.out_perm is None:
            return None
        key = torch.device(device)
        if key not in self._cache:
            self._cache[key] = constant(lambda: torch.from_numpy(self.out_perm).to(device))
        return self._cache[key]

    def layer_tables(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """The layers as small index tables for the fused kernels (``kernels/networks.py``), cached per device.

        A layer object that repeats (the two odd-even layers) is stored once, so the tables take O(U·n)
        memory for U distinct layers, not O(L·n).

        Returns:
            ``partner`` ``(U, n)`` int32 (as :meth:`Layer.tensors`: ``partner[hi] = lo``, ``partner[lo] = hi``,
            idle wires map to themselves); ``sign`` ``(U, n)`` int8 (+1 on ``hi``, -1 on ``lo``, 0 idle);
            ``index`` ``(L,)`` int32, the table row of layer t in execution order.
        """
        key = ("tables", torch.device(device))
        out = self._cache.get(key)
        if out is None:
            rows: dict[int, int] = {}
            unique: list[Layer] = []
            index = []
            for layer in self.layers:
                if id(layer) not in rows:
                    rows[id(layer)] = len(unique)
                    unique.append(layer)
                index.append(rows[id(layer)])
            partner = np.tile(np.arange(self.n, dtype=np.int32), (max(len(unique), 1), 1))
            sign = np.zeros((max(len(unique), 1), self.n), dtype=np.int8)
            for u, layer in enumerate(unique):
                partner[u, layer.hi] = layer.lo
                partner[u, layer.lo] = layer.hi
                sign[u, layer.hi] = 1
                sign[u, layer.lo] = -1
            out = constant(lambda: tuple(torch.from_numpy(a).to(device)
                                         for a in (partner, sign, np.asarray(index, dtype=np.int32))))
            self._cache[key] = out
        return out


def _check_n(n: int) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"a network needs an integer number of wires n >= 1, got {n!r}")
    return int(n)


def _layer(hi, lo, n: int) -> Layer:
    return Layer(np.ascontiguousarray(hi, dtype=np.int64), np.ascontiguousarray(lo, dtype=np.int64), n)


@functools.lru_cache(maxsize=64)
def odd_even(n: int) -> Network:
    """Odd-even transposition sorting network on n wires, read from the top (rank r on wire n-1-r).

    Layer t (0-based, t < n) has comparators (i, i+1) for i ≡ t mod 2 with the max → i+1, and
    ``out_perm = (n-1, …, 0)``. This is exactly diffsort's ``odd_even_network(n)`` (ascending, item j on
    wire j) with its outputs read in descending order, so our relaxed P equals diffsort's after the
    orientation map of docs/conventions.md (mirroring the comparators instead would also mirror the items and
    give a different relaxed P). n layers sort any input (transposition sort).

    Args:
        n: number of wires, >= 1.

    Returns:
        :class:`Network` with n layers (0 for n = 1) of ⌊n/2⌋ or ⌊(n-1)/2⌋ comparators.

    Raises:
        ValueError: for n < 1 or a non-integer n.
    """
    n = _check_n(n)
    by_parity = {}
    for p in (0, 1):
        lo = np.arange(p, n - 1, 2)
        by_parity[p] = _layer(lo + 1, lo, n)
    layers = tuple(by_parity[t % 2] for t in range(n)) if n > 1 else ()
    layers = tuple(layer for layer in layers if layer.size)
    return Network("odd_even", n, n, layers, np.arange(n - 1, -1, -1, dtype=np.int64) if n > 1 else None)


def _bitonic_pow2(p2: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batcher's bitonic sorter on p2 = 2^N wires in our descending frame: list of (hi, lo) per layer.

    Built as diffsort's ascending network (block b, layer l, distance d = 2^{b-l},
    comparator (a, a+d) for every a with bit d clear, ascending iff ⌊a / 2^{b+1}⌋ is even) and mirrored
    w ↔ p2-1-w: an ascending pair (min → a, max → a+d) becomes hi = p2-1-a-d, lo = p2-1-a.
    """
    N = p2.bit_length() - 1
    wires = np.arange(p2, dtype=np.int64)
    out = []
    for b in range(N):
        for l in range(b + 1):
            d = 1 << (b - l)
            a = wires[(wires & d) == 0]
            ascending = ((a >> (b + 1)) & 1) == 0
            small, large = np.where(ascending, a, a + d), np.where(ascending, a + d, a)
            out.append((p2 - 1 - large, p2 - 1 - small))
    return out


@functools.lru_cache(maxsize=64)
def bitonic(n: int) -> Network:
    """Bitonic sorting network for ANY n ≥ 1, descending (rank r on track ``out_perm[r]``).

    Construction: the bitonic sorter on P2 = 2^⌈log2 n⌉ wires (:func:`_bitonic_pow2`), whose wires
    n … P2-1 hold -∞ sentinels. The sentinels' positions never depend on the data (a comparator with a
    -∞ on one side is decided: the real value goes to ``hi``), so they are resolved here, once:

    - real vs real: kept as a (relaxed) comparator on the two tracks;
    - real on ``hi`` vs sentinel on ``lo``: identity, dropped;
    - sentinel on ``hi`` vs real on ``lo``: a fixed swap, applied to the wire → track map, no comparator;
    - sentinel vs sentinel: dropped.

    Proof of correctness: the P2-wire bitonic network sorts every input (0-1 principle), in particular
    the padded one; with hard comparators our network computes exactly the same values on every wire (the
    resolved comparators are what a hard comparator does with a -∞), and at the end the n reals are on
    padded wires 0 … n-1 in descending order, which ``out_perm`` records. With relaxed comparators the
    result equals the relaxed padded network, since f(β·(x - (-∞))) = f(+∞) = 1 is an exact identity or
    swap for every sigmoid. P stays doubly stochastic (fixed swaps only relabel tracks). For n a power of
    two nothing is padded and the network is diffsort's ``bitonic_network(n)`` mirrored (parity-tested).
    This deliberately differs from the reference for other n, which does not sort (docs/conventions.md).

    Args:
        n: number of items, >= 1.

    Returns:
        :class:`Network` with ⌈log2 n⌉(⌈log2 n⌉+1)/2 layers or fewer (empty layers dropped).

    Raises:
        ValueError: for n < 1 or a non-integer n.
    """
    n = _check_n(n)
    if n == 1:
        return Network("bitonic", 1, 1, ())
    p2 = 1 << math.ceil(math.log2(n))
    track = np.full(p2, -1, dtype=np.int64)  # padded wire -> track (-1 = sentinel)
    track[:n] = np.arange(n)
    layers = []
    for hi, lo in _bitonic_pow2(p2):
        th, tl = track[hi], track[lo]
        real = (th >= 0) & (tl >= 0)
        if real.any():
            layers.append(_layer(th[real], tl[real], n))
        swap = (th < 0) & (tl >= 0)
        track[hi[swap]], track[lo[swap]] = tl[swap], th[swap]
    out_perm = track[:n].copy()
    assert (out_perm >= 0).all(), "bitonic padding left a sentinel in the top n wires"
    if (out_perm == np.arange(n)).all():
        out_perm = None
    return Network("bitonic", n, n, tuple(layers), out_perm)


def _cascade(M: int) -> list[np.ndarray]:
    """Splitter cascade on list positions 0 … M-1 (difftopk's construction, first step): per layer, the positions j of
    comparators (j, j + d), max → j, d = 2^{D-1-i}, j < M - d with bit d of j clear."""
    D = math.ceil(math.log2(M))
    pos = np.arange(M, dtype=np.int64)
    out = []
    for i in range(D):
        d = 1 << (D - 1 - i)
        out.append(pos[(pos < M - d) & ((pos & d) == 0)])
    return out


def _place_cascade(lanes: np.ndarray, nextlayer: np.ndarray, layer_hi: list[list[np.ndarray]],
                   layer_lo: list[list[np.ndarray]]) -> None:
    """Add the splitter cascade over ``lanes`` (:func:`_cascade`) to the layers of :func:`splitter_selection`, in
    the earliest layers after the lanes' last use (``nextlayer``, updated; new layers appended as needed)."""
    o = int(nextlayer[lanes].max())
    casc = _cascade(len(lanes))
    D = len(casc)
    while len(layer_hi) < o + D:
        layer_hi.append([])
        layer_lo.append([])
    for i, j in enumerate(casc):
        d = 1 << (D - 1 - i)
        layer_hi[o + i].append(lanes[j])
        layer_lo[o + i].append(lanes[j + d])
    nextlayer[lanes] = o + D


@functools.lru_cache(maxsize=256)
def splitter_selection(n: int, k: int) -> Network:
    """Splitter selection network (Petersen et al. 2022, Appendix B): top k sorted on wires 0…k-1.

    Ranks are "minimum ranks": a lane at position j of a splitter cascade over lanes ℓ₀ < … < ℓ_{M-1}
    has at least 2^{popcount(j)} - 1 lanes of that cascade holding values ≥ its own. Lanes start at
    rank 0; passes split every rank r < k that is held by two or more lanes (ranks k-1 down to the pass
    index), placing each cascade in the earliest layers after its lanes' last use, so cascades on disjoint
    lanes share layers; a lane whose minimum rank reaches k is discarded. It stops when a pass changes
    nothing; then rank r (< k) is held by lane r alone. This is the reference construction in our frame
    (the reference mirrors it at the end for its ascending convention); its layer / comparator counts
    match the reference code's (e.g. n = 8, k = 2: 5 layers, 14 comparators; n = 1000, k = 5: 22 / 5085).
    With k = n the network sorts. Empty trailing work is never generated.

    Args:
        n: number of items, >= 1.
        k: number of top ranks, 1 <= k <= n.

    Returns:
        :class:`Network` (``out_perm = None``) whose outputs 0 … k-1 are exact in the hard limit; the
        other outputs hold the remaining values in no particular order.

    Raises:
        ValueError: for n < 1, k outside [1, n], or non-integers.
    """
    n = _check_n(n)
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= n:
        raise ValueError(f"splitter selection needs an integer 1 <= k <= n = {n}, got k = {k!r}")
    k = int(k)
    groups: dict[int, np.ndarray] = {0: np.arange(n, dtype=np.int64)}  # minimum rank -> lanes (ascending)
    nextlayer = np.zeros(n, dtype=np.int64)
    layer_hi: list[list[np.ndarray]] = []
    layer_lo: list[list[np.ndarray]] = []
    popcount = np.array([bin(j).count("1") for j in range(n)], dtype=np.int64)
    rsplit = (1 << popcount) - 1
    rkend = -1
    while True:
        # processing rank r only moves lanes to ranks > r, so the ranks to visit in this pass are fixed
        todo = sorted((r for r, lanes in groups.items() if rkend < r < k and len(lanes) >= 2), reverse=True)
        for r in todo:
            lanes = groups.pop(r)
            _place_cascade(lanes, nextlayer, layer_hi, layer_lo)
            new_rank = r + rsplit[: len(lanes)]
            for nr in np.unique(new_rank):
                if nr >= k:
                    continue  # discarded lanes: their values can no longer reach the top k
                moved = lanes[new_rank == nr]
                groups[int(nr)] = np.sort(np.concatenate([groups[int(nr)], moved])) if int(nr) in groups else moved
        rkend += 1
        if not todo:
            break
    layers = tuple(_layer(np.concatenate(h), np.concatenate(lo), n) for h, lo in zip(layer_hi, layer_lo) if h)
    return Network("splitter_selection", n, k, layers)


def build(kind: str, n: int, k: int | None = None) -> Network:
    """Network by name: ``"odd_even"``, ``"bitonic"`` (k ignored) or ``"splitter_selection"`` (k = n if None).

    Raises:
        ValueError: unknown kind or bad n / k.
    """
    if kind == "odd_even":
        return odd_even(n)
    if kind == "bitonic":
        return bitonic(n)
    if kind == "splitter_selection":
        return splitter_selection(n, n if k is None else k)
    raise ValueError(f"unknown network kind {kind!r}; known: odd_even, bitonic, splitter_selection")


def hard_evaluate(network: Network, x: Tensor) -> Tensor:
    """Run ``network`` with exact max / min comparators, batched.

    Args:
        network: a :class:`Network` on n wires.
        x: ``(B, n)`` tensor (any real dtype).

    Returns:
        ``(B, n)`` output values in rank order (column r = the value the network puts at rank r; for a
        sorting network that is ``x`` sorted descending, for a selection network the first k columns are).

    Raises:
        ValueError: if ``x`` is not ``(B, n)``.
    """
    if x.dim() != 2 or x.shape[1] != network.n:
        raise ValueError(f"x must have shape (B, {network.n}), got {tuple(x.shape)}")
    for layer in network.layers:
        partner, sign = layer.tensors(x.device, torch.float32)
        xp = x.index_select(1, partner)
        # idle wires have partner = self, so min(x, x) = x keeps them
        x = torch.where(sign > 0, torch.maximum(x, xp), torch.minimum(x, xp))
    perm = network.out_perm_tensor(x.device)
    return x if perm is None else x[:, perm]
