"""NeuralSort's and SoftSort's soft rank streamed over chunks of P's rows (:mod:`diffrank.operators.streaming`) against
the same soft rank built from the dense P (``RankingOperator._soft_rank``: ``Σ_r r · P[r, j]``); forward + backward.

Objective for every cell: Σ out ⊙ G for a fixed random G. Both are O(B · n²) time; the streamed form's peak memory
is a few chunks of :data:`~diffrank.operators.streaming.CHUNK_BYTES` plus O(B · n), the dense form's several
``(B, n, n)`` buffers (skipped where three of them would exceed 2 GiB, the largest sizes being for the streamed
form alone).
"""

from __future__ import annotations

import torch

from diffrank.benchmark.harness import Measurement, compare_row, fwd_bwd, measure
from diffrank.operators import load
from diffrank.operators.base import RankingOperator

DENSE_MAX_BYTES = 2 * 2**30


def run(args) -> list[tuple[str, list[dict]]]:
    """Rows: operator x (B, n): (4, 500) with --quick, else (16, 2 000), (1, 10 000) and (1, 30 000)."""
    sizes = [(4, 500)] if args.quick else [(16, 2000), (1, 10000), (1, 30000)]
    dev = args.device
    rows = []
    for name in ("neuralsort", "softsort"):
        op = load(name, backend="torch").to(dev)
        for B, n in sizes:
            x = torch.randn(B, n, device=dev)
            ours = measure(fwd_bwd(op.soft_rank, x), dev, max_seconds=args.max_seconds)
            if 3 * B * n * n * x.element_size() > DENSE_MAX_BYTES:
                ref = Measurement(float("nan"), float("nan"), error="skip: dense P > 2 GiB")
            else:
                ref = measure(fwd_bwd(lambda s, op=op: RankingOperator._soft_rank(op, s), x), dev,
                              max_seconds=args.max_seconds)
            rows.append(compare_row(f"{name} soft_rank streamed", {"B": B, "n": n}, ours, ref, "dense P"))
    return [("Streamed soft rank (chunks of P's rows, recomputed in backward) vs dense P, forward+backward", rows)]
