"""The configured checkpoint callback: tie rule, last.ckpt after every validation, atomic files.

A scripted LightningModule logs chosen validation values, so that ties and non-improving epochs happen
on purpose; the callback is the one ``configs/callbacks/default.yaml`` builds.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from diffrank.experiments.run.instantiate import instantiate


class Scripted(L.LightningModule):
    """Logs ``val/top1 = values[i]`` at its i-th validation; optionally raises at a global step ("killed")."""

    def __init__(self, values, kill_at_step=None):
        super().__init__()
        self.values, self.kill_at_step, self.validations = list(values), kill_at_step, 0
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        if self.kill_at_step is not None and self.global_step >= self.kill_at_step:
            raise RuntimeError("killed")
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/top1", float(self.values[self.validations]))

    def on_validation_epoch_end(self):
        self.validations += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)  # 4 steps per epoch

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(2, 2)), batch_size=2)


def _fit(compose_train, tmp_path, values, overrides=(), kill_at_step=None, **trainer_kwargs):
    cfg = compose_train(list(overrides), fast=False)
    cb = instantiate(cfg.callbacks.model_checkpoint, dirpath=str(tmp_path / "checkpoints"))
    trainer = L.Trainer(callbacks=[cb], logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=str(tmp_path), **trainer_kwargs)
    model = Scripted(values, kill_at_step)
    if kill_at_step is None:
        trainer.fit(model)
    else:
        with pytest.raises(RuntimeError, match="killed"):
            trainer.fit(model)
    return cb


def _epoch(path):
    return torch.load(path, map_location="cpu", weights_only=False)["epoch"]


def _step(path):
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_tie_keeps_the_later_epoch(compose_train, tmp_path):
    """Epochs 1 and 3 tie at the best value: the configured rule (ties=later) selects epoch 3."""
    cb = _fit(compose_train, tmp_path, [0.5, 0.7, 0.6, 0.7], max_epochs=4)
    assert cb.ties == "later"
    assert _epoch(cb.best_model_path) == 3
    assert float(cb.best_model_score) == pytest.approx(0.7)


def test_tie_rule_earlier_is_lightnings(compose_train, tmp_path):
    cb = _fit(compose_train, tmp_path, [0.5, 0.7, 0.6, 0.7], ["++callbacks.model_checkpoint.ties=earlier"],
              max_epochs=4)
    assert _epoch(cb.best_model_path) == 1


def test_tie_with_top_k_keeps_the_later_ones(compose_train, tmp_path):
    cb = _fit(compose_train, tmp_path, [0.7, 0.5, 0.7, 0.7], ["++callbacks.model_checkpoint.save_top_k=2"],
              max_epochs=4)
    assert sorted(_epoch(p) for p in cb.best_k_models) == [2, 3]
    assert _epoch(cb.best_model_path) == 3


def test_min_mode_ties_keep_the_later_epoch(compose_train, tmp_path):
    cb = _fit(compose_train, tmp_path, [0.3, 0.2, 0.4, 0.2], ["optimized_mode=min"], max_epochs=4)
    assert _epoch(cb.best_model_path) == 3


def test_last_ckpt_is_the_last_epoch_when_the_metric_stops_improving(compose_train, tmp_path):
    """The best is epoch 0; last.ckpt must still hold the last epoch (Lightning's own: the last best)."""
    cb = _fit(compose_train, tmp_path, [0.9, 0.1, 0.2, 0.3], max_epochs=4)
    assert _epoch(cb.best_model_path) == 0
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert _epoch(last) == 3 and _step(last) == 16


def test_killed_run_keeps_its_last_completed_epoch(compose_train, tmp_path):
    """Killed in the third epoch (step 10 of 4-step epochs): last.ckpt is the end of the second."""
    _fit(compose_train, tmp_path, [0.9, 0.1, 0.2, 0.3], kill_at_step=10, max_epochs=4)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert _epoch(last) == 1 and _step(last) == 8


def test_last_ckpt_every_val_check_interval_for_step_protocols(compose_train, tmp_path):
    """Validation every 3 steps, epochs of 4 steps, killed at step 10: last.ckpt holds step 9."""
    _fit(compose_train, tmp_path, [0.9] + [0.1] * 10, kill_at_step=10, max_steps=20, max_epochs=-1,
         val_check_interval=3, check_val_every_n_epoch=None)
    assert _step(tmp_path / "checkpoints" / "last.ckpt") == 9


def test_configured_trainer_writes_checkpoints_atomically(compose_train, tmp_path, monkeypatch):
    """A save that dies half-way leaves the previous file whole, and no temporary file behind."""
    from diffrank.experiments.callbacks import AtomicCheckpointIO

    cfg = compose_train([], fast=False)
    trainer = instantiate(cfg.trainer, logger=False, enable_progress_bar=False)
    io = trainer.strategy.checkpoint_io
    assert isinstance(io, AtomicCheckpointIO)
    path = tmp_path / "ckpt" / "last.ckpt"
    io.save_checkpoint({"epoch": 1, "w": torch.arange(1000)}, path)

    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # the run is killed while writing

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"epoch": 2, "w": torch.arange(1000)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.load(path, weights_only=False)["epoch"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_unknown_tie_rule_is_rejected():
    from diffrank.experiments.callbacks import ModelCheckpoint

    with pytest.raises(ValueError, match="ties must be one of"):
        ModelCheckpoint(monitor="val/top1", ties="random")
