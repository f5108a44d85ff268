"""Warcraft shortest paths end to end: the network, the module, every experiment config (fast_dev_run on a
tiny generated set in the official format), the rows' paper keys, the final-epoch protocol and the report's
Warcraft section from results.json records."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from diffrank import reference
from diffrank.experiments.algorithms.bellman_ford import RelaxedBellmanFord
from diffrank.experiments.algorithms.newton import NewtonAlgorithm
from diffrank.experiments.analysis import report as compare
from diffrank.experiments.models.shortest_path import CombResNet18, ShortestPathModule
from diffrank.experiments.records import matching
from diffrank.experiments.records.table_cells import table_rows
from diffrank.experiments.run.composition import row_newton
from diffrank.experiments.run.train import train
from experiments.data.warcraft_files import write_warcraft
from helpers import CONFIGS, options

CONFIGS_WARCRAFT = [e for e in options("experiment") if e.startswith("warcraft/")]
PROTOCOLS = ["warcraft/shortest_path"]
ROWS = [e for e in CONFIGS_WARCRAFT if e not in PROTOCOLS]
# one row per algorithm family and Newton variant in the default suite; all rows in the slow suite
SAMPLE = ["warcraft/thesis_t7_4/while_l2sq", "warcraft/thesis_t7_4/for_l1_fisher",
          "warcraft/thesis_t7_5/smoothed_loss_s3_hessian", "warcraft/thesis_t7_5/smoothed_algorithm_s3_fisher",
          "warcraft/thesis_t7_5/perturbed_fy_s3_hessian", "warcraft/thesis_t7_6/resgro_m6_sets3",
          "warcraft/thesis_t7_7/resgro_s3"]
ALGORITHM_OF_METHOD = {"Black-Box Loss": "blackbox", "Perturbed Opt.": "perturbed",
                       "AlgoVision": "relaxed_bellman_ford"}
# thesis Table 7.5's column families (reference operator id) -> our algorithm
ALGORITHM_OF_OPERATOR = {"stochastic_smoothing_of_loss": "smoothed_loss",
                         "stochastic_smoothing_of_algorithm": "smoothed_algorithm",
                         "perturbed_optimizer_fenchel_young": "perturbed"}
NEWTON_OF_METHOD = {"Regular": None, "Hessian Newton": "hessian", "Fisher Newton": "fisher"}


@pytest.fixture(scope="module")
def warcraft_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("warcraft")
    write_warcraft(root, grid=12, sizes=(8, 4, 4), seed=0)
    return root


def _small(root) -> list[str]:
    return [f"paths.data_dir={root}", "data.root_name=warcraft_like_synthetic", "data.batch_size=4",
            "data.eval_batch_size=4"]


def test_rows_carry_their_paper_keys():
    assert set(SAMPLE) <= set(ROWS)
    covered = []
    for name in ROWS:
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        rows = reference.match(OmegaConf.to_container(cfg.paper, resolve=True))
        assert [r["metric"] for r in rows] == ["EM_path"], name
        row = rows[0]
        covered.append(tuple(row[c] for c in reference.COLUMNS))
        defaults = [d for d in cfg.defaults if not isinstance(d, str)]
        chosen = [d["override /algorithm"] for d in defaults if "override /algorithm" in d][0]
        newton = ([d["override /newton"] for d in defaults if "override /newton" in d] or [None])[0]
        assert cfg.paper_method == chosen and row_newton(name) == (newton or "none"), name
        assert newton == NEWTON_OF_METHOD.get(row["method"]), name
        setting = dict(kv.split("=") for kv in row["setting"].split(";")) if row["setting"] else {}
        if row["table"] == "2.2":
            assert chosen == ALGORITHM_OF_METHOD[row["method"]], name
        if row["table"] == "7.4":
            assert (chosen, cfg.algorithm.loop, cfg.algorithm.loss) == \
                ("relaxed_bellman_ford", setting["loop"], setting["loss"]), name
        if row["table"] == "7.5":
            assert chosen == ALGORITHM_OF_OPERATOR[row["operator"]], name
            assert cfg.algorithm.samples == int(setting["samples"]), name
        if row["table"] == "7.6":
            assert chosen == "resgro" and cfg.algorithm.samples == int(setting["samples"]), name
            assert cfg.algorithm.sets == int(setting["sets"]) and 1 <= cfg.algorithm.subset_size < cfg.algorithm.samples
        if row["table"] == "7.7":
            assert chosen == "resgro" and cfg.algorithm.samples == int(setting["samples"]), name
            assert cfg.algorithm.subset_size is None and cfg.algorithm.sets is None, name
    # every published number of Tables 2.2 (but the ResNet baseline: no row) and 7.4-7.7 belongs to exactly one row
    published = [tuple(r[c] for c in reference.COLUMNS) for r in reference.load_table("warcraft_thesis_tables")
                 if r["method"] != "ResNet Baseline"]
    assert sorted(covered) == sorted(published)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in SAMPLE else pytest.mark.slow)
                                  for n in CONFIGS_WARCRAFT])
def test_fast_dev_run(train_built, compose_train, warcraft_root, name):
    record, objects = train_built(compose_train([f"experiment={name}", *_small(warcraft_root)]))
    metrics = record.metrics
    for stage in ("val", "test"):
        assert 0 <= metrics[f"{stage}/em_path"] <= 1
        assert metrics[f"{stage}/cost_ratio"] >= 1 - 1e-9
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    rec = record.to_dict()
    assert rec["synthetic_data"] is True
    assert rec["choices"]["operator"] is None and rec["choices"]["model"] == "shortest_path"
    assert (rec["paper"] is None) == (name in PROTOCOLS)
    assert isinstance(objects["model"], ShortestPathModule)
    newton = row_newton(name)
    assert rec["choices"]["newton"] == newton
    algorithm = objects["model"].algorithm
    assert isinstance(algorithm, NewtonAlgorithm) == (newton != "none"), name
    if newton != "none":
        assert algorithm.variant == newton and algorithm.name.endswith(f"+{newton}")


def test_row_with_another_newton_loss_is_refused(compose_train, warcraft_root):
    """A Regular row run with newton=fisher would carry the Regular cell's key (and a Fisher row with none the
    Fisher cell's): refused before anything is built."""
    with pytest.raises(ValueError, match=r"row for newton=none: with newton=fisher"):
        train(compose_train(["experiment=warcraft/thesis_t7_4/for_l1", "newton=fisher", *_small(warcraft_root)]))
    with pytest.raises(ValueError, match=r"row for newton=fisher: with newton=none"):
        train(compose_train(["experiment=warcraft/thesis_t7_4/for_l1_fisher", "newton=none", *_small(warcraft_root)]))


def test_protocol_with_a_newton_loss_on_any_algorithm(train_built, compose_train, warcraft_root):
    """The protocol runs every algorithm with newton=<variant>; the smoothed algorithm has no second derivatives,
    so the Hessian variants are refused at the first step with a message naming fisher."""
    record, objects = train_built(compose_train(["experiment=warcraft/shortest_path", "algorithm=blackbox",
                                                 "newton=fisher", "newton.tikhonov=0.5", *_small(warcraft_root)]))
    algorithm = objects["model"].algorithm
    assert isinstance(algorithm, NewtonAlgorithm) and algorithm.tikhonov == 0.5
    assert record.paper is None and record.choices["newton"] == "fisher"
    with pytest.raises(ValueError, match="fisher"):
        train(compose_train(["experiment=warcraft/shortest_path", "algorithm=smoothed_algorithm",
                             "algorithm.samples=2", "newton=hessian", *_small(warcraft_root)]))


def test_row_with_another_algorithm_is_refused(compose_train, warcraft_root):
    """A Table 7.4 row (relaxed Bellman-Ford, loop/loss keys) with algorithm=blackbox would hand the row's keys to
    blackbox: refused, naming the protocol that runs blackbox with the table's settings."""
    with pytest.raises(ValueError, match=r"row for algorithm=relaxed_bellman_ford.*algorithm=blackbox"):
        train(compose_train(["experiment=warcraft/thesis_t7_4/for_l1", "algorithm=blackbox", "algorithm.lam=5",
                             *_small(warcraft_root)]))


@pytest.mark.slow
def test_protocol_tests_the_final_epoch(train_built, compose_train, warcraft_root):
    cfg = compose_train(["experiment=warcraft/thesis_t2_2/blackbox", *_small(warcraft_root),
                         "trainer.max_epochs=2", "logger=csv"], fast=False)
    cfg.trainer.enable_progress_bar = False
    cfg.trainer.num_sanity_val_steps = 0
    cfg.callbacks = {k: v for k, v in cfg.callbacks.items() if k != "rich_progress_bar"}
    record, objects = train_built(cfg)
    ckpt = record.checkpoint
    assert ckpt["selected_by"]["monitor"] == "step" and ckpt["epoch"] == 1
    assert ckpt["global_step"] == objects["trainer"].global_step


def test_network_shapes_and_sign():
    net = CombResNet18(grid=12)
    with torch.no_grad():
        costs = net(torch.randn(2, 3, 96, 96))
    assert costs.shape == (2, 12, 12) and float(costs.min()) >= 0
    assert CombResNet18(grid=4, in_channels=1)(torch.randn(1, 1, 32, 32)).shape == (1, 4, 4)
    with pytest.raises(ValueError, match="B, C, H, W"):
        net(torch.randn(3, 96, 96))
    with pytest.raises(ValueError, match=">= 1"):
        CombResNet18(grid=0)


def test_module_checks_its_algorithm():
    with pytest.raises(ValueError, match="loss\\(costs, true_paths\\)"):
        ShortestPathModule(CombResNet18(), torch.nn.MSELoss(), torch.optim.Adam)
    module = ShortestPathModule(CombResNet18(grid=4), RelaxedBellmanFord(sweeps=6), torch.optim.Adam)
    with pytest.raises(ValueError, match="maps, true_costs, paths"):
        module.training_step((torch.zeros(1, 3, 32, 32),), 0)


def test_report_has_a_warcraft_section_cell_by_cell(tmp_path):
    records = {
        "bb0": ({"paper": "petersen_thesis_2022", "table": "2.2", "dataset": "warcraft12",
                 "method": "Black-Box Loss"}, 0.85),
        "bb1": ({"paper": "petersen_thesis_2022", "table": "2.2", "dataset": "warcraft12",
                 "method": "Black-Box Loss"}, 0.87),
        "fy3": ({"paper": "petersen_thesis_2022", "table": "7.5", "dataset": "warcraft12", "method": "Regular",
                 "operator": "perturbed_optimizer_fenchel_young", "setting": "samples=3"}, 0.8),
    }
    for name, (paper, em) in records.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({
            "status": "done", "paper": paper, "synthetic_data": True, "global_step": 7150, "global_batch": 70,
            "metrics": {"test/em_path": em, "test/cost_ratio": 1.01, "val/em_path": em}}))
    result = matching.collect([tmp_path])
    assert result["runs"] == 3 and not result["unmatched"]
    t22 = result["tables"][("petersen_thesis_2022", "2.2")]
    assert len(t22) == 1
    header, cells = table_rows(t22)
    row = dict(zip(header, cells[0]))
    assert row["method"] == "Black-Box Loss" and row["metric"] == "EM_path" and row["paper"] == "86.6"
    assert row["data"] == "synthetic"  # generated maps are labelled on every row of the report
    assert row["ours"] == "86.00 ± 1.41" and row["Δ"] == "-0.60" and row["runs"] == "2"
    assert row["steps×batch"] == "7150×70"
    header, cells = table_rows(result["tables"][("petersen_thesis_2022", "7.5")])
    row = dict(zip(header, cells[0]))
    assert (row["paper"], row["ours"], row["Δ"], row["runs"]) == ("80.64", "80.00", "-0.64", "1")
    md = compare.markdown(result)
    assert "## petersen_thesis_2022, Table 2.2" in md and "## petersen_thesis_2022, Table 7.5" in md
    assert "| synthetic | EM_path | 86.6 | 86.00 ± 1.41 | -0.60 | 2 |" in md


def test_report_never_pools_synthetic_with_real_runs(tmp_path):
    paper = {"paper": "petersen_thesis_2022", "table": "2.2", "dataset": "warcraft12", "method": "Black-Box Loss"}
    for name, em, synthetic in (("gen", 0.5, True), ("real", 0.9, False)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({
            "status": "done", "paper": paper, "synthetic_data": synthetic, "metrics": {"test/em_path": em}}))
    header, cells = table_rows(matching.collect([tmp_path])["tables"][("petersen_thesis_2022", "2.2")])
    rows = sorted((r[header.index("data")], r[header.index("ours")], r[header.index("runs")]) for r in cells)
    assert rows == [("real", "90.00", "1"), ("synthetic", "50.00", "1")]


def test_report_sections_of_chapter_7_and_newton_runs_of_another_lambda_apart(tmp_path):
    """Tables 7.2-7.7 land in their own sections (the report's scheme: one per paper table); a Newton-loss run of
    another λ is shown on its own line (the "Newton λ" column), never pooled with the row's seeds."""
    thesis = {"paper": "petersen_thesis_2022", "dataset": "warcraft12"}
    fisher = {"_target_": "diffrank.losses.newton.wrap_newton", "variant": "fisher", "tikhonov": 1.0}
    records = {
        "t74_a": ({**thesis, "table": "7.4", "method": "Fisher Newton", "setting": "loop=for;loss=l2sq"}, 0.45, fisher),
        "t74_b": ({**thesis, "table": "7.4", "method": "Fisher Newton", "setting": "loop=for;loss=l2sq"}, 0.47, fisher),
        "t74_c": ({**thesis, "table": "7.4", "method": "Fisher Newton", "setting": "loop=for;loss=l2sq"}, 0.01,
                  {**fisher, "tikhonov": 0.01}),
        "t76": ({**thesis, "table": "7.6", "method": "RESGRO bootstrapped", "setting": "samples=30;sets=30"}, 0.25,
                {"variant": "none", "tikhonov": 0.0}),
        "t77": ({**thesis, "table": "7.7", "method": "RESGRO one-set", "setting": "samples=30"}, 0.2, None),
    }
    for name, (paper, em, newton) in records.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({
            "status": "done", "paper": paper, "synthetic_data": True, "optimizer_steps": 1430, "global_batch": 70,
            "config": {"newton": newton}, "metrics": {"test/em_path": em}}))
    sorting = {"paper": "petersen_thesis_2022", "table": "7.2", "dataset": "mnist4", "method": "RESGRO", "n": 5}
    (tmp_path / "t72").mkdir()
    (tmp_path / "t72" / "results.json").write_text(json.dumps({
        "status": "done", "paper": sorting, "optimizer_steps": 100, "global_batch": 100,
        "metrics": {"test/em": 0.5, "test/ew": 0.7}}))
    result = matching.collect([tmp_path])
    assert not result["unmatched"]
    assert {t for _, t in result["tables"]} == {"7.2", "7.4", "7.6", "7.7"}
    header, cells = table_rows(result["tables"][("petersen_thesis_2022", "7.4")])
    lines = sorted((r[header.index("Newton λ")], r[header.index("ours")], r[header.index("runs")]) for r in cells)
    assert lines == [("0.01", "1.00", "1"), ("1", "46.00 ± 1.41", "2")]
    assert {r[header.index("steps×batch")] for r in cells} == {"1430×70"}
    header, cells = table_rows(result["tables"][("petersen_thesis_2022", "7.6")])
    row = dict(zip(header, cells[0]))
    assert (row["paper"], row["ours"], row["steps×batch"]) == ("84.60", "25.00", "1430×70")
    assert "Newton λ" not in header  # no Newton-loss run in the table
    header, cells = table_rows(result["tables"][("petersen_thesis_2022", "7.2")])
    assert sorted((dict(zip(header, c))["metric"], dict(zip(header, c))["ours"]) for c in cells) == \
        [("EM", "50.00"), ("EW", "70.00")]
    md = compare.markdown(result)
    for table in ("7.2", "7.4", "7.6", "7.7"):
        assert f"## petersen_thesis_2022, Table {table}" in md
