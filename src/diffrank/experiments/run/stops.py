"""How a script run stops other than by finishing: the stop signals (SIGTERM / SIGINT / SIGHUP) and the record a
stopped run leaves (``interrupted`` with the resume command, or ``failed``; a full disk names the file and ENOSPC
and closes the log files on that disk).

:func:`~diffrank.experiments.run.train.run` holds :func:`interruptible` around a run and hands what stopped it to
:func:`record_stop`; :func:`exit_after_stop` marks the process as a training script.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from diffrank.experiments.callbacks.hydra_callbacks import RunInterrupted
from diffrank.experiments.records.disk import describe_no_space, no_space_error
from diffrank.experiments.records.folder import resume_checkpoint
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
from diffrank.experiments.run.process import hydra_job, main_process, output_dir

log = logging.getLogger(__name__)

#: the signals that stop a run with an interrupted record: kill / timeout / a scheduler (SIGTERM), Ctrl-C (SIGINT),
#: a closed terminal or ssh connection (SIGHUP, where the platform has it)
STOP_SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None)
_PROCESS = {"script": False}  # set by exit_after_stop(): this process is a training script


class Signalled(BaseException):
    """Raised by the signal handler of :func:`interruptible` (not an ``Exception``: nothing on the way may
    swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum = signum


def exit_after_stop() -> None:
    """Mark this process as a training script (``train.py``, ``diffrank-train``), not a library caller of
    :func:`~diffrank.experiments.run.train.run`: once a stop signal has stopped a run, later stop signals are
    ignored (``SIG_IGN``) until the process exits with 128 + the first one (after the record and, in a multirun, the
    sweep summary; else a second ``kill`` arriving after the record was written, or while the interpreter shuts
    down, would end the process by the signal's default action). A library caller gets its own handlers back when
    ``run`` returns or raises."""
    _PROCESS["script"] = True


@contextmanager
def interruptible() -> Iterator[None]:
    """While the run lasts, the first of :data:`STOP_SIGNALS` raises :class:`Signalled` in the main thread;
    any later one is reported on stderr and ignored, so that the run's clean-up and its interrupted record are not
    cut short (a second Ctrl-C or ``kill``; the exit status stays that of the first signal). SIGHUP stays ignored
    where the process was told to ignore it (``nohup``). Lightning calls this handler after its own SIGTERM
    handler, which forwards the signal to DDP workers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        """The handler: the first stop signal raises :class:`Signalled`; later ones are reported and ignored."""
        received.append(signum)
        if len(received) == 1:
            raise Signalled(signum)
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


def describe_error(error: BaseException) -> str:
    """``"<type>: <message>"`` of ``error``; a full disk (ENOSPC anywhere in its chain of causes: torch's writer
    reports it as ``unexpected pos …``) is named first, with the file being written when known."""
    if isinstance(error, Signalled):
        return str(error)
    return describe_no_space(error) or f"{type(error).__name__}: {error}"


def resume_command(cfg: DictConfig) -> str:
    """How to go on with an interrupted run: a multirun job, the same command into the same ``hydra.sweep.dir``
    (finished jobs are skipped, this one resumes); a single run, ``python train.py`` with its overrides,
    ``ckpt_path=<checkpoint>`` and ``hydra.run.dir=<folder>``, the checkpoint being
    ``<folder>/checkpoints/last.ckpt`` or, when the run was stopped while writing its first one, the newest
    complete checkpoint there (:func:`~diffrank.experiments.records.folder.resume_checkpoint`); the same command
    when no checkpoint was written yet."""
    job = hydra_job()
    out = Path(str(cfg.paths.output_dir))
    if job.multirun:
        return f"the same command with -m hydra.sweep.dir={job.sweep_dir} (this job resumes from its last.ckpt)"
    overrides = [o for o in job.overrides if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    checkpoint = resume_checkpoint(out)
    resume = [f"ckpt_path={checkpoint}", f"hydra.run.dir={out}"] if checkpoint is not None else []
    return shlex.join(["python", "train.py", *overrides, *resume])


def record_stop(cfg: DictConfig, error: BaseException, wall_time_s: float) -> BaseException:
    """Write the record of a run that ``error`` stopped, and return the error to raise.

    - :class:`Signalled` (a stop signal): ``status: interrupted`` with the :func:`resume_command`, logged; returns a
      :class:`~diffrank.experiments.callbacks.hydra_callbacks.RunInterrupted` (its exit code is 128 + the signal).
    - any other error: ``status: failed`` (the sweep summary lists the job as failed, and skip-finished trains it
      again); returns ``error`` itself. A full disk (:func:`~diffrank.experiments.records.disk.no_space_error`): the
      log files on that disk are closed first (:func:`close_log_files_on`; each later line would print a 'Logging
      error' traceback), the record gets the resume command, and one line says what happened and how to go on.
    """
    if isinstance(error, Signalled):
        command = resume_command(cfg)
        _write_record(cfg, "interrupted", error, wall_time_s, command)
        log.error("interrupted by %s; resume with: %s", signal.Signals(error.signum).name, command)
        return RunInterrupted(error.signum, f"{error}: resume with {command}")
    command = None
    if no_space_error(error) is not None:
        out = output_dir(cfg)
        closed = close_log_files_on(out) if out else []
        if closed:
            log.warning("the disk is full: %s closed, later messages go to the console only", ", ".join(closed))
        command = resume_command(cfg)
        log.error("%s; the resume command: %s", describe_error(error), command)
    _write_record(cfg, "failed", error, wall_time_s, command)
    return error


def _write_record(cfg: DictConfig, status: str, error: BaseException, wall_time_s: float,
                  resume: str | None) -> None:
    """``results.json`` with ``status`` and ``error``; never over a finished record, and only in the main process.
    A failure to write it is logged, never raised (the original error matters more than its record)."""
    if not main_process():
        return
    try:
        out = output_dir(cfg)
        if not out:
            return
        path = Path(out) / RECORD_FILE
        if getattr(RunRecord.read(path), "status", None) in ("done", "diverged"):
            return
        lineage = getattr(error, "diffrank_run", None) or {}
        RunRecord(status=status, error=describe_error(error)[:2000], resume_command=resume,
                  run_id=lineage.get("run_id"), config_hash=lineage.get("config_hash"),
                  overrides=hydra_job().overrides, wall_time_s=wall_time_s,
                  finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  config=OmegaConf.to_container(cfg, resolve=False)).write(path)
    except Exception as e:  # the original error matters more than its record
        if no_space_error(e) is not None or isinstance(e, PermissionError):  # one line: no traceback to read
            log.error("could not write the %s record either: %s", status, describe_error(e))
        else:
            log.exception("could not write the %s record", status)


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


__all__ = ["STOP_SIGNALS", "Signalled", "close_log_files_on", "describe_error", "exit_after_stop", "interruptible",
           "record_stop", "resume_command"]
