"""Training entry point: may this run start → build data, loss (with the operator and P_K its yaml interpolates),
model → fit → test → record (``results.json``).

``python train.py [overrides]`` calls :func:`run` (the script: process settings, the folder's lock, stop signals,
the printed summary) through :func:`main`; tests call :func:`train` (the library function) with a composed config.
Building a run is :mod:`diffrank.experiments.run.build`, fitting it :mod:`diffrank.experiments.run.fit`, its record
:mod:`diffrank.experiments.records.finished`; the process of a script run :mod:`diffrank.experiments.run.process`,
and how it stops :mod:`diffrank.experiments.run.stops`.

Sweeps (docs/sweeps.md): a multirun job whose folder already holds a complete ``results.json`` with the same
overrides returns it without training (``skip_finished``), so re-running a stopped sweep into its folder
(``hydra.sweep.dir=…``) trains only what is missing. ``data.batch_size`` is the *global* batch: under DDP each
of the ``world_size`` processes gets ``batch_size / world_size`` (``results.json`` records ``world_size``,
``per_device_batch``, ``global_batch`` and the ``optimizer_steps`` taken).

Every run has an id (kept by a resume of it) and a config hash, written into its checkpoints and its record; it
holds its folder's lock while it runs (a single run: the lock Hydra's
:class:`~diffrank.experiments.callbacks.hydra_callbacks.RunFolderGuard` took before Hydra wrote ``.hydra/``, held
to the end of the run), and a new run into a folder holding another run is refused
(:mod:`diffrank.experiments.records.folder`). SIGTERM / SIGINT / SIGHUP (a closed terminal or ssh connection) stop a
run with ``status: interrupted`` and the resume command in its record and a non-zero exit status (128 + the
signal: 143, 130, 129); a second signal while the run stops is reported and ignored, so that the record is
written. A run stopped by the divergence guard (:class:`~diffrank.experiments.callbacks.DivergenceGuard`) is
recorded as ``diverged``. A full disk names the file and ENOSPC, and the log files on that disk are closed
(no cascade of logging errors).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from diffrank.experiments.callbacks import DivergenceGuard, RunIdentity
from diffrank.experiments.callbacks.job_env import smoke_budget
from diffrank.experiments.callbacks.loggers import finish_wandb, log_paper_comparisons
from diffrank.experiments.callbacks.run_identity import run_lineage
from diffrank.experiments.records.finished import make_record
from diffrank.experiments.records.folder import (
    FolderBusy,
    FolderLock,
    FolderNotWritable,
    FolderTaken,
    folder_state,
    refuse_other_run,
)
from diffrank.experiments.records.record import RECORD_FILE, RunRecord, to_float
from diffrank.experiments.run.build import Built, build
from diffrank.experiments.run.fit import check_selection_metric, fit_built
from diffrank.experiments.run.process import (
    HydraJob,
    apply_process_settings,
    apply_smoke_budget,
    hydra_job,
    main_process,
    output_dir,
    print_summary,
)
from diffrank.experiments.run.resolvers import register_resolvers
from diffrank.experiments.run.stops import Signalled, exit_after_stop, interruptible, record_stop

log = logging.getLogger(__name__)


def finished_record(cfg: DictConfig, overrides: list[str], multirun: bool) -> dict[str, Any] | None:
    """The ``results.json`` record of this job if it already finished, else None.

    A job counts as finished when ``cfg.skip_finished`` is true, it is a multirun job (a single run gets a
    fresh folder anyway), and its folder ``<paths.output_dir>`` is done
    (:func:`~diffrank.experiments.records.folder.folder_state`: a complete record with ``status: done``, the same
    task overrides, and, for a training run, the ``optimized_metric`` among its metrics).
    """
    if not (multirun and cfg.get("skip_finished")):
        return None
    out = output_dir(cfg)
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


def may_start(cfg: DictConfig, job: HydraJob) -> dict[str, Any] | None:
    """The one "may this run start" decision, made before anything is built: the record of a multirun job that
    already finished (:func:`finished_record`: it is skipped), else None: the run starts, from the job's own
    checkpoint when it is being repeated (:func:`_resume_path`, set as ``cfg.ckpt_path``)."""
    finished = finished_record(cfg, job.overrides, job.multirun)
    if finished is not None:
        log.info("skipping %s: it already finished (results.json with the same overrides); delete that folder "
                 "to train it again", cfg.paths.output_dir)
        return finished
    resume = _resume_path(cfg, job.multirun)
    if resume:
        log.info("resuming this job from its own %s (SLURM restart count %s)", resume,
                 os.environ.get("SLURM_RESTART_COUNT", "0"))
        with open_dict(cfg):
            cfg.ckpt_path = resume
    return None


def train(cfg: DictConfig, lock: FolderLock | None = None) -> RunRecord:
    """Run one experiment described by ``cfg``: :func:`may_start`, then
    :func:`~diffrank.experiments.run.build.build`, :func:`~diffrank.experiments.run.fit.fit_built` and
    :func:`~diffrank.experiments.records.finished.make_record` (written as ``<paths.output_dir>/results.json`` by
    the main process).

    A paper row run with another operator is refused, and groups nothing reads (P_K in a sorting run) are left
    out of the record: :mod:`diffrank.experiments.run.composition`.
    A multirun job that already finished returns its record, read back, without building anything. Any W&B run is
    finished on the way out, also after an exception.

    Args:
        cfg: the composed ``configs/train.yaml`` (needs ``HydraConfig`` set when it uses ``${hydra:…}``).
        lock: the lock of ``paths.output_dir``, already held by the caller (:func:`run`), who releases it; None:
            ``train`` takes the folder's lock itself and releases it when it returns.

    Returns:
        The run's :class:`~diffrank.experiments.records.record.RunRecord` (the one written to ``results.json``;
        its ``metrics``: ``test/*``, ``val/*``, ``train/*`` as floats). On the other processes of a DDP run, which
        write nothing, a bare record holding only the metrics (no ``finished_at``).

    Raises:
        ValueError: unknown or incompatible choices (e.g. a loss that the operator cannot serve), or a global
            batch that the world size does not divide; an unreadable ``ckpt_path``, or one whose budget settings
            differ (:func:`~diffrank.experiments.run.fit.fit_built`).
        FolderBusy: a live run holds ``paths.output_dir`` (its lock).
        FolderTaken: ``paths.output_dir`` holds another run that this one does not resume.
        FolderNotWritable: ``paths.output_dir`` cannot be written (a ``PermissionError``).
    """
    t0 = time.time()
    job = hydra_job()
    finished = may_start(cfg, job)
    if finished is not None:
        return RunRecord.from_dict(finished)
    out = output_dir(cfg)
    own = lock is None
    if own and out and main_process():
        lock = FolderLock(out).acquire()  # FolderBusy: a live run writes there; FolderNotWritable
    lineage = None
    try:
        lineage = run_lineage(cfg)
        if lock is not None:
            refuse_other_run(out, cfg.get("ckpt_path"), lineage["run_id"])
        built = build(cfg, job, lineage)
        try:
            fitted = fit_built(built)
            metrics = {k: to_float(v) for k, v in {**fitted["fit"], **fitted["eval"], **fitted["test"]}.items()}
            check_selection_metric(built, metrics)  # before a "done" record: a run without it did not finish
            record = RunRecord(metrics=metrics)  # the other DDP processes record nothing
            if built.trainer.is_global_zero:
                record = _record_run(built, fitted, metrics, time.time() - t0)
        finally:
            finish_wandb()
        return record
    except BaseException as e:
        e.diffrank_run = lineage  # the failure / interruption record names the run
        raise
    finally:
        if own and lock is not None:
            lock.release()


def _record_run(built: Built, fitted: dict[str, Any], metrics: dict[str, float], wall_time_s: float) -> RunRecord:
    """Make the run's record, write it into its folder, log it to W&B beside the paper's row; returns it."""
    diverged = getattr(built.callback(DivergenceGuard), "reason", None)
    record = make_record(built, fitted, metrics, wall_time_s, diverged=diverged, identity=built.callback(RunIdentity),
                         smoke=smoke_budget())
    out = output_dir(built.cfg)
    if out:
        log.info("results: %s", record.write(Path(out) / RECORD_FILE))
    log_paper_comparisons(built.loggers, record.to_dict())
    return record


def run(cfg: DictConfig) -> float | None:
    """The script run: :func:`train` under the process settings, the folder's lock and the stop signals, then
    close W&B (so multirun jobs get their own runs), print the test metrics and return ``cfg.optimized_metric``
    for sweepers.

    The run holds its folder's lock from start to end, record included: a single run the lock Hydra's guard took
    and handed over (:meth:`~diffrank.experiments.records.folder.FolderLock.take_over`), a multirun job its own
    (unless the job already finished and is skipped).

    Raises:
        KeyError: if a training run did not log ``optimized_metric`` (its ``results.json`` says ``failed``).
        RunInterrupted: SIGTERM / SIGINT / SIGHUP stopped the run (its ``results.json`` says ``interrupted`` and how
            to resume).
        FolderBusy / FolderTaken: the output folder is another run's (live, or holding its results).
        FolderNotWritable: the output folder cannot be written.
        OSError: (errno ENOSPC) the disk filled up; the message names the file, the failure record (when it
            could be written) and the log the resume command.
        SystemExit: (status 3) a single run that diverged (its ``results.json`` says ``diverged``).
    """
    apply_smoke_budget(cfg)  # DIFFRANK_SMOKE=1: the docs' commands, tested as typed, on a few batches
    if cfg.get("extras") and cfg.extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=False))
    apply_process_settings(cfg)
    t0 = time.time()
    out = output_dir(cfg)
    lock = FolderLock.take_over(out) if out and main_process() else None  # Hydra's guard took it
    job = hydra_job()
    skipped = finished_record(cfg, job.overrides, job.multirun) is not None  # train() returns its record
    if lock is None and out and main_process() and not skipped:  # a skipped job writes nothing
        lock = FolderLock(out).acquire()  # FolderBusy / FolderNotWritable: nothing of ours to record
    try:
        with interruptible():
            try:
                record = train(cfg, lock)
            except (FolderBusy, FolderTaken, FolderNotWritable):
                raise  # the folder is another run's, or not ours to write: its record stays as it is
            except (Exception, Signalled) as e:
                stop = record_stop(cfg, e, time.time() - t0)
                if stop is e:
                    raise
                raise stop from None
    finally:
        finish_wandb()
        if lock is not None:
            lock.release()
    return _report(cfg, record, skipped)


def _report(cfg: DictConfig, record: RunRecord, skipped: bool) -> float | None:
    """Print the test metrics and where the run went; a single run that diverged exits with status 3. Returns
    ``cfg.optimized_metric`` for sweepers. ``skipped``: the job had finished earlier (its record read back)."""
    metrics = record.metrics
    results = record.to_dict() if skipped or record.finished_at is not None else {}  # DDP's other processes: none
    print_summary(metrics, results or None)
    if skipped:
        log.info("finished earlier (skip_finished): %s", results.get("run_dir"))
    elif results:
        log.info("wall time %.1f s; run folder %s", results["wall_time_s"], results["run_dir"])
    if results.get("status") == "diverged":
        log.error("the run diverged (%s): recorded as status: diverged, not a result", results.get("error"))
        if not hydra_job().multirun:  # a sweep goes on (its summary lists the job as diverged)
            raise SystemExit(3)
    name = cfg.get("optimized_metric")
    return metrics.get(name) if name else None


def main() -> None:
    """Console entry point (``diffrank-train``): same as ``python train.py``."""
    from diffrank.registry import config_dir

    sys.argv.insert(1, f"--config-path={config_dir()}")
    exit_after_stop()
    register_resolvers()  # before Hydra resolves a sweeper's params (${beta_grid:…}, ${short_hash:…})
    hydra.main(version_base="1.3", config_path=None, config_name="train")(run)()


if __name__ == "__main__":
    main()
