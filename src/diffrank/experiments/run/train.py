"""Training entry point: compose → build data, loss (with the operator and P_K its yaml interpolates), model
→ fit → test → results.json.

``python train.py [overrides]`` calls :func:`main`; tests call :func:`train` with a composed config. Building the
objects of a run is :mod:`diffrank.experiments.run.build`, the process settings of a script run
:mod:`diffrank.experiments.run.process`.

Sweeps (docs/sweeps.md): a multirun job whose folder already holds a complete ``results.json`` with the same
overrides returns it without training (``skip_finished``), so re-running a stopped sweep into its folder
(``hydra.sweep.dir=…``) trains only what is missing. ``data.batch_size`` is the *global* batch: under DDP each
of the ``world_size`` processes gets ``batch_size / world_size`` (``results.json`` records ``world_size``,
``per_device_batch``, ``global_batch`` and the ``optimizer_steps`` taken).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf, open_dict

from diffrank.experiments.records.folder import folder_state
from diffrank.experiments.records.record import (
    RECORD_FILE,
    RunRecord,
    compute_environment,
    device_description,
    git_state,
    to_float,
    versions,
)
from diffrank.experiments.run.build import Built, build
from diffrank.experiments.run.fit import fit_and_test
from diffrank.experiments.run.process import apply_process_settings
from diffrank.experiments.run.resolvers import register_resolvers

log = logging.getLogger(__name__)


def _hydra_info() -> dict[str, Any]:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {"choices": {}, "overrides": [], "run_dir": None, "multirun": False, "sweep_dir": None}
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    return {"choices": {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")},
            "overrides": list(hc.overrides.task), "run_dir": hc.runtime.output_dir, "multirun": multirun,
            "sweep_dir": str(hc.sweep.dir) if multirun else None}


def finished_record(cfg: DictConfig, overrides: list[str], multirun: bool) -> dict[str, Any] | None:
    """The ``results.json`` record of this job if it already finished, else None.

    A job counts as finished when ``cfg.skip_finished`` is true, it is a multirun job (a single run gets a
    fresh folder anyway), and its folder ``<paths.output_dir>`` is done
    (:func:`~diffrank.experiments.records.folder.folder_state`: a complete record with ``status: done``, the same
    task overrides, and, for a training run, the ``optimized_metric`` among its metrics).
    """
    if not (multirun and cfg.get("skip_finished")):
        return None
    out = cfg.paths.get("output_dir") if cfg.get("paths") else None
    if not out:
        return None
    state = folder_state(out, overrides, (cfg.get("optimized_metric") or None) if cfg.get("train", True) else None)
    return state.record.to_dict() if state.action == "done" else None


def _resume_path(cfg: DictConfig, multirun: bool) -> str | None:
    """``last.ckpt`` of this run's folder when no checkpoint was given and the run is being repeated: SLURM
    restarted the job (preemption / timeout requeue, ``SLURM_RESTART_COUNT`` > 0), or a multirun job with
    ``skip_finished`` runs again into its folder without a finished ``results.json`` (killed or failed; job
    folders are named after the job's overrides, so the checkpoint is this config's, and
    :func:`~diffrank.experiments.callbacks.run_identity.check_checkpoint` checks it). None otherwise.

    Lightning's SLURM environment (auto-requeue) also saves ``hpc_ckpt_*.ckpt`` on the requeue signal and
    resumes from it by itself when ``ckpt_path`` is None: that checkpoint is newer, so it wins when present.
    """
    if cfg.get("ckpt_path") is not None or not cfg.get("train", True):
        return None
    repeated = multirun and cfg.get("skip_finished")
    if int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) <= 0 and not repeated:
        return None
    checkpoint = folder_state(str(cfg.paths.output_dir)).checkpoint  # the one decision, also the cell launcher's
    return str(checkpoint) if checkpoint else None


def _trained_steps(trainer: L.Trainer, done: dict[str, Any]) -> int:
    """Optimizer steps taken by fit. Under ddp_spawn the main process's trainer never stepped (its global_step
    stays 0): the last checkpoint written by the workers knows."""
    steps = int(trainer.global_step)
    cb = trainer.checkpoint_callback
    if steps or cb is None:
        return steps
    # the workers' callback state does not come back to the main process; their last.ckpt does
    candidates = [getattr(cb, "last_model_path", "") or "", str(Path(str(getattr(cb, "dirpath", "") or "."))
                                                              / "last.ckpt")]
    for last in candidates:
        if last and Path(last).is_file():
            from diffrank.experiments.run.fit import checkpoint_info

            return int(checkpoint_info(last)["global_step"] or 0)
    return steps


def run_fit(built: Built) -> dict[str, Any]:
    """Log the hyperparameters, resume a repeated job from its ``last.ckpt`` (:func:`_resume_path`), then fit and
    test the selected checkpoint, or (``train=false ckpt_path=…``) evaluate a checkpoint
    (:func:`~diffrank.experiments.run.fit.fit_and_test`, whose result this returns)."""
    cfg = built.cfg
    for lg in built.loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    resume = _resume_path(cfg, built.info["multirun"])
    if resume:
        log.info("resuming this job from its own %s (SLURM restart count %s)", resume,
                 os.environ.get("SLURM_RESTART_COUNT", "0"))
        with open_dict(cfg):
            cfg.ckpt_path = resume
    return fit_and_test(cfg, built.trainer, built.model, built.datamodule, built.loggers, built.identity)


def make_record(built: Built, done: dict[str, Any], metrics: dict[str, float], wall_time_s: float) -> RunRecord:
    """The :class:`~diffrank.experiments.records.record.RunRecord` of a finished run: metrics, the choices and
    overrides, seeds, the budget actually trained (optimizer steps × global batch), the tested checkpoint, and what
    decides the bits (git state, versions, compute environment)."""
    cfg, trainer, info = built.cfg, built.trainer, built.info
    steps = _trained_steps(trainer, done) if cfg.get("train", True) else None
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    per_device = getattr(built.datamodule, "batch_size", None)
    world_size = int(trainer.world_size)
    if done["evaluated_checkpoint"]:
        global_step = done["checkpoint"]["global_step"]
    else:
        global_step = steps if steps is not None else int(trainer.global_step)
    env = compute_environment()
    return RunRecord(
        status="done", task_name=cfg.get("task_name"), paper=built.paper,
        metrics=metrics, choices=built.used["choices"], overrides=info["overrides"], seed=cfg.get("seed"),
        split_seed=cfg.data.get("split_seed") if cfg.get("data") else None,
        # generated stand-ins for unavailable data (diffrank.experiments.data.warcraft_like) say so in every record
        synthetic_data=bool(getattr(built.datamodule, "synthetic", False)),
        synthetic_info=getattr(built.datamodule, "synthetic_info", None),
        global_step=global_step, optimizer_steps=steps, world_size=world_size, per_device_batch=per_device,
        accumulate_grad_batches=accumulate,
        global_batch=None if per_device is None else int(per_device) * world_size * accumulate,
        evaluated_checkpoint=done["evaluated_checkpoint"], checkpoint=done["checkpoint"],
        resumed_with_changes=done.get("checkpoint_changes"), **git_state(),
        versions=versions(), wall_time_s=wall_time_s, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        device=device_description(env), compute=env, run_dir=info["run_dir"], sweep_dir=info["sweep_dir"],
        config=OmegaConf.to_container(cfg, resolve=False),
    )


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Run one experiment described by ``cfg``: :func:`build`, :func:`run_fit`, :func:`make_record` (written as
    ``<paths.output_dir>/results.json`` by the main process).

    A paper row run with another operator is refused, and groups nothing reads (P_K in a sorting run) are left
    out of the record: :mod:`diffrank.experiments.run.composition`.
    A multirun job that already finished (:func:`finished_record`) returns its recorded metrics without
    building anything (``objects`` is then ``{"results": record, "skipped": True}``). Any W&B run is finished
    on the way out, also after an exception.

    Args:
        cfg: the composed ``configs/train.yaml`` (needs ``HydraConfig`` set when it uses ``${hydra:…}``).

    Returns:
        ``(metrics, objects)``: the final metrics (``test/*``, ``val/*``, ``train/*`` as floats) and the
        built objects (datamodule, operator, loss, model, trainer, and ``results``: the record written, as a dict).

    Raises:
        ValueError: unknown or incompatible choices (e.g. a loss that the operator cannot serve), or a global
            batch that the world size does not divide.
    """
    t0 = time.time()
    info = _hydra_info()
    finished = finished_record(cfg, info["overrides"], info["multirun"])
    if finished is not None:
        log.info("skipping %s: it already finished (results.json with the same overrides); delete that folder "
                 "to train it again", cfg.paths.output_dir)
        return dict(finished.get("metrics") or {}), {"results": finished, "skipped": True}
    built = build(cfg, info)
    try:
        done = run_fit(built)
        metrics = {k: to_float(v) for k, v in {**done["fit"], **done["eval"], **done["test"]}.items()}
        _check_selection_metric(built, metrics)  # before a "done" record: a run without it did not finish
        objects = built.objects
        if built.trainer.is_global_zero:
            record = make_record(built, done, metrics, time.time() - t0)
            out = built.cfg.paths.get("output_dir") if built.cfg.get("paths") else None
            if out:
                log.info("results: %s", record.write(Path(out) / RECORD_FILE))
            objects["results"] = record.to_dict()
            _log_paper_comparison(built.loggers, objects["results"])
    finally:
        _finish_wandb(built.loggers)
    return metrics, objects


def _check_selection_metric(built: Built, metrics: dict[str, float]) -> None:
    """A training run must have logged its ``optimized_metric`` (the checkpoint selection and the sweepers read it).
    A run resumed from a checkpoint written after its last validation (killed while testing) validates no more:
    its value is the one the checkpoint callback restored (``current_score``), added to ``metrics``.

    Raises:
        KeyError: it did not; the message says when validation would have run and how long the run was.
    """
    name = built.cfg.get("optimized_metric")
    if not name or name in metrics or not built.cfg.get("train", True):  # an evaluation need not log it
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


def _log_paper_comparison(loggers: list[Any], record: dict[str, Any]) -> None:
    from lightning.pytorch.loggers.wandb import WandbLogger

    from diffrank.experiments.run.loggers import log_paper_comparison

    for lg in loggers:
        if isinstance(lg, WandbLogger):
            summary = log_paper_comparison(lg.experiment, record)
            if summary:
                log.info("W&B summary: %s", ", ".join(f"{k}={v}" for k, v in summary.items() if "/row" not in k))


def _finish_wandb(loggers: list[Any]) -> None:
    """``wandb.finish()`` whenever a W&B run is open (also after an exception): the next multirun job must get
    its own run, not attach to this one."""
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is not None:
        wandb.finish()


def summary_caption(record: dict[str, Any] | None) -> str | None:
    """The conditions of a headline number: which checkpoint was tested, on what device and threads."""
    if not record:
        return None
    ckpt = record.get("checkpoint") or {}
    what = f"{Path(ckpt['path']).name} (epoch {ckpt['epoch']}, step {ckpt['global_step']})" if ckpt \
        else "final weights"
    if record.get("evaluated_checkpoint"):
        what = f"evaluation of {what}"
    versions = record.get("versions") or {}
    return f"{what}; {record.get('device')}; torch {versions.get('torch')}"


def print_summary(metrics: dict[str, float], record: dict[str, Any] | None = None) -> None:
    """Print the test metrics as a rich table (what ``make train`` ends with), captioned with the tested
    checkpoint and the device when ``record`` (the ``results.json`` record) is given."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="test metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in sorted(metrics):
        if k.startswith("test/"):
            v = metrics[k]
            table.add_row(k, f"{100 * v:.2f} %" if "loss" not in k else f"{v:.4f}")
    console = Console()
    console.print(table)
    caption = summary_caption(record)
    if caption:
        console.print(f"tested: {caption}", soft_wrap=True, markup=False, highlight=False)


def main() -> None:
    """Console entry point (``diffrank-train``): same as ``python train.py``."""
    import sys

    from diffrank.registry import config_dir

    sys.argv.insert(1, f"--config-path={config_dir()}")
    register_resolvers()  # before Hydra resolves a sweeper's params (${beta_grid:…}, ${short_hash:…})
    hydra.main(version_base="1.3", config_path=None, config_name="train")(run)()


def _write_failure(cfg: DictConfig, error: BaseException, wall_time_s: float) -> None:
    """``results.json`` with ``status: failed`` (the sweep summary lists the job as failed, and skip-finished
    trains it again); never over a finished record, and only in the main process."""
    if os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0":
        return
    try:
        out = cfg.paths.get("output_dir") if cfg.get("paths") else None
        if not out:
            return
        path = Path(out) / RECORD_FILE
        if getattr(RunRecord.read(path), "status", None) == "done":
            return
        RunRecord(status="failed", error=f"{type(error).__name__}: {error}"[:2000],
                  overrides=_hydra_info()["overrides"], wall_time_s=wall_time_s,
                  finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  config=OmegaConf.to_container(cfg, resolve=False)).write(path)
    except Exception:  # the original error matters more than its record
        log.exception("could not write the failure record")


def run(cfg: DictConfig) -> float | None:
    """:func:`train`, then close W&B (so multirun jobs get their own runs), print the test metrics and
    return ``cfg.optimized_metric`` for sweepers.

    Raises:
        KeyError: if a training run did not log ``optimized_metric`` (its ``results.json`` says ``failed``).
    """
    if cfg.get("extras") and cfg.extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=False))
    apply_process_settings(cfg)
    t0 = time.time()
    try:
        metrics, objects = train(cfg)
    except Exception as e:
        _write_failure(cfg, e, time.time() - t0)
        raise
    finally:
        _finish_wandb([])
    print_summary(metrics, objects.get("results"))
    if objects.get("skipped"):
        log.info("finished earlier (skip_finished): %s", objects["results"].get("run_dir"))
    elif "results" in objects:
        log.info("wall time %.1f s; run folder %s", objects["results"]["wall_time_s"], objects["results"]["run_dir"])
    name = cfg.get("optimized_metric")
    return metrics.get(name) if name else None


if __name__ == "__main__":
    main()
