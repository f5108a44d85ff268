"""The divergence guard's chance check: validation accuracy back at chance after it was well above, measured
against the gain over chance the run had reached (fake trainer and module: no training), and the record of a
run whose loss explodes (one short training run)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from diffrank.experiments.callbacks import DivergenceGuard


def _validate(classes: int, accuracies, guard: DivergenceGuard | None = None):
    guard = guard or DivergenceGuard()
    metrics: dict = {}
    trainer = SimpleNamespace(sanity_checking=False, callback_metrics=metrics, datamodule=None, current_epoch=0,
                              world_size=1, should_stop=False, global_step=0)
    for epoch, acc in enumerate(accuracies):
        trainer.current_epoch = epoch
        metrics["val/top1"] = torch.tensor(acc)
        guard.on_validation_end(trainer, SimpleNamespace(num_classes=classes))
    return guard, trainer


@pytest.mark.parametrize(("classes", "accuracies"), [(2, (0.80, 0.74)), (2, (0.76, 0.75)), (3, (0.70, 0.49)),
                                                     (2, (0.95, 0.60)), (10, (0.9, 0.2))])
def test_an_ordinary_dip_of_a_classifier_with_few_classes_is_not_divergence(classes, accuracies):
    """A binary classifier going from 0.80 to 0.74 (chance 0.5) was recorded as diverged, a final status: a margin of
    1.5 x chance is 0.75 for two classes. A dip that keeps part of the gain over chance goes on."""
    guard, trainer = _validate(classes, accuracies)
    assert guard.reason is None and not trainer.should_stop


@pytest.mark.parametrize(("classes", "accuracies"), [(2, (0.80, 0.52)), (2, (0.9, 0.45)), (3, (0.70, 0.35)),
                                                     (10, (0.6, 0.9, 0.1)), (10, (0.9, 0.17)), (100, (0.6, 0.02))])
def test_validation_back_at_chance_is_divergence_for_any_class_count(classes, accuracies):
    """Back within 10 % of the gain over chance (value - chance <= 0.1 (best - chance)): diverged, with the reason."""
    guard, trainer = _validate(classes, accuracies)
    assert trainer.should_stop and f"fell to {accuracies[-1]:.4f}" in guard.reason
    assert f"chance: {1 / classes:.4f}" in guard.reason


def test_the_chance_margin_is_a_fraction_of_the_gain():
    """The margin is a fraction in (0, 1): the old factor of chance (1.5) is refused by name."""
    for bad in (0, 1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="0 < chance_margin < 1"):
            DivergenceGuard(chance_margin=bad)
    guard, trainer = _validate(2, (0.80, 0.74), DivergenceGuard(chance_margin=0.9))  # 0.74 - 0.5 <= 0.27
    assert trainer.should_stop


def test_only_a_run_that_left_chance_falls_back_to_it_and_a_nan_loss_diverges():
    """The Newton-loss run that diverged in epoch 21 (training loss 0.0 at 10 % on 10 classes): validation at
    chance after it was above is divergence; a run that never left chance is not called diverged; a NaN training
    loss is divergence at once."""
    guard = DivergenceGuard()
    metrics = {}
    trainer = SimpleNamespace(sanity_checking=False, callback_metrics=metrics, datamodule=None, current_epoch=0,
                              world_size=1, should_stop=False, global_step=0)
    module = SimpleNamespace(num_classes=10)
    for acc in (0.11, 0.3, 0.10):  # never learned much (a top-5 run's top-1, say): not a divergence
        metrics["val/top1"] = torch.tensor(acc)
        guard.on_validation_end(trainer, module)
    assert guard.reason is None and not trainer.should_stop
    for acc in (0.6, 0.9, 0.1):
        metrics["val/top1"] = torch.tensor(acc)
        guard.on_validation_end(trainer, module)
    assert trainer.should_stop and "fell to 0.1000" in guard.reason
    nan = DivergenceGuard()
    nan.on_train_batch_end(trainer, module, {"loss": torch.tensor(float("nan"))}, None, 0)
    assert "nan" in nan.reason


def test_an_exploding_loss_is_recorded_as_diverged(tiny_run, tmp_path):
    """T model.optimizer.lr=1e6: the run stops, its record says diverged (not done), a single run exits 3."""
    from diffrank.experiments.records.record import RECORD_FILE, RunRecord
    from diffrank.experiments.run.train import run

    with pytest.raises(SystemExit) as stopped:
        run(tiny_run(tmp_path, ["model.optimizer.lr=1e6", "trainer.max_epochs=3"]))
    assert stopped.value.code == 3
    rec = RunRecord.read(tmp_path / RECORD_FILE)
    assert rec.status == "diverged" and "diverged" in rec.error and rec.optimizer_steps < 12
