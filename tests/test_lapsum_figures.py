"""``--suite lapsum_figures`` (diffrank.benchmark.lapsum_figures) and the official LapSum reference.

The stopping rule and the CD ranking on synthetic rows; our LapSum against the official C++ extension (skipped
unless ``make lapsum-reference`` built it); a quick smoke run of the whole suite (slow). No time is asserted.
"""

from __future__ import annotations

import csv
import math

import pytest
import torch

from diffrank.benchmark import lapsum_figures as lf
from diffrank.benchmark.harness import Measurement
from diffrank.benchmark.lapsum_reference import official_topk
from diffrank.operators import load


def test_stop_reason_time_memory_failure():
    assert lf._stop_reason(None, 1000, 2.0, 10.0, 1e9) is None
    assert lf._stop_reason((100, Measurement(0.01, 1e6)), 1000, 2.0, 10.0, 1e9) is None  # 1 s, 100 MB
    assert "cap 10 s" in lf._stop_reason((100, Measurement(0.2, 1e6)), 1000, 2.0, 10.0, 1e9)  # 20 s
    assert "predicted >" in lf._stop_reason((100, Measurement(0.01, 2e7)), 1000, 2.0, 10.0, 1e9)  # 2 GB
    assert "failed at n = 100" in lf._stop_reason((100, Measurement(math.nan, math.nan, error="MemoryError")),
                                                  1000, 1.2, 10.0, 1e9)


def test_cd_ranks_puts_stopped_methods_last():
    rows = []
    for n in (100, 1000, 10000):
        for k in ("1", "10"):
            for method, t in (("fast", 1.0), ("mid", 2.0), ("slow", 3.0 if n < 10000 else math.nan)):
                rows.append({"table": "topk", "method": method, "n": n, "k": k, "mode": "forward", "seconds": t})
    avg, pvals, blocks = lf.cd_ranks(rows, "seconds", "forward")
    assert blocks == 6 and list(avg.index) == ["fast", "mid", "slow"]
    assert avg["fast"] == 1 and avg["slow"] == 3
    assert set(pvals.columns) == {"fast", "mid", "slow"}


def test_official_lapsum_equals_ours_float64():
    """Values and gradients equal to 1e-8 (float64) on the same inputs; skipped when not built."""
    f = official_topk()
    if f is None:
        pytest.skip("official LapSum extension not built (make lapsum-reference)")
    for beta in (1.0, 2.0, 0.5):  # α = -1/β exact in float32 (the extension's alpha is a C++ float)
        op = load("lapsum", beta=beta)
        for n, k in ((1000, 1), (1000, 10), (1000, 100), (7, 3)):
            x = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n + k))
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            a, b = op.topk_membership(xa, [k])[:, 0], f(xb, k, beta)
            g = torch.randn(a.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
            (a * g).sum().backward()
            (b * g).sum().backward()
            assert (a - b).abs().max() < 1e-8 and (xa.grad - xb.grad).abs().max() < 1e-8


@pytest.mark.slow  # about 1.5 minutes on 2 cores
def test_quick_run_writes_csv_figures_and_cd(tmp_path):
    from diffrank import benchmark

    benchmark.main(["--suite", "lapsum_figures", "--quick", "--figures-dir", str(tmp_path), "--max-seconds", "2"])
    for name in ("lapsum_time.png", "lapsum_memory.png", "lapsum_cd_time.png", "lapsum_cd_memory.png",
                 "lapsum_error.png", "lapsum_permutation.png", "lapsum_figures.csv"):
        assert (tmp_path / name).stat().st_size > 0, name
    with open(tmp_path / "lapsum_figures.csv") as fh:
        rows = list(csv.DictReader(fh))
    methods = {r["method"] for r in rows if r["table"] == "topk"}
    assert {"lapsum", "sparse_soft_topk", "dftopk", "soft_topk"} <= methods
    lap = [r for r in rows if r["method"] == "lapsum" and r["mode"] == "forward+backward"]
    assert lap and all(float(r["seconds"]) > 0 for r in lap)
    errs = [float(r["error"]) for r in rows if r["mode"] == "error" and r["method"] == "sparse_soft_topk"
            and r["beta"] == "100.0"]
    assert errs and all(0 <= e <= 1 for e in errs)
