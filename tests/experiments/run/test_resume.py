"""Exact resume and checkpoint evaluation through train.py's flow (digits100, small, CPU).

A run is "killed" by making the training step raise at a chosen global step; it is resumed from its
``last.ckpt``; the final weights and test metrics must equal those of the run that was never interrupted,
bit for bit (CPU, same thread count).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from diffrank.experiments.models.classifier import TopKClassifier
from diffrank.experiments.run.train import run, train

SMALL = ["data.n_train=1024", "data.n_val=256", "data.n_test=256", "data.batch_size=64",  # 16 steps per epoch
         "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "~logger",
         "extras.keep_freed_memory=false"]
# the best checkpoint stays at epoch 0 (the loss falls): Lightning alone would never refresh last.ckpt
NOT_IMPROVING = ["optimized_metric=val/loss", "optimized_mode=max"]
STEPS = ["trainer.max_epochs=-1", "trainer.val_check_interval=6", "trainer.check_val_every_n_epoch=null"]


def _cfg(compose_train, out: Path, overrides):
    cfg = compose_train([*SMALL, *overrides], fast=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
    return cfg


def _killed(compose_train, out, overrides, step, monkeypatch):
    original = TopKClassifier.training_step

    def training_step(self, batch, batch_idx):
        if self.global_step >= step:
            raise RuntimeError("killed")
        return original(self, batch, batch_idx)

    with monkeypatch.context() as m:
        m.setattr(TopKClassifier, "training_step", training_step)
        with pytest.raises(RuntimeError, match="killed"):
            train(_cfg(compose_train, out, overrides))
    return out / "checkpoints" / "last.ckpt"


def _final(out: Path):
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    adam = ckpt["optimizer_states"][0]["state"]
    return {**ckpt["state_dict"], **{f"adam.{i}.{k}": v for i, s in adam.items() for k, v in s.items()}}


def _same_run(a, b, out_a: Path, out_b: Path):
    """The final weights and Adam moments (last.ckpt) are equal bit for bit, and so are the test metrics."""
    ma, mb = a.metrics, b.metrics
    wa, wb = _final(out_a), _final(out_b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"weights differ after resume: {differ}"
    tests = {k: v for k, v in ma.items() if k.startswith("test/")}
    assert tests and tests == {k: mb[k] for k in tests}
    assert a.checkpoint["epoch"] == b.checkpoint["epoch"]
    assert a.global_step == b.global_step


def test_killed_run_resumes_exactly(compose_train, tmp_path, monkeypatch):
    """3 epochs of 16 steps; a run killed at step 40 (epoch 2) resumes from last.ckpt = end of epoch 1."""
    full = train(_cfg(compose_train, tmp_path / "full", [*NOT_IMPROVING, "trainer.max_epochs=3"]))
    last = _killed(compose_train, tmp_path / "killed", [*NOT_IMPROVING, "trainer.max_epochs=3"], 40, monkeypatch)
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert (ckpt["epoch"], ckpt["global_step"]) == (1, 32)
    assert {"python", "numpy", "torch", "cuda"} <= set(ckpt["diffrank_resume"]["rng"])
    resumed = train(_cfg(compose_train, tmp_path / "resumed", [*NOT_IMPROVING, "trainer.max_epochs=3",
                                                               f"ckpt_path={last}"]))
    _same_run(full, resumed, tmp_path / "full", tmp_path / "resumed")
    # the best-so-far crossed the resume: the best is still epoch 0, in the killed run's folder
    assert resumed.checkpoint["path"] == str(tmp_path / "killed/checkpoints/epoch_000.ckpt")


def test_killed_step_protocol_resumes_mid_epoch_exactly(compose_train, tmp_path, monkeypatch):
    """Validation (and last.ckpt) every 6 steps, epochs of 16 steps: killed at step 21, resumed from step 18
    (2 batches into epoch 1), to 30 steps."""
    full = train(_cfg(compose_train, tmp_path / "full", [*STEPS, "trainer.max_steps=30"]))
    last = _killed(compose_train, tmp_path / "killed", [*STEPS, "trainer.max_steps=30"], 21, monkeypatch)
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 18 and ckpt["diffrank_resume"]["batches"] == 2
    resumed = train(_cfg(compose_train, tmp_path / "resumed", [*STEPS, "trainer.max_steps=30", f"ckpt_path={last}"]))
    _same_run(full, resumed, tmp_path / "full", tmp_path / "resumed")


def test_evaluate_a_checkpoint(train_built, compose_train, tmp_path):
    """train=false ckpt_path=X tests X's weights (the numbers the training run reported for X), records it
    as an evaluation of X, and returns without asking for a training metric."""
    record, objects = train_built(_cfg(compose_train, tmp_path / "train", ["trainer.max_epochs=2"]))
    metrics = record.metrics
    best = str(Path(objects["trainer"].checkpoint_callback.best_model_path).resolve())
    ckpt = torch.load(best, map_location="cpu", weights_only=False)
    cfg = _cfg(compose_train, tmp_path / "eval", ["train=false", f"ckpt_path={best}"])
    value = run(cfg)  # the run entry point: must not raise for a missing training metric
    rec = json.loads((tmp_path / "eval" / "results.json").read_text())
    tests = {k: v for k, v in metrics.items() if k.startswith("test/")}
    assert tests and tests == {k: rec["metrics"][k] for k in tests}  # the checkpoint's weights, not fresh ones
    assert rec["evaluated_checkpoint"] == best
    assert (rec["checkpoint"]["epoch"], rec["global_step"]) == (ckpt["epoch"], ckpt["global_step"])
    assert value == rec["metrics"]["val/top1"]  # validated too: the selection metric of that checkpoint
    assert rec["metrics"]["val/top1"] == pytest.approx(float(objects["trainer"].checkpoint_callback.best_model_score))


def test_evaluation_needs_a_checkpoint(compose_train, tmp_path):
    with pytest.raises(ValueError, match="ckpt_path"):
        train(_cfg(compose_train, tmp_path, ["train=false"]))
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        train(_cfg(compose_train, tmp_path, ["train=false", f"ckpt_path={tmp_path / 'missing.ckpt'}"]))


def test_results_name_the_tested_checkpoint_and_the_compute(compose_train, tmp_path):
    """The headline's conditions: the tested checkpoint with its selection rule, and what decides the bits."""
    rec = train(_cfg(compose_train, tmp_path, ["trainer.max_epochs=1"]))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["checkpoint"]["selected_by"] == {"monitor": "val/top1", "mode": "max", "ties": "later",
                                                  "score": pytest.approx(saved["metrics"]["val/top1_best"])}
    assert saved["checkpoint"]["path"].endswith("epoch_000.ckpt") and saved["checkpoint"]["epoch"] == 0
    compute = saved["compute"]
    assert compute["num_threads"] == torch.get_num_threads()
    assert compute["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert {"cpu_model", "num_interop_threads", "env", "torch", "cuda", "cudnn", "onednn",
            "deterministic"} <= set(compute)
    assert saved["split_seed"] == 0 and saved["seed"] == 0
    assert rec.evaluated_checkpoint is None


def test_resume_after_the_last_validation_reports_its_score(compose_train, tmp_path):
    """A run killed while testing resumes with nothing left to train: its selection metric is the checkpoint's
    last validation (no KeyError for an unlogged metric), and the test metrics are those of the same weights."""
    metrics = train(_cfg(compose_train, tmp_path / "a", ["trainer.max_epochs=1"])).metrics
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    again = train(_cfg(compose_train, tmp_path / "b", ["trainer.max_epochs=1", f"ckpt_path={last}"])).metrics
    assert again["val/top1"] == pytest.approx(metrics["val/top1"])
    assert {k: v for k, v in again.items() if k.startswith("test/")} == \
        {k: v for k, v in metrics.items() if k.startswith("test/")}


def test_a_moved_run_folder_tests_the_best_checkpoint_beside_ckpt_path(tiny_run, tmp_path):
    """Resume from a moved run folder: the best checkpoint (epoch 0) is found beside last.ckpt and tested."""
    from diffrank.experiments.records.folder import LAST_CHECKPOINT
    from diffrank.experiments.records.record import RECORD_FILE, RunRecord

    train(tiny_run(tmp_path / "a", [*NOT_IMPROVING, "trainer.max_epochs=2"]))
    (tmp_path / "a").rename(tmp_path / "moved")
    moved = tmp_path / "moved"
    train(tiny_run(moved, [*NOT_IMPROVING, "trainer.max_epochs=3", f"ckpt_path={moved / LAST_CHECKPOINT}"]))
    rec = RunRecord.read(moved / RECORD_FILE)
    assert rec.checkpoint["path"] == str((moved / "checkpoints" / "epoch_000.ckpt").resolve())
    assert rec.checkpoint["epoch"] == 0 and "best_checkpoint_missing" not in rec.extra
