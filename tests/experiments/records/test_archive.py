"""Run archives (diffrank.experiments.records.archive): records kept in the repository give the report the same lines as
the run folders they came from, each run once."""

from __future__ import annotations

import gzip
import json

import pytest

from diffrank.experiments.records import archive, matching

CAUCHY5 = {"paper": "petersen_thesis_2022", "table": "3.7", "dataset": "mnist4", "method": "Cauchy CDF",
           "network": "odd_even", "n": 5}


def _run(root, name, em, status="done", finished="2026-11-26T10:00:00+0000"):
    d = root / name
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({
        "schema": 2, "status": status, "paper": CAUCHY5, "metrics": {"test/em": em} if status == "done" else {},
        "optimizer_steps": 1000, "global_batch": 20, "run_dir": str(d), "finished_at": finished,
        "seed": int(name[-1])}))
    return d


def _em(result):
    return next(ln for ln in result["tables"][("petersen_thesis_2022", "3.7")] if ln["metric"] == "EM")


def test_archive_gives_the_report_of_its_run_folders(tmp_path):
    runs = tmp_path / "outputs"
    for i, em in enumerate((0.80, 0.84, 0.78)):
        _run(runs, f"seed{i}", em)
    _run(runs, "seed9", None, status="failed")
    out = tmp_path / "results" / "t3_7.jsonl.gz"
    assert archive.write_archive([runs], out) == 3  # the failed run is not archived
    from_folders, from_archive = matching.collect([runs]), matching.collect([out])
    assert _em(from_archive)["ours"] == pytest.approx([80.0, 84.0, 78.0])
    assert _em(from_archive)["ours"] == _em(from_folders)["ours"]
    assert _em(from_archive)["run_dirs"] == [str(runs / f"seed{i}") for i in range(3)]
    # a run both archived and still in its folder counts once; the folder searched finds the archive too
    both = matching.collect([runs, out])
    assert _em(both)["runs"] == 3 and both["runs"] == 3  # the failed run is no result: listed as not done
    assert both["not_done"] == [(str(runs / "seed9" / "results.json"), "failed")]
    assert _em(matching.collect([tmp_path]))["runs"] == 3


def test_archive_is_byte_stable_and_keeps_what_it_held(tmp_path):
    runs = tmp_path / "outputs"
    _run(runs, "a/seed0", 0.8)
    out = tmp_path / "t.jsonl.gz"
    archive.write_archive([runs], out)
    first = out.read_bytes()
    archive.write_archive([runs], out)
    assert out.read_bytes() == first  # same runs, same bytes (sorted lines, zero gzip timestamp)
    _run(tmp_path / "later", "b/seed1", 0.9)
    assert archive.write_archive([tmp_path / "later"], out) == 2  # the earlier run stays
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    assert [json.loads(line)["metrics"]["test/em"] for line in lines] == [0.9, 0.8]  # by run folder
    # a run archived again after it resumed and finished later: its new record replaces the old one
    (runs / "a/seed0/results.json").unlink()
    (runs / "a/seed0").rmdir()
    _run(runs, "a/seed0", 0.85, finished="2026-11-27T10:00:00+0000")
    assert archive.write_archive([runs], out) == 2
    assert [r.metrics["test/em"] for _, r in archive.read_archive(out)] == [0.9, 0.85]


def test_bad_archives_are_refused_with_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"status": "done"}\n[1, 2]\n'))
    with pytest.raises(ValueError, match=r"bad.jsonl.gz, line 2: a list"):
        matching.collect([bad])
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a run archive"):
        archive.read_archive(bad)
    with pytest.raises(ValueError, match="ends in .jsonl.gz"):
        archive.write_archive([tmp_path], tmp_path / "x.json")
    with pytest.raises(FileNotFoundError):
        archive.find_records([tmp_path / "nope"])


def test_the_repository_archives_match_reference_rows():
    """Every archived run of results/ (the records behind docs/ numbers) is finished, and every one that names a
    published row (``paper:``; digits100 runs name none) matches it; the Table 7.1 CPU cells hold their 20 seeds."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[3] / "results"
    records = archive.find_records([results])
    assert records and all(r.status == "done" for _, r in records)
    collected = matching.collect([results])
    assert collected["unmatched"] == [] and collected["runs"] == sum(r.paper is not None for _, r in records)
    t71 = [ln for ln in collected["tables"][("petersen_thesis_2022", "7.1")] if ln["runs"] and ln["device"] == "cpu"]
    assert t71 and all(ln["runs"] == 20 for ln in t71 if ln["budget"] == "550×100")


def test_an_archived_run_is_kept_when_its_folder_is_reused(tmp_path):
    """Archive a cell, delete one seed's folder, re-run it with -- model.optimizer.lr=0.05, archive again: both
    records are kept (runs are told apart by their id, not their folder)."""
    from diffrank.experiments.records.record import RECORD_FILE, RunRecord

    def rec(**fields):
        return RunRecord.from_dict({"schema": 2, "status": "done", **fields})

    folder = tmp_path / "cells" / "seed0"
    rec(run_id="a" * 32, run_dir=str(folder), metrics={"test/top1": 0.9428},
        finished_at="2026-01-01T00:00:00").write(folder / RECORD_FILE)
    out = tmp_path / "cell.jsonl.gz"
    archive.write_archive([tmp_path / "cells"], out)
    (folder / RECORD_FILE).unlink()
    rec(run_id="b" * 32, run_dir=str(folder), metrics={"test/top1": 0.6677}, overrides=["model.optimizer.lr=0.05"],
        finished_at="2026-01-02T00:00:00").write(folder / RECORD_FILE)
    assert archive.write_archive([tmp_path / "cells"], out) == 2
    assert sorted(r.metrics["test/top1"] for _, r in archive.read_archive(out)) == [0.6677, 0.9428]
    # the same run archived again (a resume rewrote its record) is still stored once: its latest record
    rec(run_id="b" * 32, run_dir=str(folder), metrics={"test/top1": 0.7},
        finished_at="2026-01-03T00:00:00").write(folder / RECORD_FILE)
    assert archive.write_archive([tmp_path / "cells"], out) == 2
    assert sorted(r.metrics["test/top1"] for _, r in archive.read_archive(out)) == [0.7, 0.9428]
