"""The benchmark's grid suite (diffrank.benchmark.grid): CSV, PNG, roofline, Table 3.9, bandwidth.

A CPU smoke run on tiny sizes; nothing here asserts a time.
"""

from __future__ import annotations

import csv
import math

import pytest

from diffrank import benchmark
from diffrank.benchmark import grid


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # ~21 s; the other suites' dry runs stay in the default suite
def test_grid_smoke_run_writes_csv_and_png(tmp_path):
    out_csv, out_png = tmp_path / "g.csv", tmp_path / "g.png"
    benchmark.main(["--suite", "grid", "--quick", "--operators", "softsort", "fast_soft_sort",
                    "--n", "8", "16", "--ks", "2", "--batches", "3", "--csv", str(out_csv),
                    "--png", str(out_png), "--max-seconds", "5", "--table39", "--backends", "torch"])
    rows = _rows(out_csv)
    assert rows and list(rows[0]) == grid.CSV_FIELDS
    ours = [r for r in rows if r["table"] == "grid" and r["impl"] in ("torch", "default", "auto")]
    assert {(r["operator"], int(r["n"])) for r in ours} == {(o, n) for o in ("softsort", "fast_soft_sort")
                                                          for n in (8, 16)}
    for r in ours:
        n, B = int(r["n"]), int(r["B"])
        assert B == 3 and float(r["fwd_bwd_s"]) > 0 and float(r["fwd_s"]) > 0
        out = n * (2 if r["operator"] == "softsort" else 1)  # k = 2 rows of P, or one rank per item
        assert int(r["bytes_lower_bound"]) == 4 * B * (2 * n + 2 * out)
        assert math.isclose(float(r["achieved_Bps"]), int(r["bytes_lower_bound"]) / float(r["fwd_bwd_s"]))
        assert math.isclose(float(r["roofline_frac"]), float(r["achieved_Bps"]) / float(r["peak_Bps"]))
        assert math.isclose(float(r["per_sample_s"]), float(r["fwd_bwd_s"]) / B)
    assert {r["k"] for r in ours if r["operator"] == "fast_soft_sort"} == {"-"}  # soft rank: no k
    # Table 3.9: the thesis figures are attached to the matching (operator, n)
    t39 = {(r["operator"], int(r["n"]), int(r["B"])): r for r in rows if r["table"] == "table3.9"}
    assert float(t39[("fast_soft_sort", 16, 1)]["thesis_cpu_s"]) == pytest.approx(215e-6)
    assert math.isnan(float(t39[("fast_soft_sort", 16, 1)]["thesis_gpu_s"]))
    assert ("softsort", 16, 1) not in t39  # not in the thesis' table
    assert out_png.stat().st_size > 10_000


def test_table39_reference_is_read():
    t = grid.thesis_table39()
    assert t[("dsn", "odd_even", 1024)]["gpu_time_s"] == pytest.approx(0.66)
    assert t[("dsn", "bitonic", 16)]["memory_bytes"] == pytest.approx(28000)
    assert t[("neuralsort", "", 128)]["cpu_time_s"] == pytest.approx(177e-6)


@pytest.mark.parametrize("name,expected", [("NVIDIA H100 80GB HBM3", 3.35e12), ("NVIDIA H100 PCIe", 2.0e12),
                                           ("NVIDIA H200", 4.8e12), ("NVIDIA H100 NVL", 3.9e12)])
def test_peak_bandwidth_table(monkeypatch, name, expected):
    monkeypatch.setattr(grid.torch.cuda, "get_device_name", lambda *a: name)
    assert grid.peak_bandwidth("cuda", measure_copy=False) == (expected, f"table: {name}")


def test_unknown_device_falls_back_to_measurement(monkeypatch):
    monkeypatch.setattr(grid.torch.cuda, "get_device_name", lambda *a: "Some Future GPU")
    assert grid.peak_bandwidth("cuda", measure_copy=False)[1] == "unknown"
    bw, source = grid.peak_bandwidth("cpu")
    assert source == "measured copy_" and bw > 1e8  # any machine copies more than 100 MB/s


def test_operators_without_a_backend_argument_run_once(monkeypatch):
    monkeypatch.setattr(grid, "_has_backend", lambda name: False)
    impls = grid.build_impls("softsort", ["torch", "triton"], "cpu")
    assert [i[0] for i in impls] == ["default"] and impls[0][1] is not None


def test_a_backend_the_operator_rejects_is_a_skipped_row(monkeypatch):
    import diffrank.operators

    real = diffrank.operators.load

    def no_backend_yet(name, **kw):
        if "backend" in kw:
            raise TypeError("__init__() got an unexpected keyword argument 'backend'")
        return real(name, **kw)

    monkeypatch.setattr(grid, "_has_backend", lambda name: True)
    monkeypatch.setattr(diffrank.operators, "load", no_backend_yet)
    impls = grid.build_impls("softsort", ["torch", "triton"], "cpu")
    assert impls[0][0] == "torch" and impls[0][1] is None and impls[0][2].startswith("skip: TypeError")
    assert impls[1][1] is None and impls[1][2].startswith("skip")  # triton: no CUDA here (or rejected)


def test_prediction_skips_sizes_past_the_budget():
    last = {"torch": (100, 1.0)}
    assert grid._predicted_too_slow(last, "torch", 1000, budget=60.0)  # 1 s x 100 = 100 s > 60 s
    assert grid._predicted_too_slow(last, "torch", 200, budget=60.0) is None
    assert "failed" in grid._predicted_too_slow({"torch": (100, float("nan"))}, "torch", 1000, 60.0)


GRID = ["--suite", "grid", "--quick", "--operators", "softsort", "--backends", "torch", "--no-peers"]


@pytest.mark.parametrize("argv, message", [
    (["--suite", "basic", "--quick", "--batch", "0"], "argument --batch: at least 1, got 0"),
    ([*GRID, "--batches", "0"], "argument --batches: at least 1, got 0"),
    ([*GRID, "--batches", "4", "-2"], "argument --batches: at least 1, got -2"),
    ([*GRID, "--n", "0"], "argument --n: at least 1, got 0"),
    ([*GRID, "--ks", "0"], "argument --ks: at least 1, got 0"),
    ([*GRID, "--k", "0"], "argument --k: at least 1, got 0"),
    ([*GRID, "--table39", "--table39-batches", "0"], "argument --table39-batches: at least 1, got 0"),
    ([*GRID, "--max-seconds", "0"], "argument --max-seconds: a finite number > 0, got 0"),
    ([*GRID, "--max-seconds", "nan"], "argument --max-seconds: a finite number > 0, got nan"),
    ([*GRID, "--cap-gb", "-1"], "argument --cap-gb: a finite number > 0, got -1"),
    ([*GRID, "--device", "foo"], "argument --device: cpu, cuda or cuda:<index>, got 'foo'"),
])
def test_sizes_batches_times_and_devices_out_of_range_are_refused(capsys, argv, message):
    """B = 0 (timings of empty batches), --batches 0 (a ZeroDivisionError per set), a size, k or time below one, an
    unknown device: argparse refuses them, naming the flag, before any suite runs."""
    with pytest.raises(SystemExit) as exited:
        benchmark.main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_unwritable_outputs_and_a_missing_replot_folder_are_errors(tmp_path, capsys):
    """--csv under a file (not a folder): 'error: suite grid cannot write its files: …', no traceback; --replot of
    a folder without lapsum_figures.csv: a usage error naming it."""
    from diffrank.benchmark import lapsum_figures

    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exited:
        benchmark.main([*GRID, "--n", "8", "--batches", "2", "--csv", str(tmp_path / "file" / "g.csv")])
    assert str(exited.value.code).startswith("error: suite grid cannot write its files:")
    with pytest.raises(SystemExit) as exited:
        lapsum_figures.main(["--replot", str(tmp_path / "nope")])
    assert exited.value.code == 2 and "no lapsum_figures.csv there" in capsys.readouterr().err
