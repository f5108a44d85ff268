"""The report and the run archives on records a hand, another tool or a full disk got wrong: each run counted once
and only when finished, a seed written as a string is the same seed, an empty archive is no archive, a record the
report cannot compare is named and left out (never pooled, never an abort), a misspelt metric prefix is said, and
a full disk leaves no empty PNG behind."""

from __future__ import annotations

import errno
import gzip
import json

import pytest

from diffrank.experiments.analysis import report
from diffrank.experiments.records import archive, matching

CAUCHY5 = {"paper": "petersen_thesis_2022", "table": "3.7", "dataset": "mnist4", "method": "Cauchy CDF",
           "network": "odd_even", "n": 5}
TABLE = ("petersen_thesis_2022", "3.7")


def _record(seed, em, **fields):
    """A finished run of the Cauchy n = 5 row (schema 2), as an archive line holds it."""
    return {"schema": 2, "status": "done", "paper": CAUCHY5, "metrics": {"test/em": em, "val/em": em},
            "overrides": ["experiment=sorting/thesis_t3_7/odd_even_cauchy_n5", f"seed={seed}"],
            "config": {"seed": seed, "operator": {"beta": 1.0}}, "seed": seed, "optimizer_steps": 1000,
            "global_batch": 20, "run_dir": f"outputs/cauchy/seed{seed}",
            "finished_at": f"2026-11-2{seed}T10:00:00+0000", **fields}


def _archive(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    return path


def _em(result):
    return next(ln for ln in result["tables"][TABLE] if ln["metric"] == "EM")


def test_archived_runs_without_a_run_folder_are_each_a_run(tmp_path):
    """Records with neither run_id nor run_dir are told apart by their config, seed and finish time (or their
    line), never pooled as one run because they share their archive."""
    records = [_record(s, em, run_dir=None) for s, em in enumerate((0.80, 0.84, 0.78))]
    out = _archive(tmp_path / "nodir" / "a.jsonl.gz", records)
    result = matching.collect([out])
    assert _em(result)["runs"] == 3 and _em(result)["ours"] == pytest.approx([80.0, 84.0, 78.0])
    # without a finish time either: one run per line of the archive
    bare = [{k: v for k, v in r.items() if k != "finished_at"} for r in records]
    assert _em(matching.collect([_archive(tmp_path / "bare" / "a.jsonl.gz", bare)]))["runs"] == 3
    # archiving such an archive again keeps every run of it
    again = tmp_path / "again.jsonl.gz"
    assert archive.write_archive([out], again) == 3
    assert archive.write_archive([out], again) == 3


def test_only_finished_runs_are_pooled(tmp_path):
    """A status other than done (misspelt, missing, running) is no result: listed as not done, never pooled."""
    records = [_record(s, em) for s, em in enumerate((0.80, 0.84, 0.78))]
    records += [_record(3, 0.001, status="FAILED"), _record(4, 0.001, status="running"),
                {k: v for k, v in _record(5, 0.001).items() if k != "status"}]
    result = matching.collect([_archive(tmp_path / "a.jsonl.gz", records)])
    assert _em(result)["runs"] == 3 and _em(result)["mean"] == pytest.approx(80.666666)
    assert sorted(status for _, status in result["not_done"]) == ["FAILED", "incomplete", "running"]


def test_a_seed_written_as_a_string_is_the_same_seed(tmp_path, capsys):
    """A copy of seed 0's record with ``"seed": "0"`` (another run folder) is seed 0 again, a re-run: 3 runs for 3
    seeds; a seed that is no integer is named and its record left out."""
    records = [_record(s, em) for s, em in enumerate((0.80, 0.84, 0.78))]
    records.append({**_record(0, 0.80), "seed": "0", "run_dir": "elsewhere/seed0"})
    records.append({**_record(7, 0.10), "seed": "seven", "run_dir": "elsewhere/seed7"})
    out = _archive(tmp_path / "a.jsonl.gz", records)
    line = _em(matching.collect([out]))
    assert line["runs"] == 3 and line["duplicates"] == 1
    assert f"{out}, line 5: seed 'seven' is not an integer; record left out" in capsys.readouterr().err


def test_an_empty_archive_is_not_a_run_archive(tmp_path, capsys):
    """A 0-byte *.jsonl.gz beside a good archive is refused like a truncated one, naming it; on the command line
    as an error, without a traceback."""
    _archive(tmp_path / "runs" / "a.jsonl.gz", [_record(0, 0.8)])
    (tmp_path / "runs" / "b.jsonl.gz").write_bytes(b"")
    with pytest.raises(ValueError, match=r"b.jsonl.gz: not a run archive .*empty file"):
        matching.collect([tmp_path / "runs"])
    with pytest.raises(SystemExit) as exited:
        report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "o"), "--quiet"])
    assert "error:" in str(exited.value.code) and "b.jsonl.gz: not a run archive" in str(exited.value.code)


def test_a_metric_prefix_no_record_has_is_an_error(tmp_path):
    """--metric-prefix tset/ (a typo): said, naming the prefixes the records have, instead of a table of dashes."""
    out = _archive(tmp_path / "a.jsonl.gz", [_record(0, 0.8)])
    with pytest.raises(SystemExit) as exited:
        report.main([str(out), "--out", str(tmp_path / "o"), "--metric-prefix", "tset/", "--quiet"])
    message = str(exited.value.code)
    assert "'tset/'" in message and "test/, val/" in message
    assert not (tmp_path / "o" / "report.md").exists()


def test_a_record_without_its_config_is_named_and_left_out(tmp_path, capsys):
    """One seed's config removed: that record is named and left out; its line is not a β selection it never was
    ('best val of 2 β')."""
    records = [_record(s, em) for s, em in enumerate((0.80, 0.84, 0.78))]
    del records[2]["config"]
    result = report.write_report([_archive(tmp_path / "a.jsonl.gz", records)], tmp_path / "o", quiet=True)
    line = _em(result)
    assert line["runs"] == 2 and line["selected"] is None
    assert result["left_out"] == [("outputs/cauchy/seed2/results.json",
                                   "no config recorded (its β, settings and seed cannot be checked against its "
                                   "line's other runs)")]
    assert "outputs/cauchy/seed2/results.json: no config recorded" in capsys.readouterr().err
    md = (tmp_path / "o" / "report.md").read_text()
    assert "best val of" not in md and "`outputs/cauchy/seed2/results.json`: no config recorded" in md


def test_a_record_with_a_field_of_the_wrong_type_is_named_not_an_abort(tmp_path, capsys):
    """metrics a list, config a list, finished_at a number: each record named and left out; the report is
    written from the others."""
    runs = tmp_path / "runs"
    for name, bad in (("metrics", {"metrics": [1]}), ("config", {"config": [1]}), ("finished", {"finished_at": 5})):
        (runs / name).mkdir(parents=True)
        (runs / name / "results.json").write_text(json.dumps({**_record(9, 0.5), **bad, "run_dir": None}))
    _archive(runs / "good.jsonl.gz", [_record(0, 0.8)])
    result = report.write_report([runs], tmp_path / "o", quiet=True)
    assert _em(result)["runs"] == 1
    err = capsys.readouterr().err
    assert f"{runs / 'metrics' / 'results.json'}: metrics is an array, not an object; record left out" in err
    assert f"{runs / 'config' / 'results.json'}: config is an array" in err
    assert f"{runs / 'finished' / 'results.json'}: finished_at is a number, not a string" in err
    # an archive being extended never drops such a record: it is refused, named
    out = _archive(tmp_path / "held.jsonl.gz", [{**_record(1, 0.8), "metrics": [1]}])
    with pytest.raises(ValueError, match=r"held.jsonl.gz, line 1: metrics is an array"):
        archive.write_archive([runs / "good.jsonl.gz"], out)


def test_a_full_disk_names_the_file_and_leaves_no_empty_png(tmp_path, monkeypatch):
    """ENOSPC while the plot is saved: 'error: … cannot write …/report.png: No space left on device', exit status
    1, and no 0-byte report.png."""
    from matplotlib.figure import Figure

    def full_disk(self, fname, *args, **kwargs):
        open(fname, "wb").close()  # the file is created, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    out = _archive(tmp_path / "a.jsonl.gz", [_record(s, em) for s, em in enumerate((0.80, 0.84))])
    with pytest.raises(SystemExit) as exited:
        report.main([str(out), "--out", str(tmp_path / "o"), "--quiet"])
    assert f"cannot write {tmp_path / 'o' / 'report.png'}: No space left on device" in str(exited.value.code)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["report.md"]


def test_report_and_archive_command_lines_say_what_is_wrong(tmp_path):
    """A folder that does not exist: 'error: no such file or folder', no traceback (report and archive)."""
    with pytest.raises(SystemExit) as exited:
        report.main([str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--quiet"])
    assert str(exited.value.code) == f"error: no such file or folder: {tmp_path / 'nope'}"
    with pytest.raises(SystemExit) as exited:
        archive.main([str(tmp_path / "nope"), "--out", str(tmp_path / "x.jsonl.gz")])
    assert str(exited.value.code) == f"error: no such file or folder: {tmp_path / 'nope'}"


def test_curves_and_pk_report_command_lines_say_what_is_wrong(tmp_path):
    """The other readers of run folders: a missing folder, or a metrics.csv cell that is not a number (named with
    its file and line), is an 'error: …' line, not a traceback."""
    from diffrank.experiments.analysis import curves, report_pk

    with pytest.raises(SystemExit) as exited:
        curves.main([str(tmp_path / "nope"), "--out", str(tmp_path / "c.png")])
    assert str(exited.value.code) == f"error: no such run folder: {tmp_path / 'nope'}"
    log = tmp_path / "run" / "csv" / "version_0" / "metrics.csv"
    log.parent.mkdir(parents=True)
    log.write_text("step,val/em5\n9,0.5\n19,n/a%\n")
    with pytest.raises(SystemExit) as exited:
        curves.main([str(tmp_path / "run"), "--out", str(tmp_path / "c.png")])
    assert str(exited.value.code) == f"error: {log}, line 3: step '19' or val/em5 'n/a%' is not a number"
    with pytest.raises(SystemExit) as exited:
        report_pk.main([str(tmp_path / "nope")])
    assert str(exited.value.code) == f"error: no such file or folder: {tmp_path / 'nope'}"
