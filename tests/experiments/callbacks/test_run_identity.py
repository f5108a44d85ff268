"""A checkpoint knows what it was trained with: resuming or evaluating it with other choices is refused
(another operator, P_K, split or model), unless ``+resume_with_changes=true``, which results.json records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from diffrank.experiments.callbacks.run_identity import (
    KEY,
    check_checkpoint,
    differences,
    read_checkpoint,
    resolved_config_hash,
)
from diffrank.experiments.records.folder import LAST_CHECKPOINT
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
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
def sinkhorn_run(tmp_path_factory, make_compose):
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
    record = train(_cfg(compose_train, tmp_path, ["operator=softsort", "trainer.max_epochs=2",
                                                      f"ckpt_path={sinkhorn_run}", "+resume_with_changes=true"]))
    changes = json.loads((tmp_path / "results.json").read_text())["resumed_with_changes"]
    assert any(c.startswith("choices.operator: 'sinkhorn' → 'softsort'") for c in changes)
    assert record.resumed_with_changes == changes


def test_resume_with_the_same_choices_and_a_longer_budget_is_allowed(compose_train, tmp_path, sinkhorn_run):
    record = train(_cfg(compose_train, tmp_path, ["operator=sinkhorn", "pk=half_top5", "trainer.max_epochs=2",
                                                      f"ckpt_path={sinkhorn_run}"]))
    assert record.resumed_with_changes is None and record.global_step == 8


def test_evaluation_on_another_split_is_refused(compose_train, tmp_path, sinkhorn_run):
    """Item 4: train=false with another data.split_seed evaluated another test set without a word."""
    with pytest.raises(ValueError, match=r"(?s)would be evaluated.*data\.split_seed: 0 → 1"):
        train(_cfg(compose_train, tmp_path, ["train=false", f"ckpt_path={sinkhorn_run}", "data.split_seed=1"]))
    # the run seed and the batch only shape training: an evaluation may change them
    record = train(_cfg(compose_train, tmp_path / "ok", ["train=false", f"ckpt_path={sinkhorn_run}", "seed=3",
                                                             "data.batch_size=32"]))
    assert record.resumed_with_changes is None


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


def _record(folder: Path) -> RunRecord:
    rec = RunRecord.read(folder / RECORD_FILE)
    assert rec is not None, f"no record in {folder}"
    return rec


def test_resume_with_other_code_is_warned_and_recorded_per_segment(tiny_run, tmp_path, caplog):
    """Resuming a checkpoint after checking out other code: a warning names both versions, and the record lists
    one segment per version."""
    a = tmp_path / "a"
    train(tiny_run(a, ["trainer.max_epochs=1"]))
    last = a / LAST_CHECKPOINT
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert "diffrank_run_meta" in ckpt, "the checkpoint does not say which code wrote it"
    ckpt["diffrank_run_meta"]["segments"][-1].update(git_sha="0123456789abcdef", git_dirty=False)
    torch.save(ckpt, last)
    with caplog.at_level("WARNING"):
        train(tiny_run(tmp_path / "b", ["trainer.max_epochs=2", f"ckpt_path={last}"]))
    assert "written by code 0123456789" in caplog.text
    rec = _record(tmp_path / "b")
    assert [s["from_step"] for s in rec.segments] == [0, 4]
    assert rec.segments[0]["git_sha"] == "0123456789abcdef" and rec.segments[1]["git_sha"] == rec.git_sha
    assert rec.code.startswith("0123456789+")


def test_resume_that_changes_the_budget_is_refused_or_recorded(tiny_run, tmp_path):
    """Resuming with +trainer.accumulate_grad_batches=2: refused; with +resume_with_changes=true the record shows
    each segment's budget (4×64 + 2×128), not 6×128."""
    train(tiny_run(tmp_path / "a", ["trainer.max_epochs=1"]))
    last = tmp_path / "a" / LAST_CHECKPOINT
    resume = ["trainer.max_epochs=2", f"ckpt_path={last}", "+trainer.accumulate_grad_batches=2"]
    with pytest.raises(ValueError, match="accumulate_grad_batches: 1 → 2"):
        train(tiny_run(tmp_path / "b", resume))
    train(tiny_run(tmp_path / "c", [*resume, "+resume_with_changes=true"]))
    rec = _record(tmp_path / "c")
    assert rec.optimizer_steps == 6 and rec.budget == "4×64+2×128"
    assert any("accumulate_grad_batches" in c for c in rec.resumed_with_changes)


def test_unreadable_ckpt_path_says_so(tiny_run, tmp_path):
    """A truncated, byte-flipped or non-checkpoint ckpt_path: "not a readable checkpoint" / "not a Lightning
    checkpoint", naming the file."""
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "epoch": 0}, good)
    data = good.read_bytes()
    bad = {"truncated.ckpt": data[: len(data) // 2], "flipped.ckpt": bytes(b ^ 0xFF for b in data[:64]) + data[64:],
           "text.ckpt": b"not a checkpoint\n"}
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match="truncated.ckpt is not a readable checkpoint"):
        train(tiny_run(tmp_path / "run", ["train=false", f"ckpt_path={tmp_path / 'truncated.ckpt'}"]))
    for name in bad:
        with pytest.raises(ValueError, match=f"{name} is not a readable checkpoint"):
            read_checkpoint(tmp_path / name)
    torch.save([1, 2], tmp_path / "list.ckpt")
    with pytest.raises(ValueError, match="list.ckpt is not a Lightning checkpoint"):
        read_checkpoint(tmp_path / "list.ckpt")


def test_the_config_hash_does_not_depend_on_the_run_folder(tiny_run, tmp_path):
    """Two runs of one config in two folders (or a copy resumed elsewhere) share their hash; the checkpoint folder
    and the trainer's root interpolate the run folder and once made every run's hash its own."""
    a, b = tiny_run(tmp_path / "a"), tiny_run(tmp_path / "elsewhere" / "b")
    assert a.callbacks.model_checkpoint.dirpath != b.callbacks.model_checkpoint.dirpath
    assert resolved_config_hash(a) == resolved_config_hash(b)
    assert resolved_config_hash(tiny_run(tmp_path / "a", ["seed=1"])) != resolved_config_hash(a)
