"""A run folder's state: the one decision whether a job in that folder is done, resumes, or starts new.

Both job runners ask :func:`folder_state`: the training runner (``python train.py -m …`` with
``skip_finished``, and SLURM requeues: :func:`diffrank.experiments.run.train.finished_record` and its resume
path) and the cell launcher (:mod:`diffrank.experiments.tools.cells`), so the two never disagree on what a
folder holds. A run folder is the Hydra output folder of one job: its record (:data:`~.record.RECORD_FILE`)
and its checkpoints (:data:`LAST_CHECKPOINT`, written by ``configs/callbacks/default.yaml``'s ``ModelCheckpoint``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from diffrank.experiments.records.record import RECORD_FILE, RunRecord

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"  # relative to the run folder (callbacks/default.yaml dirpath)
SLURM_CHECKPOINTS = "hpc_ckpt_*.ckpt"  # Lightning's SLURM requeue checkpoints: Lightning resumes from them itself


@dataclass(frozen=True)
class FolderState:
    """What a job finds in its run folder.

    ``action``: ``"done"`` (a finished record: skip the job), ``"resume"`` (an interrupted run left a checkpoint)
    or ``"new"``. ``record``: the folder's complete record (None when there is none, or it is torn). ``checkpoint``:
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

    A folder is done when its record is complete (:meth:`RunRecord.read`) with ``status: done`` and, when given,
    the same task ``overrides`` (in any order: the job is this one) and ``metric`` among its metrics (the run
    measured what selects it); else it resumes when an interrupted run left a checkpoint (``last.ckpt`` or a
    SLURM requeue checkpoint); else it is new.

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
    done = (record is not None and record.status == "done"
            and (overrides is None or sorted(record.overrides) == sorted(str(o) for o in overrides))
            and (metric is None or metric in record.metrics))
    if done:
        return FolderState("done", record, checkpoint)
    return FolderState("resume" if checkpoint is not None or slurm else "new", record, checkpoint)
