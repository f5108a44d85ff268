"""End to end: train.py's flow with fast_dev_run for every operator config and the baselines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from diffrank.experiments.run.train import train
from diffrank.operators import load
from helpers import ROOT, options

SMALL = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64"]


def _topk_operators():
    return [n for n in options("operator") if "topk_membership" in load(n).capabilities]


@pytest.mark.parametrize("name", _topk_operators())
def test_fast_dev_run_every_operator(compose_train, name):
    cfg = compose_train([f"operator={name}", "pk=half_top5", *SMALL])
    record = train(cfg)
    metrics = record.metrics
    assert {"test/top1", "test/top5"} <= set(metrics)
    assert 0 <= metrics["test/top5"] <= 1 and metrics["test/top1"] <= metrics["test/top5"]
    rec = record.to_dict()
    assert rec["choices"]["operator"] == name and rec["choices"]["pk"] == "half_top5"
    saved = json.loads((ROOT / cfg.paths.output_dir / "results.json").read_text())
    assert saved["metrics"]["test/top1"] == pytest.approx(metrics["test/top1"])
    assert {"git_sha", "git_dirty", "versions", "wall_time_s", "device", "overrides"} <= set(saved)
    assert saved["global_step"] == 1  # fast_dev_run: one optimizer step


@pytest.mark.parametrize("name", [n for n in options("operator") if n not in _topk_operators()])
def test_operator_without_topk_is_rejected_by_topk_loss(compose_train, name):
    cfg = compose_train([f"operator={name}", *SMALL])
    with pytest.raises(ValueError, match="needs an operator that provides 'topk_membership'"):
        train(cfg)


# the classifier's baselines: not the losses of other models (sorting: sort_*, resgro; deep kNN: knn and its
# autoencoder's reconstruction_mse; top-K recommendation: bpr, item_softmax and the NDCG losses, which
# tests/experiments/models/test_recsys_experiments.py trains)
OTHER_MODELS = ("topk_ce", "knn", "reconstruction_mse", "resgro", "bpr", "item_softmax", "neural_ndcg", "approx_ndcg")


@pytest.mark.parametrize("loss", [o for o in options("loss") if o not in OTHER_MODELS and not o.startswith("sort_")])
def test_fast_dev_run_baseline_losses(compose_train, loss):
    record = train(compose_train([f"loss={loss}", *SMALL]))
    metrics = record.metrics
    assert "test/top5" in metrics
    rec = record.to_dict()  # the baselines read neither ${operator} nor ${pk}: the run records neither
    assert rec["choices"]["loss"] == loss and not {"operator", "pk"} & set(rec["choices"])
    assert rec["config"]["operator"] is None and rec["config"]["pk"] is None


def test_m_subset_and_top1_modes(train_built, compose_train):
    for mode in ("eq4", "sm", "sort"):
        _, objects = train_built(compose_train(["operator=softsort", "loss.m=8", f"loss.top1_mode={mode}", *SMALL]))
        assert objects["loss"].m == 8 and objects["loss"].top1_mode == mode


def test_unknown_names_list_the_known_ones(compose_train):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="half_top5"):
        compose_train(["pk=no_such_pk"])
    with pytest.raises(MissingConfigException, match="sinkhorn"):
        compose_train(["operator=no_such_operator"])


def test_bad_pk_from_command_line(compose_train):
    with pytest.raises(ValueError, match="sum to 1"):
        train(compose_train(["pk.weights=[0.5,0.4]", *SMALL]))
    with pytest.raises(ValueError, match="negative"):
        train(compose_train(["pk.weights=[1.5,-0.5]", *SMALL]))


def test_pk_from_command_line(train_built, compose_train):
    record, objects = train_built(compose_train(["pk.weights=[0.5,0.5]", "operator=neuralsort", *SMALL]))
    assert objects["loss"].p_k.weights == (0.5, 0.5)


def test_every_config_group_option_composes(compose_train):
    """Every option composes, is the recorded choice, every ``_target_`` in it names an importable object (a
    typo would otherwise surface only when a run builds it), and none has a string where its target takes a number
    (:func:`~diffrank.experiments.run.composition.check_value_types`; ``${oc.env:…}`` values are left alone)."""
    from diffrank.experiments.run.composition import check_value_types
    from diffrank.registry import locate

    def targets(node):
        if isinstance(node, dict):
            yield from ([node["_target_"]] if "_target_" in node else [])
            for v in node.values():
                yield from targets(v)
        elif isinstance(node, list):
            for v in node:
                yield from targets(v)

    for group in ("operator", "pk", "loss", "data", "model", "trainer", "logger", "callbacks", "debug"):
        for opt in options(group):
            cfg = compose_train([f"{group}={opt}"])
            assert cfg.hydra.runtime.choices[group] == opt
            check_value_types(cfg)
            node = OmegaConf.to_container(cfg.get(group), resolve=False) if cfg.get(group) is not None else None
            for target in targets(node):
                assert callable(locate(target)), (group, opt, target)


def test_train_py_subprocess(tmp_path):
    """The real command line, as `make train` runs it (tiny sizes)."""
    out = subprocess.run(
        [sys.executable, "train.py", "trainer.fast_dev_run=true", f"paths.log_dir={tmp_path}", *SMALL,
         "extras.print_config=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "test/top5" in out.stdout
    assert list(tmp_path.glob("train/runs/*/results.json"))


def test_model_brings_its_loss_and_selection_metric(train_built, compose_train):
    """model=sorting with sorting data and any full-P operator trains: sort_bce and val/em5 come with the model."""
    cfg = compose_train(["model=sorting", "data=digits_sort", "operator=neuralsort", "data.batch_size=8",
                         "data.val_sets=8", "data.test_sets=8"])
    assert cfg.hydra.runtime.choices.loss == "sort_bce" and cfg.optimized_metric == "val/em5"
    assert OmegaConf.to_container(cfg.loss)["operator"] == "${operator}"  # the loss is assembled in its yaml
    record, objects = train_built(cfg)
    metrics = record.metrics
    assert "val/em5" in metrics and "test/em" in metrics
    assert type(objects["loss"]).__name__ == "SortingBCELoss" and type(objects["operator"]).__name__ == "NeuralSort"
    assert "pk" not in record.choices
    assert compose_train([]).optimized_metric == "val/top1"  # the classifier's


def test_sorting_data_without_files_names_them(compose_train, tmp_path):
    """data=mnist_sort / svhn_sort composed by hand without their files: the files, not an interpolation error."""
    from diffrank.experiments.data.number_sets import MNIST_FILES
    from diffrank.experiments.data.svhn_sort import SVHN_FILES

    for extra in ([], ["model=sorting"]):
        with pytest.raises(FileNotFoundError) as e:
            train(compose_train(["data=mnist_sort", f"paths.data_dir={tmp_path}", *extra]))
        assert all(str(tmp_path / "MNIST" / "raw" / f) in str(e.value) for f in MNIST_FILES)
    with pytest.raises(FileNotFoundError) as e:
        train(compose_train(["model=sorting", "data=svhn_sort", f"paths.data_dir={tmp_path}"]))
    assert all(f"SVHNMultiDigit/{f}" in str(e.value) for f in SVHN_FILES.values())


def test_model_and_data_that_do_not_fit_name_the_fix(compose_train):
    with pytest.raises(ValueError, match=r"model=classifier does not fit data=digits_sort.*model=sorting"):
        train(compose_train(["data=digits_sort"]))


def test_run_that_never_validates_fails_and_says_why(compose_train, tmp_path):
    """trainer.max_steps=2 ends before the first validation: a clear KeyError and a "failed" record, not "done"."""
    from diffrank.experiments.records.record import RunRecord
    from diffrank.experiments.run.train import run

    cfg = compose_train(["trainer.max_steps=2", "trainer.enable_progress_bar=false", *SMALL], fast=False)
    with pytest.raises(KeyError, match="ended before its first validation"):
        run(cfg)
    rec = RunRecord.read(tmp_path / "results.json")
    assert rec.status == "failed" and "first validation" in rec.error


def test_smooth_topk_loss_configs(compose_train):
    """The configs of the smooth top-k SVM losses (Berrada et al., ICLR 2018) build the library's classes with
    their defaults (k = 5, τ = 1) and read neither ``${operator}`` nor ``${pk}``."""
    from diffrank.experiments.run.instantiate import instantiate
    from diffrank.losses.smooth_topk import SmoothHardTopKLoss, SmoothTopKLoss

    for name, cls in (("smooth_topk", SmoothTopKLoss), ("smooth_hard_topk", SmoothHardTopKLoss)):
        cfg = compose_train([f"loss={name}"])
        assert "operator" not in cfg.loss and "p_k" not in cfg.loss
        built = instantiate(cfg.loss)
        assert type(built) is cls and built.k == 5 and built.tau == 1.0


@pytest.mark.parametrize("overrides", [["operator.p=2"], ["operator.p=2", "operator.solver=dykstra"]],
                         ids=["p2", "dykstra"])
def test_sparse_soft_topk_trains_with_its_other_p_and_solver(compose_train, overrides):
    """The sparse soft top-k's defaults run in test_fast_dev_run_every_operator; here its other p and solver."""
    metrics = train(compose_train(["operator=sparse_soft_topk", "pk=half_top5", "trainer.fast_dev_run=true",
                                      *overrides, *SMALL])).metrics
    assert 0 <= metrics["test/top1"] <= metrics["test/top5"] <= 1
