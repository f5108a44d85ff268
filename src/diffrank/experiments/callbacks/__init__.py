"""Lightning callbacks and plugins for reproducible runs: checkpoint selection with a tie rule, ``last.ckpt``
after every validation, atomic checkpoint files, the state that exact resumption needs, the choices a checkpoint
was trained with (and the run's id and segments), a divergence guard, a run-time estimate printed early in a run;
the loggers a run builds (:mod:`diffrank.experiments.callbacks.loggers`); the environment a sweep hands its jobs
(:mod:`diffrank.experiments.callbacks.job_env`); and the Hydra callback that ends every multirun in a summary
(:class:`diffrank.experiments.callbacks.hydra_callbacks.SweepSummary`)."""

from diffrank.experiments.callbacks.checkpoint import AtomicCheckpointIO, ModelCheckpoint
from diffrank.experiments.callbacks.divergence import DivergenceGuard
from diffrank.experiments.callbacks.hydra_callbacks import SweepSummary
from diffrank.experiments.callbacks.resume import ResumeState
from diffrank.experiments.callbacks.run_identity import RunIdentity
from diffrank.experiments.callbacks.run_time import RunTimeEstimate

__all__ = ["AtomicCheckpointIO", "DivergenceGuard", "ModelCheckpoint", "ResumeState", "RunIdentity", "RunTimeEstimate",
           "SweepSummary"]
