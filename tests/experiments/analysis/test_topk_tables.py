"""The report of Petersen et al. 2022 Tables 1-6 (diffrank.experiments.analysis.report) on synthetic
results.json files of the generated rows, checked cell by cell: one section per table, the paper's decimals
(ImageNet-1K top-5: three), the β selection of swept SinkhornSort rows, Table 5's literature rows."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from diffrank.experiments.analysis import report as compare
from diffrank.experiments.records import table_cells
from diffrank.experiments.records.matching import select_beta
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.records.table_cells import table_rows
from helpers import CONFIGS

PAPER = "petersen_difftopk_icml2022"


def _key(row: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONFIGS / "experiment" / f"topk/{row}.yaml").paper)


def _write(folder, name, row, metrics, beta=None, val=None):
    d = folder / name
    d.mkdir(parents=True)
    cfg = {"trainer": {"max_epochs": 200}, "data": {"batch_size": 128}, "optimized_metric": "val/top1",
           "operator": None if beta is None else {"beta": beta}}
    (d / "results.json").write_text(json.dumps({
        "paper": _key(row), "metrics": {**metrics, **({} if val is None else {"val/top1_best": val})},
        "overrides": [], "config": cfg, "optimizer_steps": 100, "global_batch": 128}))


def _cells(result, table):
    header, cells = table_rows(result["tables"][(PAPER, str(table))])
    return header, cells


@pytest.fixture
def report(tmp_path):
    runs = tmp_path / "runs"
    _write(runs, "t1/a", "icml2022_t1/softmax_ce", {"test/top1": 0.6100, "test/top5": 0.8500})
    _write(runs, "t1/b", "icml2022_t1/softmax_ce", {"test/top1": 0.6200, "test/top5": 0.8600})
    _write(runs, "t2", "icml2022_t2/in1k_softmax_ce", {"test/top1": 0.86101, "test/top5": 0.978012})
    _write(runs, "t2k", "icml2022_t2/in21kp_softmax_ce", {"test/top1": 0.3929, "test/top5": 0.6963})
    # SinkhornSort β grid: β = 64 has the better validation mean -> its two seeds are reported
    _write(runs, "t3/b64s0", "icml2022_t3/in1k_sinkhorn_uniform5", {"test/top1": 0.862, "test/top5": 0.9799},
           beta=64.0, val=0.90)
    _write(runs, "t3/b64s1", "icml2022_t3/in1k_sinkhorn_uniform5", {"test/top1": 0.864, "test/top5": 0.9801},
           beta=64.0, val=0.88)
    _write(runs, "t3/b128s0", "icml2022_t3/in1k_sinkhorn_uniform5", {"test/top1": 0.10, "test/top5": 0.10},
           beta=128.0, val=0.85)
    _write(runs, "t4", "icml2022_t4/dsn_tenth_top5", {"test/top1": 0.6174, "test/top5": 0.8722}, beta=0.5)
    _write(runs, "t5", "icml2022_t5/effnet_dsn_quarter_top5", {"test/top1": 0.8837, "test/top5": 0.9868})
    _write(runs, "t6", "icml2022_t6/in21kp_dsn_half_top20",
           {"test/top1": 0.3954, "test/top5": 0.6859, "test/top10": 0.7795, "test/top20": 0.8549})
    out = tmp_path / "report"
    return compare.write_report([runs], out, quiet=True), (out / "report.md").read_text()


def test_one_section_per_table(report):
    result, md = report
    assert result["runs"] == 10 and not result["unmatched"]
    assert sorted(result["tables"]) == [(PAPER, str(t)) for t in range(1, 7)]
    for t in range(1, 7):
        assert f"## {PAPER}, Table {t}\n" in md


def test_cifar_cells(report):
    header, cells = _cells(report[0], 1)
    assert header == ["method", "operator", "n", "metric", "paper", "ours", "Δ", "runs", "steps×batch"]
    # top-1: mean(61, 62) = 61.50, sample std 0.71, Δ = 61.50 - 61.27
    assert cells == [["Softmax", "softmax_ce", "100", "top1", "61.27", "61.50 ± 0.71", "+0.23", "2", "100×128"],
                     ["Softmax", "softmax_ce", "100", "top5", "85.31", "85.50 ± 0.71", "+0.19", "2", "100×128"]]
    _, t4 = _cells(report[0], 4)
    assert [c[-6:-2] for c in t4] == [["top1", "61.74", "61.74", "+0.00"], ["top5", "87.22", "87.22", "+0.00"]]


def test_imagenet_top5_has_the_papers_three_decimals(report):
    _, cells = _cells(report[0], 2)
    by = {(c[0], c[-6]): c for c in cells}
    assert by[("imagenet1k", "top5")][-5:-2] == ["97.795", "97.801", "+0.006"]
    assert by[("imagenet1k", "top1")][-5:-2] == ["86.06", "86.10", "+0.04"]
    assert by[("imagenet21kp", "top5")][-5:-2] == ["69.63", "69.63", "+0.00"]
    assert "| imagenet1k | Softmax | softmax_ce | 1000 | top5 | 97.795 | 97.801 | +0.006 |" in report[1]
    assert table_cells.decimals("97.795") == 3 and table_cells.decimals("85.3") == 2
    assert table_cells.decimals("≈ 88.4") == 2


def test_swept_sinkhorn_rows_report_the_best_validation_beta(report):
    header, cells = _cells(report[0], 3)
    assert header[-1] == "selected"
    top1, top5 = (next(c for c in cells if c[-7] == m) for m in ("top1", "top5"))
    # β = 64 (val mean 0.89 > 0.85): test top-1 mean(86.2, 86.4) = 86.30 vs 86.22
    assert top1[-7:] == ["top1", "86.22", "86.30 ± 0.14", "+0.08", "2", "100×128", "β=64 (best val of 2 β)"]
    assert top5[-6:-3] == ["97.989", "98.000 ± 0.014", "+0.011"]


def test_table5_shows_the_literature_rows_beside_ours(report):
    _, cells = _cells(report[0], 5)
    ours = [c for c in cells if c[-2] != "0"]
    assert [c[-6:-2] for c in ours] == [["top1", "88.37", "88.37", "+0.00"], ["top5", "98.68", "98.68", "+0.00"]]
    literature = [c for c in cells if "ResNet50" in c]
    assert len(literature) == 2 and all(c[-4] == "—" and c[-2] == "0" for c in literature)
    assert len(cells) == 2 + 19  # ours + the 19 literature numbers (ViT-L/16, CLIP, ... print top-1 only)


def test_table6_reports_top10_and_top20(report):
    _, cells = _cells(report[0], 6)
    got = {c[-6]: c[-5:-2] for c in cells}
    assert got == {"top1": ["39.54", "39.54", "+0.00"], "top5": ["68.59", "68.59", "+0.00"],
                   "top10": ["77.95", "77.95", "+0.00"], "top20": ["85.49", "85.49", "+0.00"]}


def test_beta_selection_rules():
    def run(beta, val):
        return RunRecord(config={"operator": {"beta": beta}}, metrics={"val/top1_best": val})

    members = [("a", run(1.0, 0.5)), ("b", run(2.0, 0.7)), ("c", run(2.0, 0.6)), ("d", run(4.0, float("nan")))]
    kept, note = select_beta(members)
    assert [p for p, _ in kept] == ["b", "c"] and note == "β=2 (best val of 3 β)"
    same = [("a", run(1.0, 0.5)), ("b", run(1.0, 0.1))]
    assert select_beta(same) == (same, None)
    tie = [("a", run(4.0, 0.5)), ("b", run(2.0, 0.5))]
    assert select_beta(tie)[1].startswith("β=2")  # ties: the smaller β
