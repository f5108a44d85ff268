"""A run folder's state: the one decision whether a job in that folder is done, resumes, or starts new.

Both job runners ask :func:`folder_state`: the training runner (``python train.py -m …`` with
``skip_finished``, and SLURM requeues: :func:`diffrank.experiments.run.train.finished_record` and its resume
path) and the cell launcher (:mod:`diffrank.experiments.tools.cells`), so the two never disagree on what a
folder holds. A run folder is the Hydra output folder of one job: its record (:data:`~.record.RECORD_FILE`)
and its checkpoints (:data:`LAST_CHECKPOINT`, written by ``configs/callbacks/default.yaml``'s ``ModelCheckpoint``).

A run holds its folder's lock (:class:`FolderLock`, ``<folder>/.run.lock``) while it writes there: a second run
into a live folder is refused (:class:`FolderBusy`), and :func:`folder_state` calls such a folder ``live``; a new run
into a folder that holds another run's record or checkpoints is refused too (:func:`refuse_other_run`) unless it
resumes that run.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from diffrank.experiments.records.record import RECORD_FILE, RunRecord

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"  # relative to the run folder (callbacks/default.yaml dirpath)
SLURM_CHECKPOINTS = "hpc_ckpt_*.ckpt"  # Lightning's SLURM requeue checkpoints: Lightning resumes from them itself
LOCK_FILE = ".run.lock"  # held (flock) by the process of the run writing to the folder; the kernel drops it at exit
# task overrides that say how a job was started, not which job it is (cells resumes with ckpt_path=<its last.ckpt>)
START_OVERRIDES = ("ckpt_path",)
# statuses of a run that ended for good: ``diverged`` too (the divergence guard stopped it; training it again from
# its last checkpoint would only diverge again)
FINAL = ("done", "diverged")


class FolderBusy(RuntimeError):
    """A run folder is locked by a live run (the message names its process)."""


class FolderTaken(FileExistsError):
    """A run folder holds another run's record or checkpoints (:func:`refuse_other_run`)."""


class RunInterrupted(Exception):
    """A run stopped by a signal (SIGTERM: ``kill``, ``timeout``, a scheduler's preemption; SIGINT: Ctrl-C) after
    its record (``status: interrupted``, with the resume command) was written. The training runner raises it, the
    multirun summary (:class:`diffrank.experiments.callbacks.hydra_callbacks.SweepSummary`) lists the job, and the
    process exits with :attr:`exit_code` (128 + the signal number, as a shell reports a death by that signal).

    Args:
        signum: the signal's number.
        message: what was interrupted and how to resume it.
    """

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


class FolderLock:
    """The lock of a run folder: an exclusive ``flock`` on ``<folder>/.run.lock`` held from :meth:`acquire` to
    :meth:`release` (or the process's end: the kernel releases it, so a killed run never leaves a stale lock). The
    file holds ``host pid run_id`` of the holder, for the message of the run that is refused.

    Args:
        folder: the run folder (created).
        run_id: the holder's run id (written into the lock file).

    Raises:
        FolderBusy: (:meth:`acquire`) another process holds the lock.
    """

    def __init__(self, folder: str | Path, run_id: str | None = None) -> None:
        self.folder, self.run_id = Path(folder), run_id
        self._file: IO[str] | None = None

    def acquire(self) -> FolderLock:
        """Take the lock, or raise :class:`FolderBusy` naming the holder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        f = open(self.folder / LOCK_FILE, "a+")  # noqa: SIM115 - held open as long as the lock
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise FolderBusy(f"{self.folder} is in use by a live run ({holder}): two runs in one folder overwrite "
                             f"each other's results.json and checkpoints; give this run its own hydra.run.dir, or "
                             f"wait for that run to end") from None
        f.seek(0)
        f.truncate()
        run = f" run {self.run_id}" if self.run_id else ""
        f.write(f"host {socket.gethostname()} pid {os.getpid()}{run}\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would race with a run taking it)."""
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_live(folder: str | Path) -> bool:
    """Whether a live run holds ``folder``'s lock (:class:`FolderLock`)."""
    path = Path(folder) / LOCK_FILE
    if not path.is_file():
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


@dataclass(frozen=True)
class FolderState:
    """What a job finds in its run folder.

    ``action``: ``"live"`` (a run holds the folder's lock now: start nothing there), ``"done"`` (a finished
    record: skip the job), ``"resume"`` (an interrupted run left a checkpoint) or ``"new"``. ``record``: the
    folder's complete record (None when there is none, or it is torn). ``checkpoint``:
    the checkpoint to resume from (``<folder>/checkpoints/last.ckpt``), None when there is none or when Lightning's
    SLURM requeue checkpoint (``hpc_ckpt_*.ckpt``, newer) is there, which Lightning resumes from itself when
    ``ckpt_path`` is None; kept for a done folder too (a SLURM requeue of a finished job continues from it).
    """

    action: str
    record: RunRecord | None = None
    checkpoint: Path | None = None


def folder_state(folder: str | Path, overrides: Iterable[str] | None = None,
                 metric: str | None = None) -> FolderState:
    """The state of the run folder ``folder`` (missing folders are ``new``).

    A folder is live while a run holds its lock (:func:`is_live`). It is done when its record is complete
    (:meth:`RunRecord.read`) with a final status (:data:`FINAL`: ``done``, or ``diverged``) and, when given, the
    same task ``overrides`` (in any order, ``ckpt_path=`` left out: the job is this one) and ``metric`` among its
    metrics (the run measured what selects it); else it resumes when an interrupted run left a checkpoint
    (``last.ckpt`` or a SLURM requeue checkpoint); else it is new.

    Args:
        folder: the job's run folder.
        overrides: the job's Hydra task overrides, or None to accept any finished record.
        metric: a metric the finished record must hold (the config's ``optimized_metric``), or None.

    Returns:
        The :class:`FolderState`.
    """
    folder = Path(folder)
    record = RunRecord.read(folder / RECORD_FILE)
    slurm = any(folder.glob(SLURM_CHECKPOINTS))
    last = folder / LAST_CHECKPOINT
    checkpoint = last if last.is_file() and not slurm else None
    if is_live(folder):
        return FolderState("live", record, checkpoint)
    done = (record is not None and record.status in FINAL
            and (overrides is None or job_overrides(record.overrides) == job_overrides(overrides))
            and (metric is None or metric in record.metrics))
    if done:
        return FolderState("done", record, checkpoint)
    return FolderState("resume" if checkpoint is not None or slurm else "new", record, checkpoint)


def job_overrides(overrides: Iterable[str]) -> list[str]:
    """The overrides that say which job a run is, sorted: without those that only say how it was started
    (:data:`START_OVERRIDES`)."""
    return sorted(str(o) for o in overrides if str(o).lstrip("+~").split("=", 1)[0] not in START_OVERRIDES)


def refuse_other_run(folder: str | Path, ckpt_path: str | Path | None, run_id: str | None) -> None:
    """Refuse a run into a folder that holds another run's results: a record (that of a run that failed or was
    interrupted and left no checkpoint is only replaced, and so is a ``trainer.fast_dev_run`` smoke test with its
    one-batch checkpoints) or checkpoints, unless this run resumes that run (its ``ckpt_path`` lies in the folder,
    or carries the folder's ``run_id``).

    Args:
        folder: the run folder.
        ckpt_path: the checkpoint this run starts from, or None.
        run_id: the run id of this run (that of ``ckpt_path`` when it resumes one), or None.

    Raises:
        FolderTaken: (a ``FileExistsError``) the folder holds another run (the message names it and the two ways
            on).
    """
    folder = Path(folder)
    record = RunRecord.read(folder / RECORD_FILE)
    checkpoints = sorted(p.name for p in (folder / LAST_CHECKPOINT.parent).glob("*.ckpt")) \
        if (folder / LAST_CHECKPOINT.parent).is_dir() else []
    if record is not None and (_smoke_test(record) or (record.status in ("failed", "interrupted") and not checkpoints)):
        return
    if record is None and not checkpoints:
        return
    if ckpt_path is not None and Path(ckpt_path).resolve().is_relative_to(folder.resolve()):
        return
    if record is not None and run_id is not None and record.run_id == run_id:
        return
    what = f"run {record.run_id or '(no id)'} (status {record.status})" if record is not None \
        else f"the checkpoints of another run ({', '.join(checkpoints[:3])})"
    last = folder / LAST_CHECKPOINT
    resume = f"resume it with ckpt_path={last}, or " if last.is_file() else ""
    raise FolderTaken(f"{folder} holds {what}: a new run there would overwrite its results.json and mix its "
                          f"checkpoints with this one's; {resume}give this run its own folder (hydra.run.dir=…)")


def _smoke_test(record: RunRecord) -> bool:
    trainer = record.config.get("trainer")
    return isinstance(trainer, dict) and bool(trainer.get("fast_dev_run"))
