"""Lightning callbacks and plugins for reproducible runs: checkpoint selection with a tie rule, ``last.ckpt``
after every validation, atomic checkpoint files, and the state that exact resumption needs."""

from diffrank.callbacks.checkpoint import AtomicCheckpointIO, ModelCheckpoint
from diffrank.callbacks.resume import ResumeState

__all__ = ["AtomicCheckpointIO", "ModelCheckpoint", "ResumeState"]
