"""How the report pools the runs of a paper row into a line (diffrank.experiments.records.matching; the lines as
cells: .table_cells): one run per config and seed, runs with other settings are variant lines (never pooled with
the row), the seeds of one line run by several code versions list them all, an archived run is not hidden behind
a re-run that reused its folder, and diverged or interrupted runs are never pooled."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from diffrank.experiments.records.archive import find_records
from diffrank.experiments.records.matching import collect_runs
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
from diffrank.experiments.records.table_cells import table_rows


def _done(run_id: str, top1: float, seed: int = 0, overrides=(), sha: str = "a" * 40, finished: str = "1",
          status: str = "done", **config) -> RunRecord:
    paper = {"paper": "petersen_thesis_2022", "table": "7.1", "dataset": "mnist", "model": "fc5_relu_100",
             "method": "Regular", "setting": "optimizer=sgd;epochs=1;model_label=M1"}
    return RunRecord.from_dict({
        "schema": 2, "status": status, "run_id": run_id, "paper": paper, "metrics": {"test/top1": top1},
        "seed": seed, "overrides": ["experiment=x", f"seed={seed}", *overrides], "git_sha": sha, "git_dirty": False,
        "optimizer_steps": 100, "global_batch": 100, "finished_at": finished,
        "config": {"seed": seed, "model": {"lr": config.get("lr", 0.001)}}})


def _lines(records):
    result = collect_runs([(Path(f"/r/{i}/results.json"), r) for i, r in enumerate(records)])
    return [ln for lines in result["tables"].values() for ln in lines if ln["runs"]], result


def test_one_run_per_config_and_seed():
    """Two identical seed-0 runs are one run (the later), not "94.28 ± 0.00, 2 runs"."""
    lines, _ = _lines([_done("a", 0.9428, finished="1"), _done("b", 0.9428, finished="2")])
    assert [(ln["runs"], ln["std"]) for ln in lines] == [(1, None)]
    assert lines[0]["duplicates"] == 1
    lines, _ = _lines([_done("a", 0.9428), _done("b", 0.95, seed=1)])
    assert [ln["runs"] for ln in lines] == [2]


def test_runs_with_other_settings_are_variants_not_the_row():
    """A row run with lr=0.05 is a variant line, not the row; lr 0.01 and 0.001 runs are not pooled."""
    lines, _ = _lines([_done("a", 0.9475), _done("b", 0.7503, overrides=["model.optimizer.lr=0.05"], lr=0.05),
                       _done("c", 0.90, overrides=["model.optimizer.lr=0.01"], lr=0.01),
                       _done("d", 0.91, overrides=["model.optimizer.lr=0.001"], lr=0.001)])
    assert sorted(round(ln["mean"], 2) for ln in lines) == [75.03, 90.0, 91.0, 94.75]  # four lines, none pooled
    by_variant = {ln["variant"]: ln["mean"] for ln in lines}
    assert by_variant == pytest.approx({"": 94.75, "model.optimizer.lr=0.05": 75.03, "model.optimizer.lr=0.01": 90.0,
                                        "model.optimizer.lr=0.001": 91.0})
    header, cells_ = table_rows(lines)
    assert "variant of the row" in header
    # where a run ran, its seed and what has a column of its own do not make a variant
    assert _done("e", 0.9, overrides=["paths.data_dir=/d", "trainer.max_steps=5", "data=digits_sort"]).variant == ""


def test_mixed_code_versions_are_listed_and_archived_runs_not_hidden(tmp_path):
    """`make report` over results/ and outputs/: an archived record is not hidden behind a re-run that reused its
    folder (another run id). Seeds of one cell run by two code versions: the line lists both."""
    folder = tmp_path / "outputs" / "seed0"
    archived = _done("a", 0.9428, finished="1")
    archived.run_dir = str(folder)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.jsonl.gz").write_bytes(gzip.compress((json.dumps(archived.to_dict()) + "\n").encode()))
    rerun = _done("b", 0.6677, seed=1, finished="2")
    rerun.run_dir = str(folder)
    rerun.write(folder / RECORD_FILE)
    found = find_records([tmp_path / "results", tmp_path / "outputs"])
    assert sorted(r.to_dict().get("run_id") for _, r in found) == ["a", "b"]
    lines, _ = _lines([_done("a", 0.94, sha="1" * 40), _done("b", 0.95, seed=1, sha="2" * 40)])
    header, rows = table_rows(lines)
    assert rows[0][header.index("code versions")] == "1111111111, 2222222222"
    assert lines[0]["codes"] == ["1111111111", "2222222222"]


def test_diverged_and_interrupted_runs_are_never_pooled():
    lines, result = _lines([_done("a", 0.94), _done("b", 0.01, seed=1, status="diverged"),
                            _done("c", 0.5, seed=2, status="interrupted")])
    assert [ln["runs"] for ln in lines] == [1]
    assert sorted(s for _, s in result["not_done"]) == ["diverged", "interrupted"]
