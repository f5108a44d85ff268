"""Fit, then test the selected checkpoint; or evaluate a given checkpoint (``train=false ckpt_path=…``).

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
import torch
from omegaconf import DictConfig

from diffrank.experiments.callbacks.run_identity import check_checkpoint
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


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """``{"path", "epoch", "global_step"}`` of a Lightning checkpoint file (read without building anything)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return {"path": str(Path(path).resolve()), "epoch": ckpt.get("epoch"), "global_step": ckpt.get("global_step")}


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
        "checkpoint": what was tested (:func:`checkpoint_info` plus ``selected_by``) or None,
        "evaluated_checkpoint": the path for an evaluation, else None, "checkpoint_changes": accepted
        differences of ``ckpt_path`` or None}``.

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
    tested = None
    if cfg.get("train", True):
        # our own checkpoints hold Hydra partials (the optimizer) in hparams: not loadable with weights_only
        with _loading(ckpt_path):
            trainer.fit(model=model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=False)
        out["fit"] = dict(trainer.callback_metrics)
        cb = trainer.checkpoint_callback
        best = getattr(cb, "best_model_path", "") if cb is not None else ""
        best = _moved_best(best, ckpt_path)
        if best and Path(best).is_file():
            tested = best
            score = getattr(cb, "best_model_score", None)
            selected_by = {"monitor": cb.monitor, "mode": cb.mode, "score": None if score is None else float(score),
                           "ties": getattr(cb, "ties", "earlier")}
        else:
            if best:
                log.warning("best checkpoint %s is gone (and not beside ckpt_path): testing the current weights",
                            best)
                out["best_checkpoint_missing"] = best
            else:
                log.warning("no best checkpoint (e.g. fast_dev_run): testing the current weights")
            selected_by = None
    else:
        if ckpt_path is None:
            raise ValueError("train=false evaluates a checkpoint: give ckpt_path=<run>/checkpoints/<file>.ckpt")
        tested = str(Path(ckpt_path).resolve())
        selected_by = "ckpt_path"
        out["evaluated_checkpoint"] = tested
        with _loading(tested):
            trainer.validate(model=model, datamodule=datamodule, ckpt_path=tested, weights_only=False)
        out["eval"] = dict(trainer.callback_metrics)
    if tested is not None:
        out["checkpoint"] = {**checkpoint_info(tested), "selected_by": selected_by}
    if cfg.get("test", True):
        tester = trainer
        if "spawn" in str(cfg.trainer.get("strategy") or ""):
            # a second ddp_spawn launch (fit, then test) aborts at exit on CPU/gloo ("terminate called
            # without an active exception"); the test set is small, so one process tests the best weights
            tester = instantiate(cfg.trainer, devices=1, strategy="auto", logger=loggers or False, callbacks=[])
        tester.test(model=model, datamodule=datamodule, ckpt_path=tested, weights_only=False)
        out["test"] = dict(tester.callback_metrics)
    return out
