"""Run the seeds of table cells as a queue of single-threaded jobs side by side, each resumable.

``python -m diffrank.experiments.tools.cells sorting/thesis_t3_5/bitonic_lambda04_n32_b4 --grid operator.beta=30,35
--seeds 0,1,2 --slots 2 --threads 1 -- paths.data_dir=$DATA``

Several cells make one queue (``cells sorting/lapsum_t4/lapsum_n3 sorting/lapsum_t4/neuralsort_n3 --seeds 0,1,2``):
their jobs run in the order given, every cell's seeds (and grid) in turn, the same overrides for all.

A CPU with c cores runs c one-thread jobs faster in total than one c-thread job of a small network (batch-4
steps do not split well over threads), and a job can be killed (a time limit, a lost login): every job trains in a
fixed folder ``<out>/<experiment>/<grid values>_seed<s>``, so running the same command again skips the finished
jobs (a ``results.json`` with ``status: done``), resumes the interrupted ones from their ``checkpoints/last.ckpt``
(exact resume, docs/experiments.md "Reproducibility") and starts the rest: the training runner's own decision for
a run folder (:func:`diffrank.experiments.records.folder.folder_state`, with the job's overrides: a folder finished
with other overrides, e.g. another ``-- model.optimizer.lr``, is not this job's), this module only launches. A folder
that a live run holds (its lock) is left alone. Jobs start in the order given, ``--slots`` at a time; each job's output
goes to ``<folder>/stdout.log``. SIGTERM / SIGINT to the runner are passed to its jobs (each records itself as
interrupted), and the runner exits with 128 + the signal. The first job's config is composed before anything
starts, so a typo in the experiment or an override fails at once; so do two jobs in one folder (a seed or grid value
given twice; a ``/`` in a grid value is a ``_`` in the folder name) and a grid key the runner sets per job or the
overrides after ``--`` set again (``--grid seed=…``: the seeds are ``--seeds``). When a job failed, the runner
names its last error line and exits with status 1.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
from pathlib import Path

from diffrank.benchmark import positive_int  # the benchmarks' argparse type: an integer >= 1
from diffrank.experiments.run.resolvers import split_top_level
from diffrank.experiments.tools.cells_queue import Job, run_queue

# the keys the runner sets for each job itself (why): never a --grid axis nor an override after --
PER_JOB_KEYS = {"seed": "--seeds", "experiment": "the experiments named on the command line",
                "hydra.run.dir": "the job's folder under --out", "ckpt_path": "the job folder's last checkpoint"}


def _key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` → ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def _folder_part(value: str) -> str:
    """A grid value as part of a job folder's name: one path component (a ``/`` in a path value would make
    folders inside folders, and a trailing one another folder for the same path)."""
    return re.sub(r"/+", "_", value.strip().strip("/")) or "_"


def jobs(experiment: str, seeds: list[int], grid: list[str], extra: list[str], out: Path) -> list[Job]:
    """The jobs of a cell: every combination of the ``grid`` values (``key=v1,v2``) × ``seeds``, in that order.

    Raises:
        ValueError: a grid entry without ``=``, key or values; a grid key that the jobs set themselves
            (:data:`PER_JOB_KEYS`: ``seed`` is ``--seeds``), twice, or again in ``extra`` (the later override would
            win in every job: the grid's jobs would all run the same); two jobs with one folder (a seed or grid
            value given twice; the message names them).
    """
    axes, keys = [], set()
    for entry in grid:
        key, sep, values = entry.partition("=")
        if not sep or not values or not _key(key):
            raise ValueError(f"--grid takes key=v1,v2,…; got '{entry}'")
        if _key(key) in PER_JOB_KEYS:
            raise ValueError(f"--grid {entry}: {_key(key)} is set for each job by the runner "
                             f"({PER_JOB_KEYS[_key(key)]}), not a grid axis")
        if _key(key) in keys:
            raise ValueError(f"--grid {entry}: {_key(key)} is already a grid axis (give its values in one --grid)")
        keys.add(_key(key))
        axes.append([(key, v) for v in split_values(values)])
    for override in extra:
        if _key(override) in PER_JOB_KEYS or _key(override) in keys:
            what = PER_JOB_KEYS.get(_key(override), "a --grid axis")
            raise ValueError(f"override '{override}' after --: {_key(override)} is set for each job ({what}); "
                             "given again it would override every job's value")
    out_jobs = []
    for combo in itertools.product(*axes):
        name = "_".join(f"{k.rsplit('.', 1)[-1]}{_folder_part(v)}" for k, v in combo)
        for seed in seeds:
            folder = out / experiment / (f"{name}_seed{seed}" if name else f"seed{seed}")
            overrides = [f"experiment={experiment}", *(f"{k}={v}" for k, v in combo), f"seed={seed}", *extra]
            out_jobs.append(Job(folder, overrides))
    check_folders(out_jobs)
    return out_jobs


def check_folders(queue: list[Job]) -> None:
    """Refuse a queue in which two jobs share a folder, or one job's folder is inside another's (each would be
    refused by the other's lock, or resume the other's run).

    Raises:
        ValueError: naming both jobs' overrides and the folder.
    """
    seen: dict[Path, Job] = {}
    for job in queue:
        folder = Path(os.path.normpath(job.folder))
        if folder in seen:
            other = seen[folder]
            raise ValueError(f"two jobs would run in one folder {job.folder}: '{' '.join(other.overrides)}' and "
                             f"'{' '.join(job.overrides)}' (a seed, grid value or experiment given twice?)")
        seen[folder] = job
    for folder, job in seen.items():
        for parent in folder.parents:
            if parent in seen:
                raise ValueError(f"job folder {job.folder} is inside job folder {seen[parent].folder}: "
                                 f"'{' '.join(job.overrides)}' and '{' '.join(seen[parent].overrides)}'")


def split_values(values: str) -> list[str]:
    """The values of a ``--grid`` entry: split at the commas outside brackets and quotes (``[.5,.5],[1,0]`` is two
    list values, as Hydra reads them).

    Raises:
        ValueError: unbalanced brackets or quotes, or an empty value.
    """
    try:
        out = split_top_level(values)
    except ValueError as e:
        raise ValueError(f"--grid values '{values}': {e}") from None
    if any(not v.strip() for v in out):
        raise ValueError(f"--grid values '{values}': an empty value")
    return out


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``; ``"0-4"`` is not accepted (say each seed).

    Raises:
        ValueError: a seed that is not an integer, or one given twice (the message names it).
    """
    seeds = []
    for part in text.split(","):
        if not re.fullmatch(r"\s*-?\d+\s*", part):
            raise ValueError(f"--seeds takes comma-separated integers (0,1,2); '{part}' is not one")
        if int(part) in seeds:
            raise ValueError(f"--seeds {text}: seed {int(part)} is given twice (its two jobs would share a folder)")
        seeds.append(int(part))
    return seeds


def check_composes(job: Job) -> None:
    """Compose ``job``'s training config (Hydra, with its overrides) before any job starts.

    Raises:
        ValueError: it does not compose (an unknown experiment, group option or key): Hydra's message, with the
            job's command line.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from diffrank.experiments.run.resolvers import register_resolvers
    from diffrank.registry import config_dir

    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            compose(config_name="train", overrides=job.overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's errors are many classes; its message says what is wrong
        raise ValueError(f"the first job does not compose ({' '.join(job.overrides)}): {e}") from None
    finally:
        GlobalHydra.instance().clear()


def main(argv: list[str] | None = None) -> dict[str, int]:
    """Command line: run (or continue) the seeds of one or more cells; see the module docstring.

    Raises:
        SystemExit: status 2 for bad arguments (a seed or grid value given twice, a grid key the jobs set, slots or
            threads below 1); status 1 after the queue when a job failed (each failed job's last error line is
            printed); 128 + the signal when stopped.
    """
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.tools.cells", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiments", nargs="+", metavar="experiment",
                    help="experiment configs, e.g. sorting/thesis_t3_5/bitonic_lambda04_n32_b4 (one queue)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--grid", action="append", default=[], help="key=v1,v2 (repeatable): values crossed with seeds")
    ap.add_argument("--slots", type=positive_int, default=max(1, os.cpu_count() or 1),
                    help="jobs at a time (default: cores)")
    ap.add_argument("--threads", type=positive_int, default=1, help="threads per job (default 1)")
    ap.add_argument("--out", type=Path, default=Path("outputs/cells"), help="root of the job folders")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs and their state, run nothing")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: Hydra overrides for every job
    argv, overrides = argv[:cut], argv[cut + 1:]
    a = ap.parse_args(argv)
    try:
        seeds = parse_seeds(a.seeds)
        per_experiment = [jobs(experiment, seeds, a.grid, overrides, a.out) for experiment in a.experiments]
        check_folders([job for js in per_experiment for job in js])  # an experiment named twice
        if not a.dry_run:  # a typo in any experiment fails here, before a job starts
            for first in (js[0] for js in per_experiment if js):
                check_composes(first)
    except ValueError as e:
        ap.error(str(e))
    queue = [job for js in per_experiment for job in js]
    if a.dry_run:
        for j in queue:
            print(f"{j.label():7s} {j.folder}  {' '.join(j.overrides)}")
        return {"jobs": len(queue)}
    failures: list[tuple[Path, str]] = []
    counts = run_queue(queue, a.slots, a.threads, failures=failures)
    print(f"{counts['finished']} finished, {counts['failed']} failed, {counts['skipped']} were already done"
          + (f", {counts['live']} held by live runs" if counts["live"] else "")
          + (f", {counts['other']} folders hold runs of other overrides (left alone)" if counts["other"] else ""))
    if failures:
        for folder, why in failures:
            print(f"failed: {folder / 'stdout.log'}: {why or '(no output)'}", file=sys.stderr)
        raise SystemExit(1)
    return counts


if __name__ == "__main__":
    main()
