"""The queue of the cell launcher (:mod:`diffrank.experiments.tools.cells`): its jobs started as subprocesses,
``slots`` at a time, each one's output in ``<folder>/stdout.log``; SIGTERM / SIGINT passed on to them; the last
error line of a failed job's log. A :class:`Job` is one training run: its folder and overrides.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffrank.experiments.records.folder import FINAL, FolderState, folder_state, job_overrides


@dataclass
class Job:
    """One training run of the queue: its folder and its Hydra overrides."""

    folder: Path
    overrides: list[str]

    @property
    def state(self) -> FolderState:
        """Live / done / resume / new, and the checkpoint to resume from (:func:`folder_state` of the folder with
        this job's overrides)."""
        return folder_state(self.folder, self.overrides)

    def label(self) -> str:
        """:attr:`state`'s action, or ``other`` for a folder holding a finished run of other overrides (not this
        job's: never resumed nor overwritten)."""
        state = self.state
        if state.action in ("new", "resume") and state.record is not None and state.record.status in FINAL:
            return "other"
        return state.action

    def other_run(self) -> str:
        """What an ``other`` folder holds and what to do."""
        record = self.state.record
        theirs, ours = set(job_overrides(record.overrides if record else [])), set(job_overrides(self.overrides))
        return (f"{self.folder} holds a finished run with other overrides (only there: "
                f"{' '.join(sorted(theirs - ours)) or '-'}; only here: {' '.join(sorted(ours - theirs)) or '-'}): "
                f"left alone; give these jobs another --out, or remove that folder to run them there")

    def command(self) -> list[str]:
        """The ``diffrank.experiments.run.train`` command line of this job (resuming from the folder's checkpoint
        when it has one)."""
        checkpoint = self.state.checkpoint
        resume = [f"ckpt_path={checkpoint.resolve()}"] if checkpoint else []
        return [sys.executable, "-m", "diffrank.experiments.run.train", *self.overrides,
                f"hydra.run.dir={self.folder}", *resume]


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def last_error(log: Path) -> str:
    """The line of a job's ``stdout.log`` that says why it failed: the exception line ending its last traceback
    (``ValueError: …``, ``diffrank….FolderBusy: …``), else its last line naming an error, else its last line that
    is not Hydra's ``HYDRA_FULL_ERROR`` hint; ``""`` for an empty or unreadable log."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            lines = [ln.rstrip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    found = ""
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            found = next((ln for ln in lines[i + 1:] if ln and not ln[0].isspace()), found)
    lines = [ln.strip() for ln in lines if ln.strip() and "HYDRA_FULL_ERROR" not in ln]
    errors = [ln for ln in lines if re.match(r"[\w.]*(error|exception)\b", ln, re.IGNORECASE)]
    return (found or (errors or lines or [""])[-1])[:300]


def run_queue(queue: list[Job], slots: int, threads: int, poll_s: float = 10.0,
              failures: list[tuple[Path, str]] | None = None) -> dict[str, int]:
    """Run the unfinished jobs of ``queue``, ``slots`` at a time, each with ``threads`` intra-op threads
    (``OMP_NUM_THREADS``). A job whose folder a live run holds is not started (``live``). SIGTERM / SIGINT to this
    process are passed to the running jobs, which are waited for (each writes its ``interrupted`` record); then
    this process exits with 128 + the signal. A failed job's line names its last error (:func:`last_error`), also
    appended to ``failures`` (``(folder, line)``) when given.

    Returns:
        Counts: ``skipped`` (already done), ``live`` (held by a running process), ``other`` (holding a finished
        run of other overrides: :meth:`Job.label`), ``finished``, ``failed``.

    Raises:
        ValueError: ``slots`` or ``threads`` below 1 (no job could ever start).
    """
    if slots < 1 or threads < 1:
        raise ValueError(f"slots and threads are at least 1, got slots={slots}, threads={threads}")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    states = {id(j): j.label() for j in queue}
    todo = [j for j in queue if states[id(j)] in ("new", "resume")]
    counts = {"skipped": sum(s == "done" for s in states.values()), "live": sum(s == "live" for s in states.values()),
              "other": sum(s == "other" for s in states.values()), "finished": 0, "failed": 0}
    for j in queue:
        if states[id(j)] == "live":
            print(f"[{time.strftime('%H:%M:%S')}] live (another process runs it), left alone: {j.folder}", flush=True)
        elif states[id(j)] == "other":
            print(f"[{time.strftime('%H:%M:%S')}] {j.other_run()}", flush=True)
    running: list[tuple[Job, subprocess.Popen]] = []

    def stop(signum: int, frame: Any) -> None:
        """Signal handler: unwind to the queue's cleanup, which passes the signal on to the running jobs."""
        raise _Stop(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while todo or running:
            while todo and len(running) < slots:
                running.append(_start(todo.pop(0), env))
            time.sleep(poll_s if running else 0)
            _reap(running, counts, failures)
    except _Stop as e:
        _pass_on(e, running, old)
        raise SystemExit(128 + e.signum) from None
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return counts


def _start(job: Job, env: dict[str, str]) -> tuple[Job, subprocess.Popen]:
    """Start ``job`` in its folder (its output appended to ``stdout.log``) and say so."""
    job.folder.mkdir(parents=True, exist_ok=True)
    checkpoint = job.state.checkpoint
    how = f"resuming from {checkpoint}" if checkpoint else "starting"
    print(f"[{time.strftime('%H:%M:%S')}] {how}: {job.folder}", flush=True)
    with open(job.folder / "stdout.log", "a") as log:
        return job, subprocess.Popen(job.command(), stdout=log, stderr=subprocess.STDOUT, env=env)


def _reap(running: list[tuple[Job, subprocess.Popen]], counts: dict[str, int],
          failures: list[tuple[Path, str]] | None) -> None:
    """Take the jobs that have exited out of ``running``: count each as finished or failed and print its line."""
    for job, proc in list(running):
        if proc.poll() is None:
            continue
        running.remove((job, proc))
        ok = proc.returncode == 0 and job.state.action == "done"
        counts["finished" if ok else "failed"] += 1
        why = "" if ok else last_error(job.folder / "stdout.log")
        if not ok and failures is not None:
            failures.append((job.folder, why))
        print(f"[{time.strftime('%H:%M:%S')}] {'done' if ok else f'FAILED (rc {proc.returncode})'}: "
              f"{job.folder}" + (f": {why}" if why else ""), flush=True)


def _pass_on(e: _Stop, running: list[tuple[Job, subprocess.Popen]], old: dict) -> None:
    """Pass the signal of ``e`` to the running jobs (a second signal ignored meanwhile) and wait for each (killed
    after 120 s)."""
    for s in old:  # a second signal while the jobs stop does not leave them behind
        signal.signal(s, signal.SIG_IGN)
    print(f"[{time.strftime('%H:%M:%S')}] {e}: passing it to {len(running)} running job(s)", flush=True)
    for _, proc in running:
        proc.send_signal(e.signum)
    for job, proc in running:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"[{time.strftime('%H:%M:%S')}] stopped (rc {proc.returncode}): {job.folder}", flush=True)
