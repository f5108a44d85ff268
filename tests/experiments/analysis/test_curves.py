"""Validation curves from CSV logs (a resumed run's second log version included)."""

from __future__ import annotations

import pytest

from diffrank.experiments.analysis import curves
from diffrank.experiments.records.record import RunRecord


def _log(run, version, rows):
    d = run / "csv" / f"version_{version}"
    d.mkdir(parents=True)
    lines = ["epoch,step,train/loss,val/em5"] + [f"0,{s},{loss},{em5}" for s, loss, em5 in rows]
    (d / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_curve_merges_versions_and_plots(tmp_path):
    run = tmp_path / "cell" / "beta30_seed0"
    _log(run, 0, [(499, 0.3, ""), (999, "", 0.4), (1999, "", 0.5)])
    _log(run, 1, [(1999, "", 0.55), (2999, "", 0.6)])  # resumed after step 2000: the later value wins
    assert curves.read_curve(run, "val/em5") == [(1000, 0.4), (2000, 0.55), (3000, 0.6)]
    RunRecord(status="done", metrics={"test/em5": 0.61}).write(run / "results.json")
    assert curves.run_dirs([tmp_path]) == [run]
    out = curves.plot([tmp_path], "val/em5", tmp_path / "f.png", title="t")
    assert out.stat().st_size > 2000
    with pytest.raises(ValueError, match="logged val/ew"):
        curves.plot([tmp_path], "val/ew", tmp_path / "g.png")
    with pytest.raises(FileNotFoundError):
        curves.run_dirs([tmp_path / "nope"])
