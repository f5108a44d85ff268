"""Fast soft sort / rank vs torchsort's C++ extension: forward + backward, both in this process, interleaved.

For B ∈ {1, 16, 64} × n ∈ {10², 10³, 10⁴, 10⁵} (``--quick``: n <= 10³) and each of ``soft_rank`` / ``soft_sort``
(l2, ε = 1, the default dtype float32 unless ``--dtype``), :mod:`diffrank.compat.torchsort` (diffrank's operator
with torchsort's signature) and ``torchsort`` run the same closure (:func:`diffrank.benchmark.harness.fwd_bwd`:
a fresh leaf, the forward, ``(out * g).sum().backward()``) alternately, one call each per round, so that both see
the same machine load; each time is the median over the rounds, and the ratio is torchsort's time / ours (> 1:
ours is faster). Without torchsort (``make torchsort``) the table says so and times ours alone.
"""

from __future__ import annotations

import statistics
import time

import torch

from diffrank.benchmark.harness import fmt_time, fwd_bwd

BATCHES = (1, 16, 64)
SIZES = (100, 1_000, 10_000, 100_000)


def interleaved(fns: dict[str, object], max_seconds: float, min_rounds: int = 5, max_rounds: int = 2000,
                warmup: int = 3) -> dict[str, float]:
    """Median seconds of each closure, timed in alternation (one call of each per round) after ``warmup`` rounds;
    as many rounds as fit ``max_seconds`` (at least ``min_rounds``, at most ``max_rounds``)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or (rounds < max_rounds and time.perf_counter() - start < max_seconds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        rounds += 1
    return {k: statistics.median(v) for k, v in times.items()}


def run(args) -> list[tuple[str, list[dict]]]:
    """The table: one row per (function, B, n)."""
    import diffrank.compat.torchsort as ours

    try:
        import torchsort
    except ImportError:
        torchsort = None
    dtype = getattr(torch, getattr(args, "dtype", None) or "float32")
    sizes = [n for n in SIZES if n <= 1_000] if args.quick else SIZES
    budget = min(args.max_seconds, 2.0 if args.quick else 4.0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in ("soft_rank", "soft_sort"):
        for B in BATCHES:
            for n in sizes:
                x = torch.randn(B, n, generator=gen, dtype=dtype)
                fns = {"ours": fwd_bwd(getattr(ours, name), x)}
                if torchsort is not None:
                    fns["torchsort"] = fwd_bwd(getattr(torchsort, name), x)
                t = interleaved(fns, budget)
                rows.append({"function": name, "B": B, "n": n, "ours": fmt_time(t["ours"]),
                             "torchsort": fmt_time(t["torchsort"]) if torchsort else "not installed",
                             "ratio (torchsort / ours)": f"{t['torchsort'] / t['ours']:.2f}" if torchsort else "-"})
    title = f"fast soft sort vs torchsort (C++), forward + backward, l2, ε = 1, {dtype}, interleaved medians"
    return [(title, rows)]
