"""LapSum soft top-k against the official CPU extension (Struski et al. 2025), in one process, interleaved.

    python -m diffrank.benchmark --suite lapsum_parity            # B ∈ {1, 64}, n ∈ {10³, 10⁴, 10⁵}, + (8, 10⁵)
    python -m diffrank.benchmark --suite lapsum_parity --quick    # n = 10³ only

Each cell times k = ``--k`` (default 5) soft top-k memberships, forward + backward (``p.backward(v)``, v fixed),
of ``LapSum(β = 1).topk_membership`` (the public method: validation included) and of the official extension's
``forward`` / ``vjp`` (:mod:`diffrank.benchmark.lapsum_reference`, ``make lapsum-reference``; α = -1), alternating
one call of each, so that a change of machine load hits both; the time of a side is the median of its calls, in
CPU time of the process (``time.process_time``: a call preempted by other processes is not charged for their time,
which on a shared machine dominates wall-clock times of calls longer than a scheduler slice).
``ratio`` = official / ours (≥ 1: ours at least as fast). The scores are standard normal, float32 and float64.

A second table gives the first call in a fresh process (numba's cache warm or cold: the numba cache directory
decides, see :mod:`diffrank.operators.lapsum_cpu`): import, one forward + backward of a (2, 100) float64 top-k.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch

CELLS = [(1, 1000), (1, 10_000), (1, 100_000), (64, 1000), (64, 10_000), (64, 100_000), (8, 100_000)]

_FIRST_CALL = (
    "import time; t0 = time.perf_counter(); import torch; from diffrank.operators.lapsum import LapSum; "
    "t1 = time.perf_counter(); x = torch.randn(2, 100, dtype=torch.float64, requires_grad=True); "
    "LapSum(1.0).topk_membership(x, [5]).sum().backward(); t2 = time.perf_counter(); "
    "print(f'{t1 - t0:.3f} {t2 - t1:.3f}')"
)


def _interleaved(fns: list, budget: float, max_calls: int = 200) -> list[float]:
    """Median CPU seconds per call of each function, calling them in turn until ``budget`` seconds have passed."""
    for f in fns:  # warm-up (numba compilation, allocator)
        f()
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < max_calls and (len(times[0]) < 3 or time.perf_counter() - start < budget):
        for f, ts in zip(fns, times):
            t0 = time.process_time()
            f()
            ts.append(time.process_time() - t0)
    return [statistics.median(ts) for ts in times]


def first_call_seconds() -> tuple[float, float]:
    """(import, first top-k forward + backward) seconds in a fresh interpreter (this environment)."""
    out = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True)
    if out.returncode:
        return float("nan"), float("nan")  # the table says "nan": the child's error is not this suite's
    imp, call = out.stdout.split()
    return float(imp), float(call)


def run(args) -> list[tuple[str, list[dict]]]:
    """The speed table (skipped rows without the official extension) and the first-call table."""
    from diffrank.benchmark.harness import fmt_time
    from diffrank.benchmark.lapsum_reference import official_topk
    from diffrank.operators.lapsum import LapSum

    official = official_topk()
    k, op = args.k, LapSum(1.0)
    cells = [c for c in CELLS if c[1] <= 1000] if args.quick else CELLS
    rows = []
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for B, n in cells:
            x = torch.randn(B, n, generator=g).to(dtype).requires_grad_()
            v = torch.randn(B, n, generator=g).to(dtype)

            def ours(x=x, v=v):
                """One forward + backward of our LapSum top-k on this cell (the timed call)."""
                op.topk_membership(x, [k])[:, 0].backward(v)

            row = {"dtype": str(dtype).removeprefix("torch."), "B": B, "n": n, "k": k}
            if official is None:
                rows.append({**row, "ours": fmt_time(_interleaved([ours], 0.5)[0]), "official": "skip: not built",
                             "ratio": "-"})
                continue

            def theirs(x=x, v=v):
                """One forward + backward of the official extension on this cell (the timed call)."""
                official(x, k, 1.0).backward(v)

            t_ours, t_off = _interleaved([ours, theirs], min(2.0, args.max_seconds))
            rows.append({**row, "ours": fmt_time(t_ours), "official": fmt_time(t_off),
                         "ratio": f"{t_off / t_ours:.2f}"})
    imp, call = first_call_seconds()
    first = [{"what": "import diffrank.operators.lapsum", "seconds": f"{imp:.3f}"},
             {"what": "first top-k forward + backward (2, 100) float64", "seconds": f"{call:.3f}"}]
    return [("LapSum top-k vs the official CPU extension (forward + backward; ratio = official / ours)", rows),
            ("LapSum first call in a fresh process", first)]
