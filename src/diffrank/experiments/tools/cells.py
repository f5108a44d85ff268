"""Run the seeds of table cells as a queue of single-threaded jobs side by side, each resumable.

``python -m diffrank.experiments.tools.cells sorting/thesis_t3_5/bitonic_lambda04_n32_b4 --grid operator.beta=30,35
--seeds 0,1,2 --slots 2 --threads 1 -- paths.data_dir=$DATA``

Several cells make one queue (``cells sorting/lapsum_t4/lapsum_n3 sorting/lapsum_t4/neuralsort_n3 --seeds 0,1,2``):
their jobs run in the order given, every cell's seeds (and grid) in turn, the same overrides for all.

A CPU with c cores runs c one-thread jobs faster in total than one c-thread job of a small network (batch-4
steps do not split well over threads), and a session that ends kills its processes: every job trains in a
fixed folder ``<out>/<experiment>/<grid values>_seed<s>``, so running the same command again skips the finished
jobs (a ``results.json`` with ``status: done``), resumes the interrupted ones from their ``checkpoints/last.ckpt``
(exact resume, README "Reproducibility") and starts the rest: the training runner's own decision for a run folder
(:func:`diffrank.experiments.records.folder.folder_state`), this module only launches. Jobs start in the order
given, ``--slots`` at a time; each job's output goes to ``<folder>/stdout.log``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from diffrank.experiments.records.folder import FolderState, folder_state


@dataclass
class Job:
    """One training run of the queue: its folder and its Hydra overrides."""

    folder: Path
    overrides: list[str]

    @property
    def state(self) -> FolderState:
        """Done / resume / new, and the checkpoint to resume from (:func:`folder_state` of the folder)."""
        return folder_state(self.folder)

    def command(self) -> list[str]:
        """The ``diffrank.experiments.run.train`` command line of this job (resuming from the folder's checkpoint
        when it has one)."""
        checkpoint = self.state.checkpoint
        resume = [f"ckpt_path={checkpoint.resolve()}"] if checkpoint else []
        return [sys.executable, "-m", "diffrank.experiments.run.train", *self.overrides,
                f"hydra.run.dir={self.folder}", *resume]


def jobs(experiment: str, seeds: list[int], grid: list[str], extra: list[str], out: Path) -> list[Job]:
    """The jobs of a cell: every combination of the ``grid`` values (``key=v1,v2``) × ``seeds``, in that order.

    Raises:
        ValueError: a grid entry without ``=`` or without values.
    """
    axes = []
    for entry in grid:
        key, sep, values = entry.partition("=")
        if not sep or not values:
            raise ValueError(f"--grid takes key=v1,v2,…; got '{entry}'")
        axes.append([(key, v) for v in values.split(",")])
    out_jobs = []
    for combo in itertools.product(*axes):
        name = "_".join(f"{k.rsplit('.', 1)[-1]}{v}" for k, v in combo)
        for seed in seeds:
            folder = out / experiment / (f"{name}_seed{seed}" if name else f"seed{seed}")
            overrides = [f"experiment={experiment}", *(f"{k}={v}" for k, v in combo), f"seed={seed}", *extra]
            out_jobs.append(Job(folder, overrides))
    return out_jobs


def run_queue(queue: list[Job], slots: int, threads: int, poll_s: float = 10.0) -> dict[str, int]:
    """Run the unfinished jobs of ``queue``, ``slots`` at a time, each with ``threads`` intra-op threads
    (``OMP_NUM_THREADS``). Returns counts: ``skipped`` (already done), ``finished``, ``failed``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    todo = [j for j in queue if j.state.action != "done"]
    counts = {"skipped": len(queue) - len(todo), "finished": 0, "failed": 0}
    running: list[tuple[Job, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < slots:
            job = todo.pop(0)
            job.folder.mkdir(parents=True, exist_ok=True)
            checkpoint = job.state.checkpoint
            how = f"resuming from {checkpoint}" if checkpoint else "starting"
            print(f"[{time.strftime('%H:%M:%S')}] {how}: {job.folder}", flush=True)
            log = open(job.folder / "stdout.log", "a")  # noqa: SIM115 (closed when the job ends)
            running.append((job, subprocess.Popen(job.command(), stdout=log, stderr=subprocess.STDOUT, env=env)))
        time.sleep(poll_s if running else 0)
        for job, proc in list(running):
            if proc.poll() is None:
                continue
            running.remove((job, proc))
            ok = proc.returncode == 0 and job.state.action == "done"
            counts["finished" if ok else "failed"] += 1
            print(f"[{time.strftime('%H:%M:%S')}] {'done' if ok else f'FAILED (rc {proc.returncode})'}: "
                  f"{job.folder}", flush=True)
    return counts


def main(argv: list[str] | None = None) -> dict[str, int]:
    """Command line: run (or continue) the seeds of one or more cells; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiments", nargs="+", metavar="experiment",
                    help="experiment configs, e.g. sorting/thesis_t3_5/bitonic_lambda04_n32_b4 (one queue)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--grid", action="append", default=[], help="key=v1,v2 (repeatable): values crossed with seeds")
    ap.add_argument("--slots", type=int, default=max(1, os.cpu_count() or 1), help="jobs at a time (default: cores)")
    ap.add_argument("--threads", type=int, default=1, help="threads per job (default 1)")
    ap.add_argument("--out", type=Path, default=Path("outputs/cells"), help="root of the job folders")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs and their state, run nothing")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: Hydra overrides for every job
    argv, overrides = argv[:cut], argv[cut + 1:]
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    queue = [job for experiment in a.experiments for job in jobs(experiment, seeds, a.grid, overrides, a.out)]
    if a.dry_run:
        for j in queue:
            print(f"{j.state.action:7s} {j.folder}  {' '.join(j.overrides)}")
        return {"jobs": len(queue)}
    counts = run_queue(queue, a.slots, a.threads)
    print(f"{counts['finished']} finished, {counts['failed']} failed, {counts['skipped']} were already done")
    return counts


if __name__ == "__main__":
    main()
