"""The P_K × method report (diffrank.experiments.analysis.report_pk and its command line) on synthetic results.json
files."""

from __future__ import annotations

import json

import pytest

from diffrank.experiments.analysis import report, report_pk
from diffrank.experiments.analysis.report_pk import (
    CLAIMS,
    canonical_pk,
    check_orderings,
    collect,
    format_report,
    grid,
    paper_grid,
    parse_pk,
    run_from_record,
)
from diffrank.experiments.records import matching
from diffrank.experiments.records.record import RunRecord

WEIGHTS = {"[1,0,0,0,0]": [1.0], "[0,0,0,0,1]": [0, 0, 0, 0, 1.0], "[.5,0,0,0,.5]": [0.5, 0, 0, 0, 0.5],
           "[.25,0,0,0,.75]": [0.25, 0, 0, 0, 0.75], "[.1,0,0,0,.9]": [0.1, 0, 0, 0, 0.9],
           "[.2,.2,.2,.2,.2]": [0.2] * 5}


def _record(op: str, pk: str, seed: int, top1: float, top5: float, wall: float = 100.0, **extra) -> dict:
    rec = {"status": "done", "seed": seed, "wall_time_s": wall, "variant_of": None,
           "metrics": {"test/top1": top1 / 100, "test/top5": top5 / 100},
           "config": {"benchmark": {"dataset": "fashion_pairs", "method": op, "operator": op, "pk": pk},
                      "pk": {"weights": WEIGHTS[pk]}}}
    rec.update(extra)
    return rec


def _write(folder, i: int, rec: dict) -> None:
    d = folder / str(i)
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps(rec))


def test_pk_spelling():
    assert parse_pk("[.5,0,0,0,.5]") == (0.5, 0, 0, 0, 0.5)
    assert canonical_pk([0.5, 0, 0, 0, 0.5]) == "[.5,0,0,0,.5]"
    assert canonical_pk([1.0]) == "[1,0,0,0,0]"
    assert canonical_pk([0.25, 0.0, 0.0, 0.0, 0.75]) == "[.25,0,0,0,.75]"
    with pytest.raises(ValueError, match="written like"):
        parse_pk("0.5,0.5")


def test_cells_average_seeds(tmp_path):
    _write(tmp_path, 0, _record("neuralsort", "[.5,0,0,0,.5]", 0, 70.0, 95.0, wall=100))
    _write(tmp_path, 1, _record("neuralsort", "[.5,0,0,0,.5]", 1, 72.0, 96.0, wall=120))
    _write(tmp_path, 2, _record("softmax_ce", "[1,0,0,0,0]", 0, 71.0, 94.0))
    _write(tmp_path, 3, _record("dsn", "[.1,0,0,0,.9]", 0, 69.0, 96.5, wall=None))
    _write(tmp_path, 4, {"status": "failed", "error": "boom"})                       # skipped
    _write(tmp_path, 5, _record("lapsum", "[0,0,0,0,1]", 0, 1.0, 5.0,
                                variant_of={"operator": "softsort"}))                # a variant: skipped
    _write(tmp_path, 6, {**_record("softsort", "[.2,.2,.2,.2,.2]", 0, 50, 90), "config": {}})  # no benchmark
    g = grid(collect([tmp_path, tmp_path / "0" / "results.json"]))  # a file given twice counts once
    assert set(g) == {("neuralsort", "[.5,0,0,0,.5]"), ("softmax_ce", "[1,0,0,0,0]"), ("dsn", "[.1,0,0,0,.9]")}
    cell = g[("neuralsort", "[.5,0,0,0,.5]")]
    assert cell["top1"] == pytest.approx(71.0) and cell["top5"] == pytest.approx(95.5)
    assert cell["n"] == 2 and cell["seeds"] == [0, 1] and cell["wall_s"] == pytest.approx(110)
    assert g[("softmax_ce", "[1,0,0,0,0]")]["top1"] == pytest.approx(71.0)
    assert g[("dsn", "[.1,0,0,0,.9]")]["wall_s"] is None
    assert collect([tmp_path], dataset="other") == []


def test_one_paper_key_new_and_old_records_read_alike(tmp_path):
    """A benchmark row's record carries its cell under the one ``paper`` key (``benchmark: <dataset>``); an older
    record (``paper`` null, ``config.benchmark``) reads as the same cell. Neither is a reference row of the paper
    report, which counts them as skipped, as it always did."""
    old = _record("neuralsort", "[.5,0,0,0,.5]", 0, 70.0, 95.0)
    new = {**old, "paper": {"benchmark": "fashion_pairs", "method": "neuralsort", "operator": "neuralsort",
                            "pk": "[.5,0,0,0,.5]"}, "config": {"pk": old["config"]["pk"]}}
    for rec in (RunRecord.from_dict(old), RunRecord.from_dict(new)):
        assert rec.benchmark_cell == {"dataset": "fashion_pairs", "method": "neuralsort", "operator": "neuralsort",
                                      "pk": "[.5,0,0,0,.5]"}
        assert rec.table_row is None and run_from_record(rec).top1 == pytest.approx(70.0)
    _write(tmp_path, 0, old)
    _write(tmp_path, 1, {**new, "seed": 1})
    assert grid(collect([tmp_path]))[("neuralsort", "[.5,0,0,0,.5]")]["n"] == 2
    result = matching.collect([tmp_path])
    assert result["skipped"] == 2 and result["runs"] == 0 and not result["unmatched"]
    row = {"paper": "petersen_thesis_2022", "table": "7.1"}
    assert RunRecord(paper=row).table_row == row and RunRecord(paper=row).benchmark_cell is None


def test_bad_records_raise(tmp_path):
    rec = _record("neuralsort", "[.5,0,0,0,.5]", 0, 70, 95)
    rec["config"]["pk"]["weights"] = [0.2] * 5
    with pytest.raises(ValueError, match="trained with"):
        run_from_record(RunRecord.from_dict(rec))
    rec = _record("neuralsort", "[.5,0,0,0,.5]", 0, 70, 95)
    del rec["config"]["benchmark"]["pk"]
    with pytest.raises(ValueError, match="lacks"):
        run_from_record(RunRecord.from_dict(rec))
    with pytest.raises(FileNotFoundError):
        collect([tmp_path / "nowhere"])


def test_paper_grid_cells():
    p = paper_grid()
    assert p[("neuralsort", "[.5,0,0,0,.5]")]["top1"] == 61.12 and p[("neuralsort", "[.5,0,0,0,.5]")]["top5"] == 86.47
    assert p[("softmax_ce", "[1,0,0,0,0]")]["top1"] == 61.27 and p[("softmax_ce", "[1,0,0,0,0]")]["top5"] == 85.31
    assert p[("softsort", "[0,0,0,0,1]")]["top1"] == 1.01           # Table 1's pure top-5 rows
    assert p[("dsn", "[.1,0,0,0,.9]")]["top1"] == 61.74
    assert p[("sinkhorn", "[.2,.2,.2,.2,.2]")]["tables"] == ["4"]     # printed by both tables, read from Table 4
    assert ("smooth_topk", "[0,0,0,0,1]") not in p and ("lapsum", "[.5,0,0,0,.5]") not in p


def _claims(rows, name, method=None):
    return {r["method"]: (r["paper"], r["ours"]) for r in rows if r["claim"] == name
            and (method is None or r["method"] == method)}


def test_orderings_on_the_paper_and_on_ours():
    ours = {("softmax_ce", "[1,0,0,0,0]"): {"top1": 70.0, "top5": 95.0},
            ("neuralsort", "[0,0,0,0,1]"): {"top1": 40.0, "top5": 95.5},
            ("neuralsort", "[.5,0,0,0,.5]"): {"top1": 71.0, "top5": 96.0},
            ("neuralsort", "[.25,0,0,0,.75]"): {"top1": 70.5, "top5": 96.0},
            ("neuralsort", "[.1,0,0,0,.9]"): {"top1": 69.0, "top5": 96.2},   # 2 points: no collapse
            ("neuralsort", "[.2,.2,.2,.2,.2]"): {"top1": 69.5, "top5": 94.0},
            ("dsn", "[0,0,0,0,1]"): {"top1": 72.0, "top5": 96.0},            # pure top-5 beats [.5,..,.5]
            ("dsn", "[.5,0,0,0,.5]"): {"top1": 71.0, "top5": 94.5},
            ("dsn", "[.1,0,0,0,.9]"): {"top1": 60.0, "top5": 94.0}}          # 11 points: a collapse
    rows = check_orderings(ours, paper_grid())
    assert {r["method"] for r in rows} == {"NeuralSort", "DiffSortNets", ""}  # ours' operators, softmax excluded
    assert _claims(rows, "half_beats_top5_top1") == {"NeuralSort": (True, True), "DiffSortNets": (True, False)}
    assert _claims(rows, "top5_loses_top1_vs_softmax") == {"NeuralSort": (True, True), "DiffSortNets": (True, False)}
    assert _claims(rows, "collapse_at_tenth") == {"NeuralSort": (True, False), "DiffSortNets": (False, True)}
    assert _claims(rows, "uniform_ge_softmax_top1") == {"NeuralSort": (True, False), "DiffSortNets": (True, None)}
    assert _claims(rows, "best_topk_ge_softmax_top5") == {"NeuralSort": (True, True), "DiffSortNets": (True, False)}
    assert _claims(rows, "neuralsort_collapses_at_tenth") == {"": (True, False)}
    assert {c.name for c in CLAIMS} == {r["claim"] for r in rows}


def test_softsort_fails_top5_vs_softmax_in_the_paper():
    rows = check_orderings({}, paper_grid())
    assert _claims(rows, "best_topk_ge_softmax_top5", "SoftSort") == {"SoftSort": (False, None)}
    assert _claims(rows, "collapse_at_tenth", "SoftSort") == {"SoftSort": (False, None)}  # 3.0 points only


def test_format_report_labels_the_paper_a_different_dataset(tmp_path):
    _write(tmp_path, 0, _record("neuralsort", "[.5,0,0,0,.5]", 0, 70.0, 95.0, wall=90))
    _write(tmp_path, 1, _record("lapsum", "[.5,0,0,0,.5]", 0, 68.0, 94.0, wall=95))
    text = format_report(grid(collect([tmp_path])), dataset="fashion_pairs")
    assert "DIFFERENT DATASET: CIFAR-100" in text
    assert "70.00 / 95.00" in text and "68.00 / 94.00" in text and "61.12 / 86.47" in text
    assert "1x 90s" in text and "LapSum" in text
    assert "SinkhornSort" not in text  # only the methods we ran


def test_command_line_prints_and_writes(tmp_path, capsys):
    _write(tmp_path / "runs", 0, _record("softsort", "[.2,.2,.2,.2,.2]", 0, 66.0, 93.0))
    texts = report_pk.main([str(tmp_path / "runs"), "--out", str(tmp_path / "report")])
    assert list(texts) == ["fashion_pairs"] and "66.00 / 93.00" in capsys.readouterr().out
    assert "66.00 / 93.00" in (tmp_path / "report" / "pk_fashion_pairs.md").read_text()
    with pytest.raises(SystemExit, match="no finished benchmark run"):
        report_pk.main([str(tmp_path / "report")])


def test_paper_report_includes_the_grid(tmp_path, capsys):
    _write(tmp_path / "runs", 0, _record("softsort", "[.2,.2,.2,.2,.2]", 0, 66.0, 93.0))
    report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "report")])
    assert "66.00 / 93.00" in capsys.readouterr().out
    assert "DIFFERENT DATASET" in (tmp_path / "report" / "pk_fashion_pairs.md").read_text()


def test_make_report_reads_every_record_once(tmp_path, monkeypatch, capsys):
    """One pass of the report: the paper tables and the P_K grid come from one read of each results.json."""
    from diffrank.experiments.records import archive

    _write(tmp_path / "runs", 0, _record("softsort", "[.2,.2,.2,.2,.2]", 0, 66.0, 93.0))
    _write(tmp_path / "runs", 1, {"status": "done", "metrics": {"test/em": 0.8, "test/ew": 0.9},
                                  "paper": {"paper": "petersen_thesis_2022", "table": "3.7", "dataset": "mnist4",
                                            "method": "Cauchy CDF", "network": "odd_even", "n": 5}})
    reads = []
    read = archive.read_record
    monkeypatch.setattr(archive, "read_record", lambda path: reads.append(path) or read(path))
    result = report.write_report([tmp_path / "runs"], tmp_path / "report", quiet=True)
    assert sorted(p.parent.name for p in reads) == ["0", "1"]  # each file once
    assert result["runs"] == 1 and result["skipped"] == 1 and not result["unmatched"]
    assert (tmp_path / "report" / "pk_fashion_pairs.md").exists()
