"""Hydra callbacks (``hydra.callbacks`` in ``configs/hydra/default.yaml``): a multirun ends in an answer, and a
single run never starts in another run's folder (:class:`RunFolderGuard`).

:class:`SweepSummary`:

- ``on_multirun_start``: creates the sweep folder (an Optuna ``sqlite:///<sweep dir>/optuna.db`` storage must
  be openable before the first job starts) and, for an Optuna search whose study already exists there (a
  stopped search run again into the same ``hydra.sweep.dir``), lowers ``hydra.sweeper.n_trials`` by the trials
  the study has finished, so that ``n_trials`` stays the size of the whole search (the sweeper itself would run
  ``n_trials`` more);
- ``on_multirun_end``: :func:`diffrank.experiments.analysis.sweep_summary.summarize` (``sweep_summary.csv``,
  ``sweep.png``, ``best.yaml``),
  prints the best configuration, and with a W&B logger logs the plot, the summary table and the best
  configuration as one W&B run of job type ``sweep`` in the sweep's group.

Hydra calls ``on_multirun_end`` only when every job succeeded (a failed job makes the sweeper raise at the end):
from the first failed job on, ``on_job_end`` writes the summary after every job instead (the failed jobs listed
with their errors). A job stopped by SIGTERM / SIGINT / SIGHUP
(:class:`RunInterrupted`, raised by the training runner) ends the process there, after the summary, with exit
status 128 + the signal (a single run too). ``python -m diffrank.experiments.analysis.sweep_summary SWEEP_DIR``
writes the same files at any time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

log = logging.getLogger(__name__)

OPTUNA_FINISHED_STATES = ("COMPLETE", "PRUNED", "FAIL")


class RunInterrupted(Exception):
    """A run stopped by a signal (SIGTERM: ``kill``, ``timeout``, a scheduler's preemption; SIGINT: Ctrl-C; SIGHUP: a
    closed terminal or ssh connection) after its record (``status: interrupted``, with the resume command) was
    written. The training runner raises it, the multirun summary (:class:`SweepSummary`) lists the job, and the
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
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP)."""
        return 128 + self.signum


def optuna_finished_trials(storage: str, study_name: str) -> int:
    """Trials of an Optuna study in ``storage`` that finished (complete, pruned or failed); 0 when the study or
    its sqlite file does not exist. A trial left running by a killed search does not count (it is run again)."""
    import optuna

    if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).is_file():
        return 0
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # no such study in the storage yet
        return 0
    return sum(t.state.name in OPTUNA_FINISHED_STATES for t in study.trials)


class RunFolderGuard(Callback):
    """Refuse a single run into a folder that a live run holds, that holds another run's results, or that this
    process cannot write, before Hydra writes its ``.hydra/`` files there (the training runner refuses it too, but
    only after Hydra has replaced the other run's ``.hydra/config.yaml`` and ``overrides.yaml``): the checks of
    :func:`~diffrank.experiments.records.folder.refuse_other_run` and
    :func:`~diffrank.experiments.records.folder.check_writable`. A SLURM requeue
    (``SLURM_RESTART_COUNT`` > 0) resumes its own folder and passes, and so does a DDP worker process of the run
    (``LOCAL_RANK`` / ``NODE_RANK`` > 0: Lightning starts it with the run's own ``hydra.run.dir``).

    The folder's lock taken for the check is kept and handed to the training runner
    (:meth:`~diffrank.experiments.records.folder.FolderLock.hand_over`), which holds it to the end of the run: a
    second run started while this one is between the check and its first step is refused by the check, instead of
    passing it and replacing this run's ``.hydra/`` files. :meth:`on_run_end` drops it if the runner never took it.

    A single run that fails for a reason a traceback does not help with (a full disk, an unwritable or taken
    folder, a refused ``ckpt_path``) ends with its message alone (:meth:`on_job_end`, :func:`one_line_error`).

    Raises:
        SystemExit: (``on_run_start``) the folder is another run's, or not writable (the message says whose or
            which and what to do); (``on_job_end``) a single run failed as above. Not
            :class:`~diffrank.experiments.records.folder.FolderTaken` itself: Hydra turns an ``Exception`` raised by
            a callback into a warning and goes on.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.run.dir`` before the run writes there, and keep its lock for the run."""
        import os

        from diffrank.experiments.records.folder import (
            FolderBusy,
            FolderLock,
            FolderNotWritable,
            FolderTaken,
            refuse_other_run,
        )

        if int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0:
            return
        if os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0":
            return  # a DDP worker started by the run itself (same hydra.run.dir): the main process holds the lock
        folder = Path(str(config.hydra.run.dir))
        lock = FolderLock.handed_over(folder)  # this process checked it already (and holds it)
        try:
            if lock is None:
                lock = FolderLock(folder).acquire()  # FolderBusy names the live run's process
            refuse_other_run(folder, config.get("ckpt_path"), None)
        except (FolderBusy, FolderTaken, FolderNotWritable) as e:
            if lock is not None:
                lock.release()
            log.error("%s", e)
            raise SystemExit(f"refused: {e}") from None
        lock.hand_over()  # the runner holds it from here to the end of the run

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Drop the folder's lock if the runner never took it over (it releases what it takes)."""
        from diffrank.experiments.records.folder import FolderLock

        lock = FolderLock.take_over(Path(str(config.hydra.run.dir)))
        if lock is not None:
            lock.release()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """A single run that failed with a full disk, a folder it may not write or a refused ``ckpt_path`` ends the
        process with the error's message (status 1) instead of Hydra's traceback; other failures, and multirun
        jobs, are left to Hydra."""
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        hydra_cfg = config.get("hydra") or {}
        if hydra_cfg.get("mode") == RunMode.MULTIRUN or getattr(job_return, "status", None) != JobStatus.FAILED:
            return
        message = one_line_error(getattr(job_return, "_return_value", None))
        if message:  # the runner logged it (a full disk with the resume command)
            raise SystemExit(f"error: {message}")


def one_line_error(error: BaseException | None) -> str | None:
    """The message of a failure that a traceback does not help with: a full disk (ENOSPC anywhere in ``error``'s
    chain of causes, with the file being written when known), a run folder that is taken, busy or not writable, or
    a refused command-line value (``ckpt_path``: missing, a folder, unreadable, another run's settings; marked
    :data:`~diffrank.experiments.callbacks.run_identity.REFUSED_KEY`); None for any other error (a traceback helps
    there)."""
    from diffrank.experiments.callbacks.run_identity import REFUSED_KEY
    from diffrank.experiments.records.disk import describe_no_space
    from diffrank.experiments.records.folder import FolderBusy, FolderNotWritable, FolderTaken

    if error is None:
        return None
    if isinstance(error, (FolderBusy, FolderTaken, FolderNotWritable)) or getattr(error, REFUSED_KEY, None):
        return str(error)
    return describe_no_space(error)


def swept_keys(config: DictConfig) -> list[str]:
    """The keys a multirun varies: command-line overrides with a sweep (``operator.beta=0.25,1,4``,
    ``seed=range(3)``) and the sweeper's ``params`` (``hparams_search`` configs), in that order.

    Args:
        config: the multirun's composed config (with its ``hydra`` node, as Hydra's callbacks get it).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys: list[str] = []
    task = [str(o) for o in ((config.hydra.get("overrides") or {}).get("task") or [])]
    try:
        parsed = OverridesParser.create().parse_overrides(task)
    except Exception:  # Hydra itself reports a malformed override; the folder names just keep Hydra's order
        parsed = []
    keys += [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]
    params = (config.hydra.get("sweeper") or {}).get("params") or {}
    keys += [str(k) for k in params]
    return list(dict.fromkeys(keys))


def _uses_wandb(config: DictConfig) -> bool:
    loggers = config.get("logger") or {}
    return any(isinstance(c, DictConfig) and str(c.get("_target_", "")).endswith("WandbLogger")
               for c in loggers.values())


class SweepSummary(Callback):
    """Summary, plot and best configuration of every multirun; Optuna searches resume to their total.

    Args:
        metric: the metric to optimise (default: the jobs' ``optimized_metric``).
        mode: ``max`` / ``min`` (default: the jobs' ``optimized_mode``).
        wandb: log the summary to W&B when the run config has a W&B logger (default true).
    """

    def __init__(self, metric: str | None = None, mode: str | None = None, wandb: bool = True) -> None:
        self.metric, self.mode, self.wandb = metric, mode, bool(wandb)
        self._failed = False  # a job of this sweep failed: Hydra will skip on_multirun_end

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """Once a job of a multirun has failed, write the summary after it and after every later job: Hydra then
        raises at the end of the sweep instead of calling :meth:`on_multirun_end`."""
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        hydra_cfg = config.get("hydra") or {}
        value = getattr(job_return, "_return_value", None)
        interrupted = value if isinstance(value, RunInterrupted) else None
        if hydra_cfg.get("mode") == RunMode.MULTIRUN:
            self._failed = self._failed or getattr(job_return, "status", None) == JobStatus.FAILED
            if self._failed:
                note = "interrupted" if interrupted else "a job failed"
                self._summarize(Path(str(hydra_cfg.sweep.dir)), note=f"{note}; summary of the jobs so far")
        if interrupted is not None:  # stop here (a sweep starts no further job), as a death by that signal would
            log.error("%s", interrupted)
            raise SystemExit(interrupted.exit_code)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Create the sweep folder (one line and exit status 1 when it cannot be created or written); name the
        swept keys for the job folders
        (:func:`~diffrank.experiments.run.resolvers.job_dir_name`); shorten a resumed Optuna search to the trials
        it still lacks."""
        import os

        from diffrank.experiments.callbacks.job_env import SMOKE_ENV, SMOKE_OPTUNA_TRIALS, SWEPT_KEYS_ENV, smoke_budget
        from diffrank.experiments.records.folder import FolderNotWritable, check_writable

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            check_writable(sweep_dir, "hydra.sweep.dir")
        except OSError as e:  # Hydra would turn it into a warning, then fail creating the first job's folder
            error = e if isinstance(e, FolderNotWritable) else FolderNotWritable(sweep_dir, e, "hydra.sweep.dir")
            raise SystemExit(f"refused: {error}") from None
        # an environment variable reaches the jobs of every launcher (in process, joblib, submitit, SLURM)
        os.environ[SWEPT_KEYS_ENV] = ",".join(swept_keys(config))
        sweeper = config.hydra.get("sweeper") or {}
        storage, study = sweeper.get("storage"), sweeper.get("study_name")
        if not (storage and study and "n_trials" in sweeper):
            return
        total = int(sweeper.n_trials)
        if smoke_budget() and total > SMOKE_OPTUNA_TRIALS:
            total = SMOKE_OPTUNA_TRIALS
            with read_write(config.hydra.sweeper):
                config.hydra.sweeper.n_trials = total
            log.info("%s=1: smoke budget, the Optuna search runs %d trials", SMOKE_ENV, total)
        done = optuna_finished_trials(str(storage), str(study))
        if done:
            with read_write(config.hydra.sweeper):  # Hydra's config is read-only; the sweeper is built after this
                config.hydra.sweeper.n_trials = max(0, total - done)
            log.info("Optuna study %s in %s has %d finished trials: running %d more (n_trials=%d in all)",
                     study, storage, done, max(0, total - done), total)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the summary files of the sweep folder and report the best configuration."""
        summary = self._summarize(Path(str(config.hydra.sweep.dir)))
        if summary and self.wandb and _uses_wandb(config):
            try:
                log_sweep_to_wandb(config, summary)
            except Exception:
                log.exception("could not log the sweep summary to W&B")


    def _summarize(self, sweep_dir: Path, note: str = "") -> dict[str, Any] | None:
        from diffrank.experiments.analysis.sweep_summary import format_report, summarize

        try:
            summary = summarize(sweep_dir, self.metric, self.mode)
        except Exception:  # a summary must never turn a finished sweep into a failed command
            log.exception("sweep summary of %s failed; run python -m diffrank.experiments.analysis.sweep_summary %s",
                          sweep_dir, sweep_dir)
            return None
        log.info("%s%s", f"{note}:\n" if note else "", format_report(summary))
        return summary


def log_sweep_to_wandb(config: DictConfig, summary: dict[str, Any]) -> None:
    """One W&B run (job type ``sweep``, in the sweep's group, offline unless an API key is configured) holding
    ``sweep.png``, the summary table and the best configuration; always finished."""
    import pandas as pd
    import wandb

    from diffrank.experiments.callbacks.loggers import wandb_group, wandb_offline_default

    wcfg = next(c for c in config.logger.values() if str(c.get("_target_", "")).endswith("WandbLogger"))
    sweep_dir = Path(summary["sweep_dir"])
    paper = OmegaConf.to_container(config.paper, resolve=True) if isinstance(config.get("paper"), DictConfig) \
        else None
    offline = wandb_offline_default(wcfg.get("offline"))
    run = wandb.init(project=wcfg.get("project"), group=wandb_group(paper, sweep_dir.name, config.get("task_name")),
                     job_type="sweep", name=f"sweep-{sweep_dir.name}", dir=str(sweep_dir),
                     mode="offline" if offline else None,
                     config={"sweep_dir": str(sweep_dir), "metric": summary["metric"], "mode": summary["mode"],
                             "swept_keys": summary["keys"]})
    try:
        png = summary["files"].get("png")
        if png:
            run.log({"sweep_plot": wandb.Image(str(png))})
        csv_path = summary["files"].get("csv")
        if csv_path:
            run.log({"sweep_summary": wandb.Table(dataframe=pd.read_csv(csv_path, dtype=str).fillna(""))})
        best = summary.get("best")
        if best:
            run.summary["best/value"] = best["best"]["mean"]
            for k, v in best["best"]["overrides"].items():
                run.summary[f"best/{k}"] = v
    finally:
        run.finish()


__all__ = ["RunFolderGuard", "RunInterrupted", "SweepSummary", "log_sweep_to_wandb", "one_line_error",
           "optuna_finished_trials"]
