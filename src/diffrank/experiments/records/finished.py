"""The record of a run that ended by itself (``done``, or ``diverged``): made from what the run built, what fit and
test returned, and what decides the bits (:func:`make_record`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from diffrank.experiments.records.environment import compute_environment, device_description, git_state, versions
from diffrank.experiments.records.record import RunRecord


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """``{"path", "epoch", "global_step"}`` of a Lightning checkpoint file (read without building anything)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return {"path": str(Path(path).resolve()), "epoch": ckpt.get("epoch"), "global_step": ckpt.get("global_step")}


def trained_steps(trainer: Any) -> int:
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
            return int(checkpoint_info(last)["global_step"] or 0)
    return steps


def make_record(built: Any, fitted: dict[str, Any], metrics: dict[str, float], wall_time_s: float, *,
                diverged: str | None, identity: Any, smoke: bool) -> RunRecord:
    """The :class:`~diffrank.experiments.records.record.RunRecord` of a finished run: metrics, the choices and
    overrides, seeds, the budget actually trained (optimizer steps × global batch), the tested checkpoint, and what
    decides the bits (git state, versions, compute environment).

    Args:
        built: what the run built (:class:`~diffrank.experiments.run.build.Built`: ``cfg``, ``trainer``,
            ``datamodule``, ``paper``, ``choices``, ``job``, ``lineage``).
        fitted: what :func:`~diffrank.experiments.run.fit.fit_and_test` returned.
        metrics: the final metrics as floats.
        wall_time_s: the run's wall time.
        diverged: why the divergence guard stopped the run, or None.
        identity: the run's :class:`~diffrank.experiments.callbacks.RunIdentity` callback (its segments and the
            code the segment started with), or None.
        smoke: whether the run trained under the smoke budget (recorded: a test of the command, never a result).
    """
    cfg, trainer, job, lineage = built.cfg, built.trainer, built.job, built.lineage or {}
    steps = trained_steps(trainer) if cfg.get("train", True) else None
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    per_device = getattr(built.datamodule, "batch_size", None)
    world_size = int(trainer.world_size)
    if fitted["evaluated_checkpoint"]:
        global_step = fitted["checkpoint"]["global_step"]
    else:
        global_step = steps if steps is not None else int(trainer.global_step)
    env = compute_environment()
    return RunRecord(
        status="diverged" if diverged else "done", error=f"diverged: {diverged}" if diverged else None,
        run_id=lineage.get("run_id"), config_hash=lineage.get("config_hash"),
        segments=identity.segments if identity is not None else [], precision=str(trainer.precision),
        task_name=cfg.get("task_name"), paper=built.paper,
        metrics=metrics, choices=built.choices, overrides=job.overrides, seed=cfg.get("seed"),
        split_seed=cfg.data.get("split_seed") if cfg.get("data") else None,
        # generated stand-ins for unavailable data (diffrank.experiments.data.warcraft_like) say so in every record
        synthetic_data=bool(getattr(built.datamodule, "synthetic", False)),
        synthetic_info=getattr(built.datamodule, "synthetic_info", None),
        global_step=global_step, optimizer_steps=steps, world_size=world_size, per_device_batch=per_device,
        accumulate_grad_batches=accumulate,
        global_batch=None if per_device is None else int(per_device) * world_size * accumulate,
        evaluated_checkpoint=fitted["evaluated_checkpoint"], checkpoint=fitted["checkpoint"],
        # the code this segment started with (the checkout may change while it runs)
        resumed_with_changes=fitted.get("checkpoint_changes"),
        **({k: identity.segment.get(k) for k in ("git_sha", "git_dirty")} if identity is not None else git_state()),
        versions=versions(), wall_time_s=wall_time_s, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        device=device_description(env), compute=env, run_dir=job.run_dir, sweep_dir=job.sweep_dir,
        config=OmegaConf.to_container(cfg, resolve=False),
        extra={**({"best_checkpoint_missing": fitted["best_checkpoint_missing"]}
                   if fitted.get("best_checkpoint_missing") else {}),
               # a run under the smoke budget is a test of the command, never a result
               **({"budget": "smoke (DIFFRANK_SMOKE=1)"} if smoke else {})},
    )


__all__ = ["checkpoint_info", "make_record", "trained_steps"]
