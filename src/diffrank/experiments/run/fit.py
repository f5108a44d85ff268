"""Fit, then test the selected checkpoint; or evaluate a given checkpoint (``train=false ckpt_path=…``)
(:func:`fit_built`, :func:`fit_and_test`), and check that a training run logged its ``optimized_metric``
(:func:`check_selection_metric`).

What :func:`fit_and_test` returns under ``"checkpoint"`` goes into ``results.json``: which weights the
test metrics belong to (path, epoch, global step, the monitored value and the tie rule), so that a
headline number names its checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from diffrank.experiments.callbacks import DivergenceGuard, RunIdentity
from diffrank.experiments.callbacks.run_identity import check_checkpoint, check_segment
from diffrank.experiments.records.finished import checkpoint_info
from diffrank.experiments.records.record import to_float
from diffrank.experiments.run.build import Built
from diffrank.experiments.run.instantiate import instantiate

log = logging.getLogger(__name__)


def _moved_best(best: str, ckpt_path: str | None) -> str:
    """The best checkpoint's path, or, when that file is gone and a file of its name lies beside ``ckpt_path``
    (the resumed run's folder was moved or copied), that file."""
    if not best or Path(best).is_file() or ckpt_path is None:
        return best
    beside = Path(ckpt_path).resolve().parent / Path(best).name
    if beside.is_file():
        log.info("best checkpoint %s is gone; the file of its name beside ckpt_path, %s, is tested (the run folder "
                 "was moved)", best, beside)
        return str(beside)
    return best


@contextmanager
def _loading(ckpt_path: str | None) -> Iterator[None]:
    """Turn torch's missing / unexpected keys of a checkpoint of another model into an error naming the file."""
    try:
        yield
    except RuntimeError as e:
        if ckpt_path is None or "Error(s) in loading state_dict" not in str(e):
            raise
        first = str(e).splitlines()[0:2]
        raise ValueError(f"ckpt_path={ckpt_path} holds the weights of another model than this run builds "
                         f"({' '.join(first)[:300]}…): give a checkpoint of the same experiment / model / net "
                         f"choices (its run folder's .hydra/overrides.yaml lists them)") from None


def fit_built(built: Built) -> dict[str, Any]:
    """Log the hyperparameters, check that a resume keeps the budget (the code version is warned about:
    :func:`~diffrank.experiments.callbacks.run_identity.check_segment`), then fit and test the selected
    checkpoint, or (``train=false ckpt_path=…``) evaluate a checkpoint (:func:`fit_and_test`, whose result this
    returns, with the accepted budget changes added to ``checkpoint_changes``)."""
    cfg = built.cfg
    for lg in built.loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    budget_changes: list[str] = []
    if cfg.get("ckpt_path") is not None and cfg.get("train", True):
        segment = built.callback(RunIdentity).segment
        budget_changes = check_segment((built.lineage or {}).get("checkpoint_meta"), segment, cfg.ckpt_path,
                                       allow_changes=bool(cfg.get("resume_with_changes", False)))
    fitted = fit_and_test(cfg, built.trainer, built.model, built.datamodule, built.loggers, built.identity)
    if budget_changes:
        fitted["checkpoint_changes"] = [*(fitted.get("checkpoint_changes") or []), *budget_changes]
    return fitted


def fit_and_test(cfg: DictConfig, trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule,
                 loggers: list[Any], identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the fit / test part of a run as ``cfg.train``, ``cfg.test`` and ``cfg.ckpt_path`` say.

    A given ``ckpt_path`` is first checked against the run's ``identity``
    (:func:`~diffrank.experiments.callbacks.run_identity.check_checkpoint`; ``+resume_with_changes=true``
    accepts differences, returned under ``"checkpoint_changes"``).

    - ``train=true``: ``fit`` (resuming from ``ckpt_path`` when given), then test the best checkpoint of the
      monitor (``callbacks.model_checkpoint``; on ties the rule of its ``ties``), or the final weights when
      there is none (``fast_dev_run``, no checkpoint callback).
    - ``train=false``: an evaluation of ``ckpt_path``: validate and test its weights.

    Returns:
        ``{"fit": metrics after fit, "eval": validation metrics of an evaluation, "test": test metrics,
        "checkpoint": what was tested (:func:`~diffrank.experiments.records.finished.checkpoint_info` plus
        ``selected_by``) or None, "evaluated_checkpoint": the path for an evaluation, else None,
        "checkpoint_changes": accepted differences of ``ckpt_path`` or None}``.

    Raises:
        ValueError: ``train=false`` without ``ckpt_path``; a ``ckpt_path`` trained with other choices, or
            holding another model's weights.
        FileNotFoundError: ``ckpt_path`` does not exist.
    """
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path is not None and not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
    out: dict[str, Any] = {"fit": {}, "eval": {}, "test": {}, "checkpoint": None, "evaluated_checkpoint": None,
                           "checkpoint_changes": None}
    if ckpt_path is not None and identity is not None:
        out["checkpoint_changes"] = check_checkpoint(
            ckpt_path, identity, evaluation=not cfg.get("train", True),
            allow_changes=bool(cfg.get("resume_with_changes", False))) or None
    fit_or_evaluate = _fit if cfg.get("train", True) else _evaluate
    tested, selected_by = fit_or_evaluate(trainer, model, datamodule, ckpt_path, out)
    if tested is not None:
        out["checkpoint"] = {**checkpoint_info(tested), "selected_by": selected_by}
    if cfg.get("test", True):
        out["test"] = _test(cfg, trainer, model, datamodule, loggers, tested)
    return out


def _fit(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule, ckpt_path: str | None,
         out: dict[str, Any]) -> tuple[str | None, Any]:
    """Fit (resuming from ``ckpt_path``), then select the checkpoint to test: ``(path or None, selected_by)``; the
    metrics after fit (and a best checkpoint that is gone) go into ``out``."""
    # our own checkpoints hold Hydra partials (the optimizer) in hparams: not loadable with weights_only
    with _loading(ckpt_path):
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=False)
    out["fit"] = dict(trainer.callback_metrics)
    cb = trainer.checkpoint_callback
    best = getattr(cb, "best_model_path", "") if cb is not None else ""
    best = _moved_best(best, ckpt_path)
    if best and Path(best).is_file():
        score = getattr(cb, "best_model_score", None)
        return best, {"monitor": cb.monitor, "mode": cb.mode, "score": None if score is None else float(score),
                      "ties": getattr(cb, "ties", "earlier")}
    if best:
        log.warning("best checkpoint %s is gone (and not beside ckpt_path): testing the current weights", best)
        out["best_checkpoint_missing"] = best
    else:
        log.warning("no best checkpoint (e.g. fast_dev_run): testing the current weights")
    return None, None


def _evaluate(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule,
              ckpt_path: str | None, out: dict[str, Any]) -> tuple[str, str]:
    """Validate the weights of ``ckpt_path`` (an evaluation, ``train=false``): ``(path, "ckpt_path")``; the
    validation metrics and the evaluated path go into ``out``."""
    if ckpt_path is None:
        raise ValueError("train=false evaluates a checkpoint: give ckpt_path=<run>/checkpoints/<file>.ckpt")
    tested = str(Path(ckpt_path).resolve())
    out["evaluated_checkpoint"] = tested
    with _loading(tested):
        trainer.validate(model=model, datamodule=datamodule, ckpt_path=tested, weights_only=False)
    out["eval"] = dict(trainer.callback_metrics)
    return tested, "ckpt_path"


def _test(cfg: DictConfig, trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule,
          loggers: list[Any], tested: str | None) -> dict[str, Any]:
    """Test the weights of ``tested`` (the current weights when None); returns the test metrics."""
    tester = trainer
    if "spawn" in str(cfg.trainer.get("strategy") or ""):
        # a second ddp_spawn launch (fit, then test) aborts at exit on CPU/gloo ("terminate called
        # without an active exception"); the test set is small, so one process tests the best weights
        tester = instantiate(cfg.trainer, devices=1, strategy="auto", logger=loggers or False, callbacks=[])
    tester.test(model=model, datamodule=datamodule, ckpt_path=tested, weights_only=False)
    return dict(tester.callback_metrics)


def check_selection_metric(built: Built, metrics: dict[str, float]) -> None:
    """A training run must have logged its ``optimized_metric`` (the checkpoint selection and the sweepers read it).
    A run resumed from a checkpoint written after its last validation (killed while testing) validates no more:
    its value is the one the checkpoint callback restored (``current_score``), added to ``metrics``.

    Raises:
        KeyError: it did not; the message says when validation would have run and how long the run was.
    """
    name = built.cfg.get("optimized_metric")
    if not name or name in metrics or not built.cfg.get("train", True):  # an evaluation need not log it
        return
    if getattr(built.callback(DivergenceGuard), "reason", None):  # stopped early: recorded as diverged
        return
    cb = built.trainer.checkpoint_callback
    restored = getattr(cb, "current_score", None) if getattr(cb, "monitor", None) == name else None
    if built.cfg.get("ckpt_path") and restored is not None:
        metrics[name] = to_float(restored)
        log.info("resumed after its last validation: %s = %s, the checkpoint's last validation", name,
                 metrics[name])
        return
    t = built.cfg.trainer
    every = (f"every {t.get('val_check_interval')} steps" if t.get("check_val_every_n_epoch") is None
             else f"every {t.get('check_val_every_n_epoch')} epoch(s)")
    raise KeyError(f"optimized_metric '{name}' was not logged: the run took {built.trainer.global_step} steps "
                   f"({built.trainer.current_epoch} epochs) and validates {every}, so it ended before its first "
                   f"validation; lengthen it (trainer.max_steps / max_epochs) or validate sooner "
                   f"(trainer.val_check_interval). Logged: {sorted(metrics)}")
