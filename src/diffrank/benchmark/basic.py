"""NeuralSort / SoftSort top-k rows (ours) vs difftopk's full n x n matrices; SinkhornSort for reference.

Objective for every cell: forward + backward of Σ (top-k rows of P) ⊙ G for a fixed random G, i.e. what
the top-k loss needs. difftopk builds the full matrix (its only option); we build k rows.
"""

from __future__ import annotations

import torch

from diffrank.benchmark.harness import Measurement, compare_row, fwd_bwd, measure
from diffrank.operators import load


def _difftopk(name: str, beta: float, k: int):
    try:
        import difftopk
    except ImportError:
        return None
    if name == "neuralsort":
        mod = difftopk.NeuralSort(tau=1.0 / beta)
        return lambda s: mod(s)[:, :, -k:]  # (B, item, ascending position): the top-k columns
    mod = difftopk.SoftSort(tau=1.0 / beta)
    return lambda s: mod(s)[:, :k]  # (B, descending rank, item)


def run(args) -> list[tuple[str, list[dict]]]:
    """Rows: operator x n, ours vs difftopk (skipped where the dense matrix would not fit in 16 GB)."""
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    B, k, dev = args.batch, args.k, args.device
    rows = []
    for name in ("neuralsort", "softsort"):
        ours = load(name, beta=1.0).to(dev)
        for n in sizes:
            x = torch.randn(B, n, device=dev)
            m_ours = measure(fwd_bwd(lambda s, op=ours: op(s, k=k), x), dev, max_seconds=args.max_seconds)
            ref_fn = _difftopk(name, 1.0, k)
            dense_bytes = 4 * B * n * n * (4 if name == "neuralsort" else 3)
            if ref_fn is None:
                m_ref = None
            elif dense_bytes > 16e9:
                m_ref = Measurement(float("nan"), float("nan"),
                                    error=f"skip: {dense_bytes / 1e9:.0f} GB")
            else:
                m_ref = measure(fwd_bwd(ref_fn, x), dev, repeats=1 if n >= 1000 else 3,
                                max_seconds=args.max_seconds)
            rows.append(compare_row(name, {"n": n, "k": k}, m_ours, m_ref, f"difftopk.{name.title()}"))
    # the backward recomputes the iterations (diffrank.operators.log_sinkhorn): a few (B, n, n) buffers whatever
    # their count (autograd through the unrolled loop kept ~4 per iteration); the first size only, for time
    sink = load("sinkhorn", beta=100.0).to(dev)
    for n in sizes[:1]:
        x = torch.randn(B, n, device=dev)
        rows.append(compare_row("sinkhorn (β=100)", {"n": n, "k": k},
                                measure(fwd_bwd(lambda s: sink(s, k=k), x), dev, repeats=1,
                                        max_seconds=args.max_seconds), None, ""))
    return [("top-k rows, forward+backward", rows)]
