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
import shlex
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf, open_dict

from diffrank.experiments.callbacks import DivergenceGuard, RunIdentity
from diffrank.experiments.callbacks.run_identity import (
    META_KEY,
    check_segment,
    read_checkpoint,
    resolved_config_hash,
)
from diffrank.experiments.records.folder import (
    FolderBusy,
    FolderLock,
    FolderNotWritable,
    FolderTaken,
    RunInterrupted,
    folder_state,
    refuse_other_run,
    resume_checkpoint,
)
from diffrank.experiments.records.record import (
    RECORD_FILE,
    RunRecord,
    compute_environment,
    describe_no_space,
    device_description,
    git_state,
    no_space_error,
    to_float,
    versions,
)
from diffrank.experiments.run.build import Built, build
from diffrank.experiments.run.fit import fit_and_test
from diffrank.experiments.run.process import apply_process_settings, apply_smoke_budget, smoke_budget
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


def _main_process() -> bool:
    """Whether this process is the run's main one (rank 0 of node 0: it owns the folder's lock and record)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def run_meta(cfg: DictConfig) -> dict[str, Any]:
    """The run's id, config hash and earlier segments: a training run resumed from ``ckpt_path`` continues that
    checkpoint's run (its id and segments); any other run gets a new id.

    Raises:
        FileNotFoundError / ValueError: ``ckpt_path`` is missing or not a readable checkpoint
            (:func:`~diffrank.experiments.callbacks.run_identity.read_checkpoint`).
    """
    meta: dict[str, Any] = {"run_id": uuid.uuid4().hex, "config_hash": resolved_config_hash(cfg), "segments": []}
    ckpt = cfg.get("ckpt_path")
    if ckpt is not None:
        saved = read_checkpoint(ckpt).get(META_KEY) or {}
        if cfg.get("train", True) and saved.get("run_id"):
            meta.update(run_id=saved["run_id"], segments=list(saved.get("segments") or []))
        meta["checkpoint_meta"] = saved
    return meta


def run_fit(built: Built) -> dict[str, Any]:
    """Log the hyperparameters, check that a resume keeps the budget (the code version is warned about:
    :func:`~diffrank.experiments.callbacks.run_identity.check_segment`), then fit and test the selected
    checkpoint, or (``train=false ckpt_path=…``) evaluate a checkpoint
    (:func:`~diffrank.experiments.run.fit.fit_and_test`, whose result this returns, with the accepted budget
    changes added to ``checkpoint_changes``)."""
    cfg = built.cfg
    for lg in built.loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    budget_changes: list[str] = []
    meta = built.info.get("run") or {}
    if cfg.get("ckpt_path") is not None and cfg.get("train", True):
        segment = _callback(built, RunIdentity).segment
        budget_changes = check_segment(meta.get("checkpoint_meta"), segment, cfg.ckpt_path,
                                       allow_changes=bool(cfg.get("resume_with_changes", False)))
    done = fit_and_test(cfg, built.trainer, built.model, built.datamodule, built.loggers, built.identity)
    if budget_changes:
        done["checkpoint_changes"] = [*(done.get("checkpoint_changes") or []), *budget_changes]
    return done


def _callback(built: Built, kind: type) -> Any:
    return next((c for c in built.trainer.callbacks if isinstance(c, kind)), None)


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
    guard, ident = _callback(built, DivergenceGuard), _callback(built, RunIdentity)
    meta = info.get("run") or {}
    diverged = getattr(guard, "reason", None)
    return RunRecord(
        status="diverged" if diverged else "done", error=f"diverged: {diverged}" if diverged else None,
        run_id=meta.get("run_id"), config_hash=meta.get("config_hash"),
        segments=ident.segments if ident is not None else [], precision=str(trainer.precision),
        task_name=cfg.get("task_name"), paper=built.paper,
        metrics=metrics, choices=built.used["choices"], overrides=info["overrides"], seed=cfg.get("seed"),
        split_seed=cfg.data.get("split_seed") if cfg.get("data") else None,
        # generated stand-ins for unavailable data (diffrank.experiments.data.warcraft_like) say so in every record
        synthetic_data=bool(getattr(built.datamodule, "synthetic", False)),
        synthetic_info=getattr(built.datamodule, "synthetic_info", None),
        global_step=global_step, optimizer_steps=steps, world_size=world_size, per_device_batch=per_device,
        accumulate_grad_batches=accumulate,
        global_batch=None if per_device is None else int(per_device) * world_size * accumulate,
        evaluated_checkpoint=done["evaluated_checkpoint"], checkpoint=done["checkpoint"],
        # the code this segment started with (the checkout may change while it runs)
        resumed_with_changes=done.get("checkpoint_changes"),
        **({k: ident.segment.get(k) for k in ("git_sha", "git_dirty")} if ident is not None else git_state()),
        versions=versions(), wall_time_s=wall_time_s, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        device=device_description(env), compute=env, run_dir=info["run_dir"], sweep_dir=info["sweep_dir"],
        config=OmegaConf.to_container(cfg, resolve=False),
        extra={**({"best_checkpoint_missing": done["best_checkpoint_missing"]}
                   if done.get("best_checkpoint_missing") else {}),
               # a run under the smoke budget is a test of the command, never a result
               **({"budget": "smoke (DIFFRANK_SMOKE=1)"} if smoke_budget() else {})},
    )


def train(cfg: DictConfig, lock: FolderLock | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """Run one experiment described by ``cfg``: :func:`build`, :func:`run_fit`, :func:`make_record` (written as
    ``<paths.output_dir>/results.json`` by the main process).

    A paper row run with another operator is refused, and groups nothing reads (P_K in a sorting run) are left
    out of the record: :mod:`diffrank.experiments.run.composition`.
    A multirun job that already finished (:func:`finished_record`) returns its recorded metrics without
    building anything (``objects`` is then ``{"results": record, "skipped": True}``). Any W&B run is finished
    on the way out, also after an exception.

    Args:
        cfg: the composed ``configs/train.yaml`` (needs ``HydraConfig`` set when it uses ``${hydra:…}``).
        lock: the lock of ``paths.output_dir``, already held by the caller (:func:`run`), who releases it; None:
            ``train`` takes the folder's lock itself and releases it when it returns.

    Returns:
        ``(metrics, objects)``: the final metrics (``test/*``, ``val/*``, ``train/*`` as floats) and the
        built objects (datamodule, operator, loss, model, trainer, and ``results``: the record written, as a dict).

    Raises:
        ValueError: unknown or incompatible choices (e.g. a loss that the operator cannot serve), or a global
            batch that the world size does not divide; an unreadable ``ckpt_path``, or one whose budget settings
            differ (:func:`run_fit`).
        FolderBusy: a live run holds ``paths.output_dir`` (its lock).
        FolderTaken: ``paths.output_dir`` holds another run that this one does not resume.
        FolderNotWritable: ``paths.output_dir`` cannot be written (a ``PermissionError``).
    """
    t0 = time.time()
    info = _hydra_info()
    finished = finished_record(cfg, info["overrides"], info["multirun"])
    if finished is not None:
        log.info("skipping %s: it already finished (results.json with the same overrides); delete that folder "
                 "to train it again", cfg.paths.output_dir)
        return dict(finished.get("metrics") or {}), {"results": finished, "skipped": True}
    resume = _resume_path(cfg, info["multirun"])
    if resume:
        log.info("resuming this job from its own %s (SLURM restart count %s)", resume,
                 os.environ.get("SLURM_RESTART_COUNT", "0"))
        with open_dict(cfg):
            cfg.ckpt_path = resume
    out = _output_dir(cfg)
    own = lock is None
    if own and out and _main_process():
        lock = FolderLock(out).acquire()  # FolderBusy: a live run writes there; FolderNotWritable
    try:
        info["run"] = run_meta(cfg)
        if lock is not None:
            refuse_other_run(out, cfg.get("ckpt_path"), info["run"]["run_id"])
        return _train_built(cfg, info, t0)
    except BaseException as e:
        e.diffrank_run = info.get("run")  # the failure / interruption record names the run
        raise
    finally:
        if own and lock is not None:
            lock.release()


def _output_dir(cfg: DictConfig) -> str | None:
    return cfg.paths.get("output_dir") if cfg.get("paths") else None


def _train_built(cfg: DictConfig, info: dict[str, Any], t0: float) -> tuple[dict[str, float], dict[str, Any]]:
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
    if getattr(_callback(built, DivergenceGuard), "reason", None):  # stopped early: recorded as diverged
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
    its own run, not attach to this one. Never imports wandb: a process that has not imported it has no W&B run
    (and a signal that cut its import short left a half-initialised module, on which an ``import wandb`` fails with
    a circular-import ``AttributeError`` that would replace the run's own error); a failing ``finish`` is logged."""
    wandb = sys.modules.get("wandb")
    if getattr(wandb, "run", None) is None:
        return
    try:
        wandb.finish()
    except Exception:
        log.warning("could not finish the W&B run", exc_info=True)


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
    from diffrank.registry import config_dir

    sys.argv.insert(1, f"--config-path={config_dir()}")
    exit_after_stop()
    register_resolvers()  # before Hydra resolves a sweeper's params (${beta_grid:…}, ${short_hash:…})
    hydra.main(version_base="1.3", config_path=None, config_name="train")(run)()


def describe_error(error: BaseException) -> str:
    """``"<type>: <message>"`` of ``error``; a full disk (ENOSPC anywhere in its chain of causes: torch's writer
    reports it as ``unexpected pos …``) is named first, with the file being written when known."""
    if isinstance(error, _Signalled):
        return str(error)
    return describe_no_space(error) or f"{type(error).__name__}: {error}"


def _write_status(cfg: DictConfig, status: str, error: BaseException, wall_time_s: float,
                  resume_command: str | None = None) -> None:
    """``results.json`` with ``status`` (``failed``: the sweep summary lists the job as failed, and skip-finished
    trains it again; ``interrupted``: with the resume command); never over a finished record, and only in the main
    process."""
    if not _main_process():
        return
    try:
        out = cfg.paths.get("output_dir") if cfg.get("paths") else None
        if not out:
            return
        path = Path(out) / RECORD_FILE
        if getattr(RunRecord.read(path), "status", None) in ("done", "diverged"):
            return
        meta = getattr(error, "diffrank_run", None) or {}
        RunRecord(status=status, error=describe_error(error)[:2000], resume_command=resume_command,
                  run_id=meta.get("run_id"), config_hash=meta.get("config_hash"),
                  overrides=_hydra_info()["overrides"], wall_time_s=wall_time_s,
                  finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  config=OmegaConf.to_container(cfg, resolve=False)).write(path)
    except Exception as e:  # the original error matters more than its record
        if no_space_error(e) is not None or isinstance(e, PermissionError):  # one line: no traceback to read
            log.error("could not write the %s record either: %s", status, describe_error(e))
        else:
            log.exception("could not write the %s record", status)


def _write_failure(cfg: DictConfig, error: BaseException, wall_time_s: float) -> None:
    """:func:`_write_status` ``failed``. A full disk (:func:`no_space_error`): the log files on that disk are
    closed first (:func:`close_log_files_on`; each later line would print a 'Logging error' traceback), the record
    gets the resume command, and one line says what happened and how to go on."""
    if no_space_error(error) is None:
        _write_status(cfg, "failed", error, wall_time_s)
        return
    out = _output_dir(cfg)
    closed = close_log_files_on(out) if out else []
    if closed:
        log.warning("the disk is full: %s closed, later messages go to the console only", ", ".join(closed))
    command = resume_command(cfg)
    log.error("%s; the resume command: %s", describe_error(error), command)
    _write_status(cfg, "failed", error, wall_time_s, command)


def close_log_files_on(folder: str | Path) -> list[str]:
    """Detach and close the ``logging.FileHandler`` s (Hydra's ``<job>.log``) whose file lies on the file system of
    ``folder`` (a full disk: every later log line would print a 'Logging error' traceback on stderr). Returns their
    file names; ``[]`` when ``folder`` cannot be read."""
    try:
        device = os.stat(folder).st_dev
    except OSError:
        return []
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    closed = []
    for lg in loggers:
        for handler in list(lg.handlers):
            if not isinstance(handler, logging.FileHandler):
                continue
            try:
                same = os.stat(handler.baseFilename).st_dev == device
            except OSError:
                same = os.path.dirname(handler.baseFilename) == os.path.abspath(folder)
            if not same:
                continue
            lg.removeHandler(handler)
            with suppress(OSError, ValueError):  # close flushes what it buffered: on a full disk that fails
                handler.close()
            closed.append(handler.baseFilename)
    return closed


class _Signalled(BaseException):
    """Raised by the signal handler of :func:`_interruptible` (not an ``Exception``: nothing on the way may
    swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum = signum


#: the signals that stop a run with an interrupted record: kill / timeout / a scheduler (SIGTERM), Ctrl-C (SIGINT),
#: a closed terminal or ssh connection (SIGHUP, where the platform has it)
STOP_SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None)
_PROCESS = {"script": False}  # set by exit_after_stop(): this process is a training script


def exit_after_stop() -> None:
    """Mark this process as a training script (``train.py``, ``diffrank-train``), not a library caller of :func:`run`:
    once a stop signal has stopped a run, later stop signals are ignored (``SIG_IGN``) until the process exits with
    128 + the first one (after the record and, in a multirun, the sweep summary; else a second ``kill`` arriving
    after the record was written, or while the interpreter shuts down, would end the process by the signal's
    default action). A library caller gets its own handlers back when :func:`run` returns or raises."""
    _PROCESS["script"] = True


@contextmanager
def _interruptible() -> Iterator[None]:
    """While the run lasts, the first of :data:`STOP_SIGNALS` raises :class:`_Signalled` in the main thread;
    any later one is reported on stderr and ignored, so that the run's clean-up and its interrupted record are not
    cut short (a second Ctrl-C or ``kill``; the exit status stays that of the first signal). SIGHUP stays ignored
    where the process was told to ignore it (``nohup``). Lightning calls this handler after its own SIGTERM
    handler, which forwards the signal to DDP workers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) == 1:
            raise _Signalled(signum)
        _say(f"{signal.Signals(signum).name} received while stopping after {signal.Signals(received[0]).name}: "
             "ignored, the run's record is being written")

    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    if old.get(getattr(signal, "SIGHUP", None)) is signal.SIG_IGN:  # nohup: a closed terminal must not stop it
        del old[signal.SIGHUP]
    for s in old:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in old.items():
            if received and _PROCESS["script"]:  # stopping: later ones are ignored until the process has exited
                signal.signal(s, signal.SIG_IGN)  # (a Python handler is reset to the default one at finalisation)
            else:
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _say(line: str) -> None:
    """Write a line to stderr from a signal handler (no logging: the handler may run inside a logging call)."""
    with suppress(OSError):
        os.write(2, f"{line}\n".encode())


def resume_command(cfg: DictConfig) -> str:
    """How to go on with an interrupted run: a multirun job, the same command into the same ``hydra.sweep.dir``
    (finished jobs are skipped, this one resumes); a single run, ``python train.py`` with its overrides,
    ``ckpt_path=<checkpoint>`` and ``hydra.run.dir=<folder>``, the checkpoint being
    ``<folder>/checkpoints/last.ckpt`` or, when the run was stopped while writing its first one, the newest
    complete checkpoint there (:func:`~diffrank.experiments.records.folder.resume_checkpoint`); the same command
    when no checkpoint was written yet."""
    info = _hydra_info()
    out = Path(str(cfg.paths.output_dir))
    if info["multirun"]:
        return f"the same command with -m hydra.sweep.dir={info['sweep_dir']} (this job resumes from its last.ckpt)"
    overrides = [o for o in info["overrides"] if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    checkpoint = resume_checkpoint(out)
    resume = [f"ckpt_path={checkpoint}", f"hydra.run.dir={out}"] if checkpoint is not None else []
    return shlex.join(["python", "train.py", *overrides, *resume])


def run(cfg: DictConfig) -> float | None:
    """:func:`train`, then close W&B (so multirun jobs get their own runs), print the test metrics and
    return ``cfg.optimized_metric`` for sweepers.

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
    out = _output_dir(cfg)
    lock = FolderLock.take_over(out) if out and _main_process() else None  # Hydra's guard took it
    if lock is None and out and _main_process():
        info = _hydra_info()
        if finished_record(cfg, info["overrides"], info["multirun"]) is None:  # a skipped job writes nothing
            lock = FolderLock(out).acquire()  # FolderBusy / FolderNotWritable: nothing of ours to record
    try:
        with _interruptible():
            try:
                metrics, objects = train(cfg, lock)
            except (FolderBusy, FolderTaken, FolderNotWritable):
                raise  # the folder is another run's, or not ours to write: its record stays as it is
            except _Signalled as e:
                command = resume_command(cfg)
                _write_status(cfg, "interrupted", e, time.time() - t0, command)
                log.error("interrupted by %s; resume with: %s", signal.Signals(e.signum).name, command)
                raise RunInterrupted(e.signum, f"{e}: resume with {command}") from None
            except Exception as e:
                _write_failure(cfg, e, time.time() - t0)
                raise
    finally:
        _finish_wandb([])
        if lock is not None:
            lock.release()
    print_summary(metrics, objects.get("results"))
    results = objects.get("results") or {}
    if objects.get("skipped"):
        log.info("finished earlier (skip_finished): %s", results.get("run_dir"))
    elif results:
        log.info("wall time %.1f s; run folder %s", results["wall_time_s"], results["run_dir"])
    if results.get("status") == "diverged":
        log.error("the run diverged (%s): recorded as status: diverged, not a result", results.get("error"))
        if not _hydra_info()["multirun"]:  # a sweep goes on (its summary lists the job as diverged)
            raise SystemExit(3)
    name = cfg.get("optimized_metric")
    return metrics.get(name) if name else None


if __name__ == "__main__":
    main()
