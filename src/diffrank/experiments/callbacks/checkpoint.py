"""Checkpoint selection with a tie rule, ``last.ckpt`` after every validation, and atomic checkpoint files.

:class:`ModelCheckpoint` is Lightning's callback with three changes:

- **Ties.** Validation accuracies on a finite set move in steps (1 / 2 000 on digits100), so two epochs
  often tie. Lightning keeps the first; ``ties="later"`` (our default) keeps the later one: on a tie the
  newer checkpoint replaces the older as "best" (and, with ``save_top_k > 1``, the older tied one is the
  first to be dropped). ``ties="earlier"`` is Lightning's rule.
- **last.ckpt** (``save_last=True``) is written after every validation (every epoch, or every
  ``val_check_interval`` steps) and at the end of every training epoch, whether or not the monitored
  metric improved; Lightning writes it only when a top-k checkpoint is saved, so a killed run lost
  everything since its last best.
- **Resuming in a new run folder** keeps the best-so-far (score and path): Lightning forgets it when the
  checkpoint folder changes, and a resumed run would then call its first epoch the best. The earlier run's
  files are never deleted (they lie outside this run's checkpoint folder).

:class:`AtomicCheckpointIO` writes each checkpoint to a temporary file in the target folder, flushes it to
disk and renames it over the target, so a checkpoint file is always either the old or the new one, whole.
(Lightning's own writer stages the file in the system temp folder and *moves* it, which is a copy when
that folder lies on another file system.)
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from diffrank.experiments.records.disk import no_space_error

TIE_RULES = ("later", "earlier")


class ModelCheckpoint(L.pytorch.callbacks.ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` with a tie rule and a ``last.ckpt`` that is always the latest state.

    Args:
        ties: ``"later"`` (default): a checkpoint whose monitored value equals the best so far becomes the
            best (the later epoch / step wins a tie); ``"earlier"``: the first one stays (Lightning's rule).
        *args, **kwargs: as ``lightning.pytorch.callbacks.ModelCheckpoint``.

    Raises:
        ValueError: unknown ``ties``.
    """

    def __init__(self, *args: Any, ties: str = "later", **kwargs: Any) -> None:
        if ties not in TIE_RULES:
            raise ValueError(f"ties must be one of {TIE_RULES}, got {ties!r}")
        super().__init__(*args, **kwargs)
        self.ties = ties

    # --- the tie rule -------------------------------------------------------------------------------------
    def check_monitor_top_k(self, trainer: L.Trainer, current: Tensor | None = None) -> bool:
        """Whether ``current`` enters the top k; with ``ties="later"`` a tie with the k-th best does."""
        if self.ties == "earlier" or current is None or self.save_top_k == -1 \
                or len(self.best_k_models) < self.save_top_k:
            return super().check_monitor_top_k(trainer, current)
        op = {"min": torch.le, "max": torch.ge}[self.mode]
        decision = bool(op(current, self.best_k_models[self.kth_best_model_path]))
        return trainer.strategy.reduce_boolean_decision(decision)

    def _ranked(self, best: bool) -> str:
        """The best (``best=True``) or the worst kept path; among equal scores the later is the better one."""
        paths = list(self.best_k_models)  # insertion order = the order in which they were saved
        if best:
            paths.reverse()  # max / min return the first of equals: the latest for "best"
        sign = 1.0 if (self.mode == "max") == best else -1.0
        return max(paths, key=lambda p: sign * float(self.best_k_models[p]))

    def _update_best_and_save(self, current: Tensor, trainer: L.Trainer,
                              monitor_candidates: dict[str, Tensor]) -> None:
        if self.ties == "earlier":
            return super()._update_best_and_save(current, trainer, monitor_candidates)
        # Lightning's method, with the best / worst chosen by _ranked (later wins a tie)
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        del_filepath = None
        if len(self.best_k_models) == k and k > 0:
            del_filepath = self.kth_best_model_path
            self.best_k_models.pop(del_filepath)
        if isinstance(current, Tensor) and torch.isnan(current):
            current = torch.tensor(float("inf" if self.mode == "min" else "-inf"), device=current.device)
        filepath = self._get_metric_interpolated_filepath_name(monitor_candidates, trainer, del_filepath)
        self.current_score = current
        self.best_k_models[filepath] = current
        if len(self.best_k_models) == k:
            self.kth_best_model_path = self._ranked(best=False)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = self._ranked(best=True)
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose:
            epoch, step = int(monitor_candidates["epoch"]), int(monitor_candidates["step"])
            rank_zero_info(f"Epoch {epoch:d}, global step {step:d}: {self.monitor!r} reached {float(current):0.5f}"
                           f" (best {float(self.best_model_score):0.5f}), saving model to {filepath!r} as top {k}")
        self._save_checkpoint(trainer, filepath)
        if del_filepath and self._should_remove_checkpoint(trainer, del_filepath, filepath):
            self._remove_checkpoint(trainer, del_filepath)

    # --- last.ckpt after every validation and every training epoch ------------------------------------------
    def _refresh_last(self, trainer: L.Trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning's top-k save, then ``last.ckpt`` if this step has not been saved yet."""
        super().on_train_epoch_end(trainer, pl_module)
        self._refresh_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning's top-k save, then ``last.ckpt`` (unless the save is due at the training epoch's end)."""
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)

    # --- resuming in another folder keeps the best so far ---------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the best-so-far (scores and paths) also when the checkpoint came from another folder, and the
        last monitored value (``current_score``: a run resumed after its last validation reports it)."""
        if self.dirpath is not None and state_dict.get("dirpath", self.dirpath) != self.dirpath:
            rank_zero_info(f"resuming in {self.dirpath}: best so far {state_dict.get('best_model_path')!r} "
                           f"({state_dict.get('best_model_score')}) from {state_dict.get('dirpath')}")
            state_dict = {**state_dict, "dirpath": self.dirpath}
        super().load_state_dict(state_dict)
        self.current_score = state_dict.get("current_score", self.current_score)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to a temporary file beside the target, ``fsync``, then ``os.replace`` onto the target.

    A run killed while saving leaves the previous checkpoint intact (and at most a ``.*.tmp`` file). Remote
    paths (``s3://`` …) go through Lightning's writer.

    Raises:
        OSError: (errno ENOSPC) the disk is full; the message names the checkpoint (torch's own error says
            ``unexpected pos …``).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (local files)."""
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:
            # torch's writer reports a full disk as "unexpected pos …" (ENOSPC only in the chained cause)
            if no_space_error(e) is not None:
                raise OSError(errno.ENOSPC, f"no space left on device writing checkpoint {path} "
                                            f"(torch: {str(e).splitlines()[0][:200]})", str(path)) from e
            raise
        finally:
            tmp.unlink(missing_ok=True)

