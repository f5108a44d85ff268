"""The paper report (diffrank.experiments.analysis.report) on synthetic results.json files, checked cell by cell."""

from __future__ import annotations

import json
import math

import pytest

from diffrank import reference
from diffrank.experiments.analysis import report
from diffrank.experiments.records import matching, table_cells
from diffrank.experiments.records.matching import is_fraction
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.records.table_cells import table_rows

CAUCHY5 = {"paper": "petersen_thesis_2022", "table": "3.7", "dataset": "mnist4", "method": "Cauchy CDF",
           "network": "odd_even", "n": 5}
ART3 = {"paper": "petersen_thesis_2022", "table": "3.3", "dataset": "mnist4", "method": "ART (odd-even)", "n": 3}


def _write(folder, name, paper, metrics, steps=1000, batch=20):
    d = folder / name
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({
        "paper": paper, "metrics": metrics, "overrides": [f"trainer.max_steps={steps}"],
        "config": {"trainer": {"max_steps": 99}, "data": {"batch_size": batch}}}))


def test_runs_of_another_budget_are_not_pooled(tmp_path):
    """A short check of a row (1 000 steps) is its own line, not a seed of the full-budget runs."""
    _write(tmp_path, "full/0", CAUCHY5, {"test/em": 0.80}, steps=200000, batch=100)
    _write(tmp_path, "full/1", CAUCHY5, {"test/em": 0.84}, steps=200000, batch=100)
    _write(tmp_path, "short", CAUCHY5, {"test/em": 0.10}, steps=1000, batch=100)
    lines = [ln for ln in matching.collect([tmp_path])["tables"][("petersen_thesis_2022", "3.7")]
             if ln["metric"] == "EM" and ln["runs"]]
    assert sorted((ln["budget"], ln["runs"], round(ln["mean"], 6)) for ln in lines) == [
        ("1000×100", 1, 10.0), ("200000×100", 2, 82.0)]


def test_runs_in_another_precision_are_not_pooled(tmp_path):
    _write(tmp_path, "fp32", CAUCHY5, {"test/em": 0.80})
    d = tmp_path / "bf16"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({
        "paper": CAUCHY5, "metrics": {"test/em": 0.20}, "overrides": ["trainer.max_steps=1000",
                                                                     "trainer.precision=bf16-mixed"],
        "config": {"trainer": {"max_steps": 99}, "data": {"batch_size": 20}}}))
    lines = [ln for ln in matching.collect([tmp_path])["tables"][("petersen_thesis_2022", "3.7")]
             if ln["metric"] == "EM" and ln["runs"]]
    assert sorted((ln["budget"], ln["mean"]) for ln in lines) == [("1000×20", 80.0), ("1000×20 bf16-mixed", 20.0)]


def test_runs_on_a_swapped_data_group_are_not_the_rows_number(tmp_path):
    """`experiment=<MNIST row> data=digits_sort` (the docs' offline check) is labelled with its data on every
    line and never pooled with the row's own data."""
    _write(tmp_path, "mnist", CAUCHY5, {"test/em": 0.80})
    d = tmp_path / "digits"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({
        "paper": CAUCHY5, "metrics": {"test/em": 0.50}, "overrides": ["trainer.max_steps=1000", "data=digits_sort"],
        "config": {"trainer": {"max_steps": 99}, "data": {"batch_size": 20}}}))
    lines = [ln for ln in matching.collect([tmp_path])["tables"][("petersen_thesis_2022", "3.7")]
             if ln["metric"] == "EM" and ln["runs"]]
    assert sorted((ln["data"], ln["mean"]) for ln in lines) == [("", 80.0), ("data=digits_sort", 50.0)]
    header, cells = table_rows(lines)
    col = header.index("data")
    assert sorted(c[col] for c in cells) == ["data=digits_sort", "real"]


def test_reference_tables_load_and_match():
    names = reference.table_names()
    assert "sorting_thesis_table3_7" in names and "lapsum_icml2025_table4" in names and "topk_icml2022_table1" in names
    rows = reference.match(CAUCHY5)
    assert sorted((r["metric"], r["value"]) for r in rows) == [("EM", "84.9"), ("EW", "93.2")]
    assert reference.match({"paper": "struski_lapsum_icml2025", "n": 5, "method": "LapSum (ours)", "metric": "EM"})[0][
        "value"] == "84.2"
    with pytest.raises(KeyError, match="not reference columns"):
        reference.match({"colour": "red"})
    with pytest.raises(KeyError, match="known"):
        reference.load_table("nope")


def test_report_cell_by_cell(tmp_path):
    runs = tmp_path / "runs"
    _write(runs, "a/0", CAUCHY5, {"test/em": 0.80, "test/ew": 0.90, "val/em": 0.5})
    _write(runs, "a/1", CAUCHY5, {"test/em": 0.84, "test/ew": 0.92})
    _write(runs, "b", ART3, {"test/em": 0.95, "test/ew": 0.97, "test/em5": 0.86}, steps=500, batch=100)
    _write(runs, "c", None, {"test/em": 0.1})  # no paper key: skipped
    _write(runs, "d", {**CAUCHY5, "method": "Cauchy typo"}, {"test/em": 0.1})
    out = tmp_path / "report"
    result = report.write_report([runs], out, quiet=True)
    assert result["runs"] == 4 and result["skipped"] == 1 and len(result["unmatched"]) == 1
    md = (out / "report.md").read_text()
    assert (out / "report.png").stat().st_size > 1000
    t37 = result["tables"][("petersen_thesis_2022", "3.7")]
    header, cells = table_rows(t37)
    assert header == ["method", "operator", "n", "metric", "paper", "ours", "Δ", "runs", "steps×batch"]
    # EM: mean(80, 84) = 82, sample std = 2.83, Δ = 82 - 84.9 = -2.9
    assert cells[0] == ["Cauchy CDF", "dsn", "5", "EM", "84.9", "82.00 ± 2.83", "-2.90", "2", "1000×20"]
    assert cells[1] == ["Cauchy CDF", "dsn", "5", "EW", "93.2", "91.00 ± 1.41", "-2.20", "2", "1000×20"]
    t33 = {c[3]: c for c in table_rows(result["tables"][("petersen_thesis_2022", "3.3")])[1]}
    assert t33["EM"][4:] == ["95.2", "95.00", "-0.20", "1", "500×100"]
    assert t33["EM5"][4:6] == ["86.1", "86.00"]
    assert "## petersen_thesis_2022, Table 3.7" in md
    assert "| Cauchy CDF | dsn | 5 | EM | 84.9 | 82.00 ± 2.83 | -2.90 |" in md
    assert "Cauchy typo" in md  # unmatched keys are listed


def test_missing_metric_and_fraction_tables(tmp_path):
    key = {"paper": "petersen_thesis_2022", "table": "2.1", "method": "Det. NeuralSort", "n": 3}
    _write(tmp_path, "r", key, {"test/em": 0.9})  # no EW logged
    result = matching.collect([tmp_path])
    lines = {ln["metric"]: ln for ln in result["tables"][("petersen_thesis_2022", "2.1")]}
    assert lines["EM"]["mean"] == pytest.approx(90.0)  # table 2.1 is stored x100: ours in %
    assert lines["EW"]["runs"] == 0 and math.isnan(lines["EW"]["mean"]) and table_cells.fmt(lines["EW"]["mean"]) == "—"
    assert is_fraction({"note": "fractions"})
    assert not is_fraction({"note": "printed as fraction; value x100"})


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such"):
        matching.collect([tmp_path / "nope"])


def test_budget_is_the_steps_actually_trained(tmp_path):
    """A run stopped by max_time (or early stopping) reports its global_step, not the configured max_steps."""
    runs = tmp_path / "runs"
    _write(runs, "long", CAUCHY5, {"test/em": 0.70, "test/ew": 0.86}, steps=200000, batch=100)
    record = json.loads((runs / "long" / "results.json").read_text())
    assert RunRecord.from_dict(record).budget == "200000×100"
    record["global_step"] = 3469
    assert RunRecord.from_dict(record).budget == "3469×100"


def test_variant_of_a_row_is_never_labelled_with_its_paper_row(tmp_path):
    """A row run with another operator (results.json: paper null, variant_of the row) is skipped, not matched."""
    runs = tmp_path / "runs"
    _write(runs, "sorting/thesis_t3_7/odd_even_cauchy_n5/runs/own", CAUCHY5, {"test/em": 0.8, "test/ew": 0.9})
    _write(runs, "sorting/thesis_t3_7/odd_even_cauchy_n5/runs/variant", None, {"test/em": 0.1, "test/ew": 0.2})
    record = json.loads((runs / "sorting/thesis_t3_7/odd_even_cauchy_n5/runs/variant/results.json").read_text())
    record["variant_of"] = {"paper_method": "diffsort_odd_even", "method": "neuralsort", "paper": CAUCHY5}
    (runs / "sorting/thesis_t3_7/odd_even_cauchy_n5/runs/variant/results.json").write_text(json.dumps(record))
    result = matching.collect([runs])  # found recursively under the experiment folders
    assert result["runs"] == 1 and result["skipped"] == 1
    em = next(ln for ln in result["tables"][("petersen_thesis_2022", "3.7")] if ln["metric"] == "EM")
    assert em["ours"] == [pytest.approx(80.0)]


def test_budget_uses_the_global_batch_and_optimizer_steps_of_ddp_runs(tmp_path):
    """data.batch_size is global; a DDP record states world_size / per_device_batch / global_batch and the
    optimizer steps it took: the budget is steps × global batch (not × the per-device batch)."""
    record = {"paper": CAUCHY5, "metrics": {"test/em": 0.7}, "overrides": ["data.batch_size=64"],
              "config": {"trainer": {"max_steps": 99}, "data": {"batch_size": 64}}, "global_step": 0,
              "optimizer_steps": 57, "world_size": 2, "per_device_batch": 32, "global_batch": 64}
    assert RunRecord.from_dict(record).budget == "57×64"
    result = report.collect_runs([(tmp_path / "r" / "results.json", RunRecord.from_dict(record))])
    em = next(ln for ln in result["tables"][("petersen_thesis_2022", "3.7")] if ln["metric"] == "EM")
    assert em["budget"] == "57×64" and em["mean"] == pytest.approx(70.0)


def test_bad_records_are_skipped_with_a_warning(tmp_path, capsys):
    _write(tmp_path, "good", CAUCHY5, {"test/em": 0.80})
    _write(tmp_path, "text", CAUCHY5, {"test/em": "n/a"})
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "results.json").write_text("[1, 2]")
    result = matching.collect([tmp_path])
    (line,) = [ln for ln in result["tables"][("petersen_thesis_2022", "3.7")] if ln["metric"] == "EM" and ln["runs"]]
    assert line["ours"] == [80.0]
    err = capsys.readouterr().err
    assert "text/results.json: metric test/em = 'n/a' is not a number" in err and "list/results.json" in err


ICML_T1_NS = {"paper": "petersen_difftopk_icml2022", "table": "1", "dataset": "cifar100", "model": "resnet18_cifar",
              "method": "Top-5 NeuralSort", "pk": "[0,0,0,0,1]"}
LAP_T1 = {"paper": "struski_lapsum_icml2025", "table": "1", "dataset": "cifar100", "model": "resnet18_cifar",
          "method": "Lap-Top-k (ours)", "pk": "[0,0,0,0,1]"}


def test_copied_baselines_show_the_originals_runs_once(tmp_path):
    """LapSum Table 1 reprints Petersen et al. 2022 Table 1: the ICML row's two seeds appear in both sections, Δ
    against each table's printed number, counted once; the Lap-Top-k run appears in LapSum's section only; the
    LapSum section lists its whole table (unrun rows with ours empty)."""
    _write(tmp_path, "ns/0", ICML_T1_NS, {"test/top1": 0.20, "test/top5": 0.80})
    _write(tmp_path, "ns/1", ICML_T1_NS, {"test/top1": 0.24, "test/top5": 0.84})
    _write(tmp_path, "lap", LAP_T1, {"test/top1": 0.56, "test/top5": 0.86})
    result = report.write_report([tmp_path], tmp_path / "report", quiet=True)
    assert result["runs"] == 3
    icml = result["tables"][("petersen_difftopk_icml2022", "1")]
    lap = result["tables"][("struski_lapsum_icml2025", "1")]
    assert len(icml) == 2 and all(ln["runs"] == 2 for ln in icml)
    assert len(lap) == len(reference.load_table("lapsum_icml2025_table1")) == 22  # the whole table
    copied = [ln for ln in lap if ln.get("copy_of")]
    assert len(copied) == 18 and {ln["copy_of"] for ln in copied} == {"petersen_difftopk_icml2022 Table 1"}
    ns = {ln["metric"]: ln for ln in copied if ln["row"]["operator"] == "neuralsort" and ln["runs"]}
    assert ns["top1"]["mean"] == pytest.approx(22.0) and ns["top1"]["delta"] == pytest.approx(22.0 - 22.58)
    assert sum(ln["runs"] for ln in copied) == 4  # the two seeds, top-1 and top-5: no other copy has runs
    own = {ln["metric"]: ln for ln in lap if ln["row"]["method"] == "Lap-Top-k (ours)" and ln["runs"]}
    assert own["top1"]["mean"] == pytest.approx(56.0) and own["top1"]["delta"] == pytest.approx(56.0 - 57.20)
    # runs sum to 2 seeds x 2 metrics in the original's section, once more only as a copy: no run is pooled twice
    assert all(ln["runs"] in (0, 2) for ln in copied)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## struski_lapsum_icml2025, Table 1" in md and "reprint petersen_difftopk_icml2022 Table 1" in md
    # a table whose originals alone have runs still gets its section; without copies=True (W&B) it does not
    only_icml = report.collect_runs([(tmp_path / "ns/0/results.json", RunRecord.read(tmp_path / "ns/0/results.json"))],
                                    copies=True)
    assert ("struski_lapsum_icml2025", "1") in only_icml["tables"]
    assert ("struski_lapsum_icml2025", "1") not in report.collect_runs(
        [(tmp_path / "ns/0/results.json", RunRecord.read(tmp_path / "ns/0/results.json"))])["tables"]


def test_copy_source_finds_one_original():
    rows = reference.load_table("lapsum_icml2025_table1")
    ns = next(r for r in rows if r["operator"] == "neuralsort" and r["pk"] == "[0,0,0,0,1]" and r["metric"] == "top1")
    assert reference.copy_source(ns)["method"] == "Top-5 NeuralSort"
    assert reference.copy_source(next(r for r in rows if r["operator"] == "lapsum")) is None
    with pytest.raises(ValueError, match="matches 0 rows"):
        reference.copy_source({**ns, "operator": "nope"})
    with pytest.raises(ValueError, match="bad copy_of"):
        reference.copy_source({**ns, "setting": "copy_of=petersen_difftopk_icml2022"})
    t3 = reference.load_table("lapsum_icml2025_table3")
    ae = [r for r in t3 if r["operator"] == "autoencoder"]
    assert len(ae) == 2 and all(reference.copy_source(r) is None for r in ae)  # Xie et al. do not print kNN+AE
    assert sum(reference.copy_source(r) is not None for r in t3) == 18
