"""A run folder's state: the one decision whether a job in that folder is done, resumes, or starts new.

Both job runners ask :func:`folder_state`: the training runner (``python train.py -m …`` with
``skip_finished``, and SLURM requeues: :func:`diffrank.experiments.run.train.finished_record` and its resume
path) and the cell launcher (:mod:`diffrank.experiments.tools.cells`), so the two never disagree on what a
folder holds. A run folder is the Hydra output folder of one job: its record (:data:`~.record.RECORD_FILE`)
and its checkpoints (:data:`LAST_CHECKPOINT`, written by ``configs/callbacks/default.yaml``'s ``ModelCheckpoint``).

A run holds its folder's lock (:class:`FolderLock`, ``<folder>/.run.lock``) while it writes there: a second run
into a live folder is refused (:class:`FolderBusy`), and :func:`folder_state` calls such a folder ``live``; a new run
into a folder that holds another run's record or checkpoints is refused too (:func:`refuse_other_run`) unless it
resumes that run. A single run takes the lock before Hydra writes its ``.hydra/`` files (the Hydra callback
:class:`~diffrank.experiments.callbacks.hydra_callbacks.RunFolderGuard`) and hands that same lock to the training
runner (:meth:`FolderLock.hand_over`, :meth:`FolderLock.take_over`), which holds it to the end of the run: no
moment in between when a second run could pass. A folder the run cannot write is refused up front
(:class:`FolderNotWritable`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
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


class FolderNotWritable(PermissionError):
    """A run folder (or a file a run writes in it) that this process cannot create or write: read-only, another
    user's, on a read-only or full file system, or below a path that is not a folder (:func:`check_writable`,
    :meth:`FolderLock.acquire`). The message is one line naming the folder, the reason and the way on; ``errno`` is
    the original error's (EACCES, EPERM, EROFS, ENOENT, ENOTDIR, ENOSPC, …).

    Args:
        path: the folder.
        error: the error met creating or writing it.
        flag: the override that chooses the folder, named in the message (``hydra.sweep.dir`` for a sweep's).
    """

    def __init__(self, path: str | Path, error: OSError, flag: str = "hydra.run.dir") -> None:
        folder = Path(path)
        why = "a file, not a folder" if error.errno == errno.EEXIST else error.strerror or type(error).__name__
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(folder) else ""
        read_only = error.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        chmod = f"make it writable (chmod -R u+w {folder}), or " if read_only and error.errno != errno.EROFS else ""
        if read_only and flag == "hydra.run.dir":
            fix = (f"{chmod}copy it and resume the copy (ckpt_path=<copy>/{LAST_CHECKPOINT} hydra.run.dir=<copy>), "
                   f"or give a new run another folder (hydra.run.dir=…)")
        else:
            fix = f"{chmod}give this run another folder ({flag}=…)"
        super().__init__(f"{folder} {'is not writable' if read_only else 'cannot be created or written'} "
                         f"({why}{where}): a run writes its lock, log, checkpoints and results.json there; {fix}")
        self.errno = error.errno


#: errors of creating or writing a run folder that a change of folder or permissions fixes, not of the config
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EEXIST, errno.EISDIR,
                 errno.ENAMETOOLONG, errno.ELOOP, errno.ENOSPC, errno.EDQUOT)


class FolderLock:
    """The lock of a run folder: an exclusive ``flock`` on ``<folder>/.run.lock`` held from :meth:`acquire` to
    :meth:`release` (or the process's end: the kernel releases it, so a killed run never leaves a stale lock). The
    file holds ``host pid run_id`` of the holder, for the message of the run that is refused.

    Args:
        folder: the run folder (created).
        run_id: the holder's run id (written into the lock file).

    Raises:
        FolderBusy: (:meth:`acquire`) another process holds the lock.
        FolderNotWritable: (:meth:`acquire`) the folder cannot be created or written.
    """

    _handed: dict[Path, FolderLock] = {}  # noqa: RUF012 - folder (resolved) -> the lock handed to the runner

    def __init__(self, folder: str | Path, run_id: str | None = None) -> None:
        self.folder, self.run_id = Path(folder), run_id
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._file is not None

    def acquire(self) -> FolderLock:
        """Take the lock, or raise :class:`FolderBusy` naming the holder, or :class:`FolderNotWritable` when the
        folder (or a file a run writes there) cannot be written (:func:`check_writable`)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            f = open(self.folder / LOCK_FILE, "a+")  # noqa: SIM115 - held open as long as the lock
        except OSError as e:
            if e.errno in _NOT_WRITABLE:
                raise FolderNotWritable(self.folder, e) from None
            raise
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
        try:
            check_writable(self.folder)
        except FolderNotWritable:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would race with a run taking it); a no-op when not held."""
        if self._file is not None:
            if FolderLock._handed.get(self._key()) is self:
                del FolderLock._handed[self._key()]
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def _key(self) -> Path:
        return self.folder.resolve()

    def hand_over(self) -> FolderLock:
        """Keep holding the lock (it must be held) for the run that will write the folder in this process: the one
        :meth:`take_over` of the same folder gets this object. Hydra's guard takes the lock before Hydra writes
        ``.hydra/`` and hands it to the training runner, so the folder is never unlocked in between.

        Raises:
            RuntimeError: the lock is not held.
        """
        if not self.held:
            raise RuntimeError(f"hand_over of a lock not held: {self.folder}")
        FolderLock._handed[self._key()] = self
        return self

    @staticmethod
    def handed_over(folder: str | Path) -> FolderLock | None:
        """The lock of ``folder`` handed over in this process and not taken yet (:meth:`hand_over`), else None."""
        return FolderLock._handed.get(Path(folder).resolve())

    @staticmethod
    def take_over(folder: str | Path) -> FolderLock | None:
        """The lock of ``folder`` that this process took and handed over (:meth:`hand_over`), now the caller's to
        release; None when there is none (then the caller takes its own)."""
        lock = FolderLock._handed.pop(Path(folder).resolve(), None)
        return lock if lock is not None and lock.held else None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_writable(folder: str | Path, flag: str = "hydra.run.dir") -> None:
    """Check that a run can write ``folder``: create (and remove) a file in it, in its ``.hydra/`` and
    ``checkpoints/`` subfolders when they exist, and open for appending the files there that a resumed run
    rewrites or appends to (``.hydra/*.yaml``, the ``*.log`` files). A read-only copy of a finished run would
    otherwise fail half-way: a ``PermissionError`` in a callback, then ``Unable to configure handler 'file'``.

    Args:
        folder: the run (or sweep) folder.
        flag: the override that chooses it, for the message.

    Raises:
        FolderNotWritable: (a ``PermissionError``) one of them cannot be written (the message names the folder).
    """
    folder = Path(folder)
    dirs = [d for d in (folder, folder / ".hydra", folder / LAST_CHECKPOINT.parent) if d.is_dir()]
    files = [f for f in (*folder.glob("*.log"), *(folder / ".hydra").glob("*.yaml")) if f.is_file()]
    try:
        for d in dirs:
            fd, probe = tempfile.mkstemp(prefix=".write_probe.", dir=d)
            os.close(fd)
            os.unlink(probe)
        for f in files:
            with open(f, "a"):
                pass
    except OSError as e:
        if e.errno in _NOT_WRITABLE:
            raise FolderNotWritable(folder, e, flag) from None
        raise


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
    the checkpoint to resume from (:func:`resume_checkpoint`: ``<folder>/checkpoints/last.ckpt``, else the newest
    complete checkpoint there), None when there is none or when Lightning's SLURM requeue checkpoint
    (``hpc_ckpt_*.ckpt``, newer) is there, which Lightning resumes from itself when ``ckpt_path`` is None; kept for
    a done folder too (a SLURM requeue of a finished job continues from it).
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
    (:func:`resume_checkpoint`: ``last.ckpt``, else the newest complete one; or a SLURM requeue checkpoint); else it
    is new.

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
    checkpoint = resume_checkpoint(folder) if not slurm else None
    if is_live(folder):
        return FolderState("live", record, checkpoint)
    done = (record is not None and record.status in FINAL
            and (overrides is None or job_overrides(record.overrides) == job_overrides(overrides))
            and (metric is None or metric in record.metrics))
    if done:
        return FolderState("done", record, checkpoint)
    return FolderState("resume" if checkpoint is not None or slurm else "new", record, checkpoint)


def resume_checkpoint(folder: str | Path) -> Path | None:
    """The checkpoint an interrupted run in ``folder`` resumes from: ``checkpoints/last.ckpt``, or, when there is
    none (a run stopped while its first ``last.ckpt`` was being written: only the temporary ``.last.ckpt.*.tmp`` was
    there, and it is removed), the newest complete checkpoint in ``checkpoints/`` (by modification time; every
    ``*.ckpt`` there was renamed into place whole, temporary files start with a dot). None when there is none."""
    folder = Path(folder)
    last = folder / LAST_CHECKPOINT
    if last.is_file():
        return last
    found = []
    for p in (folder / LAST_CHECKPOINT.parent).glob("*.ckpt"):
        try:
            if not p.name.startswith(".") and p.is_file():
                found.append((p.stat().st_mtime_ns, p.name, p))
        except OSError:  # removed while listing (a top-k checkpoint replaced)
            continue
    return max(found)[2] if found else None


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
    last = resume_checkpoint(folder)
    resume = f"resume it with ckpt_path={last}, or " if last is not None else ""
    raise FolderTaken(f"{folder} holds {what}: a new run there would overwrite its results.json and mix its "
                          f"checkpoints with this one's; {resume}give this run its own folder (hydra.run.dir=…)")


def _smoke_test(record: RunRecord) -> bool:
    trainer = record.config.get("trainer")
    return isinstance(trainer, dict) and bool(trainer.get("fast_dev_run"))
