"""A checkpoint knows what it was trained with: resuming or evaluating it with other choices is refused
(issue 25 items 3, 4, 10), unless ``+resume_with_changes=true``, which results.json records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from conftest import make_compose
from diffrank.experiments.callbacks.run_identity import KEY, check_checkpoint, differences
from diffrank.experiments.run.train import train

SMALL = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64", "trainer.max_epochs=1",
         "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "~logger",
         "extras.keep_freed_memory=false"]


def _cfg(compose_train, out: Path, overrides, small=SMALL):
    cfg = compose_train([*small, *overrides], fast=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
    return cfg


@pytest.fixture(scope="module")
def sinkhorn_run(tmp_path_factory):
    """One short sinkhorn / half_top5 run on digits100: its last.ckpt."""
    out = tmp_path_factory.mktemp("sinkhorn")
    train(_cfg(make_compose(out), out, ["operator=sinkhorn", "pk=half_top5"]))
    return out / "checkpoints" / "last.ckpt"


def test_checkpoint_holds_the_run_identity(sinkhorn_run):
    saved = torch.load(sinkhorn_run, map_location="cpu", weights_only=False)[KEY]
    assert saved["choices"]["operator"] == "sinkhorn" and saved["choices"]["pk"] == "half_top5"
    assert saved["data"]["split_seed"] == 0 and "num_workers" not in saved["data"]
    assert saved["loss"]["operator"]["_target_"].endswith("SinkhornSort")


def test_resume_with_other_choices_is_refused(compose_train, tmp_path, sinkhorn_run):
    """Item 3: softsort / top1 resuming a sinkhorn / half_top5 checkpoint used to exit 0 recorded as softsort."""
    cfg = _cfg(compose_train, tmp_path, ["operator=softsort", "pk=top1", "trainer.max_epochs=2",
                                         f"ckpt_path={sinkhorn_run}"])
    with pytest.raises(ValueError, match=r"(?s)other choices.*choices\.operator: 'sinkhorn' → 'softsort'.*"
                                         r"choices\.pk: 'half_top5' → 'top1'.*\+resume_with_changes=true"):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()  # refused before training


def test_resume_with_changes_is_recorded(compose_train, tmp_path, sinkhorn_run):
    _, objects = train(_cfg(compose_train, tmp_path, ["operator=softsort", "trainer.max_epochs=2",
                                                      f"ckpt_path={sinkhorn_run}", "+resume_with_changes=true"]))
    changes = json.loads((tmp_path / "results.json").read_text())["resumed_with_changes"]
    assert any(c.startswith("choices.operator: 'sinkhorn' → 'softsort'") for c in changes)
    assert objects["results"]["resumed_with_changes"] == changes


def test_resume_with_the_same_choices_and_a_longer_budget_is_allowed(compose_train, tmp_path, sinkhorn_run):
    _, objects = train(_cfg(compose_train, tmp_path, ["operator=sinkhorn", "pk=half_top5", "trainer.max_epochs=2",
                                                      f"ckpt_path={sinkhorn_run}"]))
    assert objects["results"]["resumed_with_changes"] is None and objects["results"]["global_step"] == 8


def test_evaluation_on_another_split_is_refused(compose_train, tmp_path, sinkhorn_run):
    """Item 4: train=false with another data.split_seed evaluated another test set without a word."""
    with pytest.raises(ValueError, match=r"(?s)would be evaluated.*data\.split_seed: 0 → 1"):
        train(_cfg(compose_train, tmp_path, ["train=false", f"ckpt_path={sinkhorn_run}", "data.split_seed=1"]))
    # the run seed and the batch only shape training: an evaluation may change them
    _, objects = train(_cfg(compose_train, tmp_path / "ok", ["train=false", f"ckpt_path={sinkhorn_run}", "seed=3",
                                                             "data.batch_size=32"]))
    assert objects["results"]["resumed_with_changes"] is None


def test_checkpoint_of_another_model_names_the_mistake(compose_train, tmp_path, sinkhorn_run):
    """Item 10: another model's checkpoint ended in load_state_dict's missing / unexpected keys."""
    digits = [o for o in SMALL if not o.startswith("data.n_")]  # 10 classes: another head
    with pytest.raises(ValueError, match=r"(?s)other choices.*choices\.data: 'digits100' → 'digits'"):
        train(_cfg(compose_train, tmp_path, ["data=digits", "train=false", f"ckpt_path={sinkhorn_run}"], digits))
    # a checkpoint without an identity (written before it existed) still gets a clear error, not torch's
    ckpt = torch.load(sinkhorn_run, map_location="cpu", weights_only=False)
    del ckpt[KEY]
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    with pytest.raises(ValueError, match=r"holds the weights of another model"):
        train(_cfg(compose_train, tmp_path / "b", ["data=digits", "loss.m=null", "pk=top1", "train=false",
                                                   f"ckpt_path={old}"], digits))


def test_differences_list_leaves_and_skip_training_only_keys_for_evaluation():
    saved = {"choices": {"operator": "a"}, "data": {"seed": 0, "split_seed": 0, "batch_size": 4}}
    current = {"choices": {"operator": "a", "pk": "top1"}, "data": {"seed": 1, "split_seed": 0, "batch_size": 8}}
    assert differences(saved, current) == ["choices.pk: '<unset>' → 'top1'", "data.batch_size: 4 → 8",
                                           "data.seed: 0 → 1"]
    assert differences(saved, current, evaluation=True) == ["choices.pk: '<unset>' → 'top1'"]


def test_old_checkpoint_without_identity_warns(tmp_path, caplog):
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": {}}, path)
    assert check_checkpoint(path, {"choices": {}}, evaluation=False, allow_changes=False) == []
    assert "holds no run identity" in caplog.text
