"""Thesis Table 7.1 (MNIST classification, Regular vs Newton losses): the nets, the protocol, every row (generated =
committed, one row per published cell), fast_dev_run on tiny MNIST files, and the report's Welch tests."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from scipy.stats import ttest_ind

from diffrank import reference
from diffrank.experiments.analysis import report
from diffrank.experiments.models.nets import FullyConnected, LeNet5
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.records.table_cells import table_rows
from diffrank.experiments.run.composition import row_newton
from diffrank.experiments.run.train import train
from experiments.data.image_files import write_mnist
from helpers import CONFIGS, options

ROWS = [e for e in options("experiment") if e.startswith("classification/thesis_t7_1/")]
NEWTON = {"Regular": "none", "Newton L. (e.w. H)": "elementwise_hessian", "Newton L. (H)": "hessian",
          "Newton L. (F)": "fisher"}
REPRESENTATIVE = ["classification/thesis_t7_1/m1_sgd_fisher", "classification/thesis_t7_1/m4_adam_ewh",
                  "classification/thesis_t7_1/m5_sgd_hessian_ep200"]


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist")
    write_mnist(root, "MNIST", n_train=300, n_test=60)
    return root


def _small(root) -> list[str]:
    return [f"paths.data_dir={root}", "data.val_size=50", "data.batch_size=16", "data.eval_batch_size=32"]


def test_nets_have_the_thesis_shapes():
    m1 = FullyConnected(10, (1, 28, 28), width=100)
    linears = [m for m in m1.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 100), *[(100, 100)] * 3, (100, 10)]
    assert m1(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    lenet = LeNet5(10, (1, 28, 28), activation="sigmoid")
    assert lenet(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert sum(isinstance(m, torch.nn.Sigmoid) for m in lenet.modules()) == 4
    assert lenet.head[0].in_features == 400
    with pytest.raises(ValueError, match="activation"):
        LeNet5(activation="gelu")
    with pytest.raises(ValueError, match="depth"):
        FullyConnected(10, depth=0)


def test_every_cell_of_table_7_1_has_exactly_one_row():
    """One row per published cell; each row's Newton loss, model and optimizer are its cell's."""
    covered = []
    for name in ROWS:
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        rows = reference.match(OmegaConf.to_container(cfg.paper, resolve=True))
        assert [r["metric"] for r in rows] == ["top1"], name
        (r,) = rows
        assert row_newton(name) == NEWTON[r["method"]], name
        settings = dict(kv.split("=") for kv in r["setting"].split(";"))
        assert cfg.model.optimizer._target_.lower().endswith(settings["optimizer"]), name
        assert OmegaConf.select(cfg, "trainer.max_epochs", default=1) == int(settings["epochs"]), name
        covered.append(tuple(r[c] for c in reference.COLUMNS))
    published = [tuple(r[c] for c in reference.COLUMNS)
                 for r in reference.load_table("newton_thesis_table7_1_classification")]
    assert sorted(covered) == sorted(published)


@pytest.mark.parametrize("names", [pytest.param(REPRESENTATIVE, id="representative"),
                                   pytest.param(ROWS, id="all", marks=pytest.mark.slow)])
def test_rows_compose(compose_train, names):
    for name in names:
        cfg = compose_train([f"experiment={name}"], fast=False)
        choices = cfg.hydra.runtime.choices
        assert choices.loss == "softmax_ce" and choices.newton == row_newton(name) and choices.data == "mnist"
        assert cfg.data.val_size == 5000 and cfg.data.batch_size == 100
        assert cfg.callbacks.model_checkpoint.monitor is None  # the last epoch is tested, not a selected one


def test_a_row_refuses_another_newton_loss(compose_train):
    with pytest.raises(ValueError, match="newton=fisher"):
        train(compose_train(["experiment=classification/thesis_t7_1/m1_sgd_fisher", "newton=hessian"]))


def test_protocol_trains_and_tests_the_last_epoch(compose_train, mnist_root):
    """Two epochs on tiny MNIST files: the tested checkpoint is the second epoch's, whatever validation says."""
    cfg = compose_train(["experiment=classification/mnist", "newton=fisher", "trainer.max_epochs=2",
                         *_small(mnist_root)], fast=False)
    cfg.trainer.enable_progress_bar = False
    record = train(cfg)
    metrics = record.metrics
    assert 0 <= metrics["test/top1"] <= 1
    assert record.checkpoint["epoch"] == 1


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in REPRESENTATIVE else pytest.mark.slow)
                                  for n in ROWS])
def test_fast_dev_run(compose_train, mnist_root, name):
    record = train(compose_train([f"experiment={name}", *_small(mnist_root)]))
    metrics = record.metrics
    assert 0 <= metrics["test/top1"] <= 1 and math.isfinite(metrics["test/loss"])
    assert record.paper["table"] == "7.1"


def _record(method: str, operator: str, value: float, seed: int) -> tuple[str, RunRecord]:
    paper = {"paper": "petersen_thesis_2022", "table": "7.1", "dataset": "mnist", "model": "fc5_relu_100",
             "method": method, "setting": "optimizer=sgd;epochs=1;model_label=M1"}
    return f"/runs/{operator}/{seed}/results.json", RunRecord(paper=paper, metrics={"test/top1": value},
                                                              optimizer_steps=550, global_batch=100, status="done")


def test_report_compares_each_newton_variant_with_regular_by_welch():
    regular = [0.930, 0.932, 0.929, 0.931]
    fisher = [0.945, 0.947, 0.944, 0.946]
    hessian = [0.931, 0.929, 0.932, 0.930]
    records = [_record("Regular", "softmax_ce", v, i) for i, v in enumerate(regular)]
    records += [_record("Newton L. (F)", "fisher", v, i) for i, v in enumerate(fisher)]
    records += [_record("Newton L. (H)", "hessian", v, i) for i, v in enumerate(hessian)]
    lines = report.collect_runs(records)["tables"][("petersen_thesis_2022", "7.1")]
    by = {ln["row"]["method"]: ln for ln in lines if ln["runs"]}
    assert "vs_regular" not in by["Regular"]
    f, h = by["Newton L. (F)"]["vs_regular"], by["Newton L. (H)"]["vs_regular"]
    expected = ttest_ind([100 * v for v in fisher], [100 * v for v in regular], equal_var=False).pvalue
    assert f["p"] == pytest.approx(expected) and f["significant"] and f["ours"] == pytest.approx(1.5)
    assert f["paper"] == pytest.approx(94.56 - 93.06)
    assert not h["significant"] and h["p"] > 0.5
    header, cells = table_rows(lines)
    assert header[-1] == "ours − Regular (Welch p)"
    fisher_cell = next(c for c, ln in zip(cells, lines) if ln is by["Newton L. (F)"])
    assert fisher_cell[-1].startswith("+1.50 (p=") and fisher_cell[-1].endswith("**")


def test_report_never_pools_devices():
    """A seed run on the CPU and on a GPU is one seed twice (same initialisation and data order): own lines."""
    records = []
    for device in ("cpu (AMD EPYC, 1 thread)", "NVIDIA H100 80GB HBM3 (CUDA 13.0)"):
        for i, v in enumerate((0.930, 0.932)):
            path, rec = _record("Regular", "softmax_ce", v, i)
            rec.device = device
            records.append((path.replace("/runs/", f"/{device[:3]}/"), rec))
    lines = [ln for ln in report.collect_runs(records)["tables"][("petersen_thesis_2022", "7.1")] if ln["runs"]]
    assert sorted(ln["device"] for ln in lines) == ["NVIDIA H100 80GB HBM3", "cpu"]
    assert all(ln["runs"] == 2 for ln in lines)
    header, _ = table_rows(lines)
    assert "device" in header
