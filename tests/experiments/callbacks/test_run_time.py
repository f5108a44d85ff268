"""The run-time estimate: measured after warmup + measure steps and after the first validation."""

from __future__ import annotations

import logging

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from diffrank.experiments.callbacks import RunTimeEstimate


def _fit(tmp_path, cb, **trainer_kw):
    trainer = L.Trainer(default_root_dir=tmp_path, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb], **trainer_kw)
    trainer.fit(BoringModel())
    return trainer


def test_estimate_after_steps_and_first_validation(tmp_path, caplog):
    cb = RunTimeEstimate(warmup=2, measure=5)
    with caplog.at_level(logging.INFO, logger="diffrank.experiments.callbacks.run_time"):
        trainer = _fit(tmp_path, cb, max_steps=40, val_check_interval=10, check_val_every_n_epoch=None,
                       limit_val_batches=2)
    assert cb.step_s > 0 and cb.val_s > 0
    assert cb.total_steps(trainer) == 40 and cb.validations(trainer, 40) == 4
    lines = [r.getMessage() for r in caplog.records if "run-time estimate" in r.getMessage()]
    assert len(lines) == 2  # after 7 steps, then with the first validation
    assert "40 steps" in lines[0] and "after the first one" in lines[0]
    assert "4 validations" in lines[1] and "ends ~" in lines[1]


def test_epoch_runs_count_steps_from_epochs(tmp_path):
    cb = RunTimeEstimate(warmup=0, measure=1)
    trainer = _fit(tmp_path, cb, max_epochs=2, limit_train_batches=8, limit_val_batches=1)
    assert cb.total_steps(trainer) == 16 and cb.validations(trainer, 16) == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="measure >= 1"):
        RunTimeEstimate(measure=0)
