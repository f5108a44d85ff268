"""LapSum top-k, SOFT top-k and fast soft rank (Blondel et al.) vs torchsort.soft_rank; forward + backward.

Objective for every cell: Σ out ⊙ G for a fixed random G. LapSum and SOFT top-k give the top-k membership
(B, n) for k = args.k; fast_soft_sort gives the l2 soft rank (B, n), compared with ``torchsort.soft_rank(-x)``
(same values; torchsort is ascending). The growth with n should be O(n log n) (LapSum, fast_soft_sort) and
O(L n) (SOFT top-k, L Sinkhorn iterations).
"""

from __future__ import annotations

import torch

from diffrank.benchmark.harness import Measurement, compare_row, fwd_bwd, measure
from diffrank.operators import load


def _torchsort():
    try:
        import torchsort
    except ImportError:
        return None
    return lambda s: torchsort.soft_rank(-s, regularization="l2", regularization_strength=1.0)


def run(args) -> list[tuple[str, list[dict]]]:
    """Rows: operator x n (n ≤ 1000 with --quick), B = args.batch, k = args.k."""
    sizes = [100, 1000] if args.quick else [100, 1000, 10000, 100000]
    B, k, dev = args.batch, args.k, args.device
    rows = []
    lap = load("lapsum", beta=1.0).to(dev)
    # SOFT top-k: the default Newton solve of the two-anchor dual against the official schedule (exactly 200
    # plain Sinkhorn iterations, not converged on near-hard plans; converging to 1e-6 takes thousands)
    soft = load("soft_topk", beta=10.0, tolerance=None, max_iter=200, epsilon_start=None, solver="sinkhorn").to(dev)
    newton = load("soft_topk", beta=10.0).to(dev)  # the default: same plan from the Newton solve of the dual
    fss = load("fast_soft_sort", beta=1.0, regularization="l2").to(dev)
    ts = _torchsort()
    fss.soft_rank(torch.randn(2, 8, device=dev))  # numba compiles on the first call: keep it out of the cells
    for n in sizes:
        x = torch.randn(B, n, device=dev, generator=None)
        rows.append(compare_row("lapsum top-k", {"n": n, "k": k},
                                measure(fwd_bwd(lambda s: lap.topk_membership(s, [k])[:, 0], x), dev,
                                        max_seconds=args.max_seconds), None, ""))
        m_new = measure(fwd_bwd(lambda s: newton.topk_membership(s, [k])[:, 0], x), dev, max_seconds=args.max_seconds)
        it_new = newton.last_iterations
        if n <= 10000:  # 200 iterations x 64 x 1e5: ~2 min per call on 2 CPU cores
            m = measure(fwd_bwd(lambda s: soft.topk_membership(s, [k])[:, 0], x), dev, repeats=1,
                        max_seconds=args.max_seconds)
        else:
            m = Measurement(float("nan"), float("nan"), error="skip: n > 10000")
        row = compare_row("soft_topk (β=10, newton)", {"n": n, "k": k}, m_new, m,
                          "soft_topk sinkhorn, 200 it (official schedule)")
        row["note"] = f"{it_new} Newton iterations"
        rows.append(row)
        m_ref = None if ts is None else measure(fwd_bwd(ts, x), dev, max_seconds=args.max_seconds)
        rows.append(compare_row("fast_soft_sort rank (l2)", {"n": n, "k": "-"},
                                measure(fwd_bwd(fss.soft_rank, x), dev, max_seconds=args.max_seconds),
                                m_ref, "torchsort.soft_rank"))
    # compare_row omits reference columns where there is none: give every row the same keys for the table
    keys = list(dict.fromkeys(key for r in rows for key in r))
    rows = [{key: r.get(key, "") for key in keys} for r in rows]
    return [("LapSum / SOFT top-k / fast soft rank, forward+backward", rows)]
