"""Exact resumption: the random-number generators, the sampler position and the metric trackers in every checkpoint.

Lightning's checkpoints hold the weights, the optimiser, the schedulers and the loop counters, but not the
state of Python's ``random``, NumPy's global generator, torch's CPU and CUDA generators, where the training
sampler stood, nor the torchmetrics states (``MaxMetric`` behind ``val/top1_best``). :class:`ResumeState`
adds them under ``checkpoint["diffrank_resume"]`` and puts them back when ``trainer.fit(ckpt_path=…)`` starts
training again, so that a resumed run continues with the same draws (dropout, shuffling) as the run that
wrote the checkpoint.

Order of restoration in the resumed run: the sanity-check validation and the module's ``on_train_start``
run first (they draw or reset things the uninterrupted run did not), then the generators are set
(``on_train_start``, before any training batch is drawn) and the metric states restored (at the first
training batch, after the module's ``on_train_start`` has reset its trackers).

The sampler position: samplers that implement ``set_start(items)`` (``diffrank.experiments.data``'s training samplers,
whose order is a pure function of ``(seed, epoch)``) skip what the interrupted epoch had already consumed,
so checkpoints written in the middle of an epoch (``val_check_interval`` protocols) resume exactly too.
Under DDP Lightning wraps the sampler (``DistributedSamplerWrapper``): the skip is not applied, and a wrapped
sampler is read when the iterator is created, before Lightning sets the resumed epoch; exact resume is for
single-process runs.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

KEY = "diffrank_resume"


def rng_states() -> dict[str, Any]:
    """The states of Python's ``random``, NumPy's global generator, torch's CPU generator and every CUDA device's."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_states(states: dict[str, Any]) -> None:
    """Set the generators from :func:`rng_states`'s output (CUDA states only when the device count matches)."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"].cpu())
    cuda = states.get("cuda") or []
    if cuda and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
        else:
            rank_zero_warn(f"checkpoint has CUDA RNG states of {len(cuda)} devices, this run has "
                           f"{torch.cuda.device_count()}: CUDA generators not restored")


def _metrics(module: torch.nn.Module) -> dict[str, Any]:
    from torchmetrics import Metric

    return {name: m for name, m in module.named_modules() if isinstance(m, Metric)}


def metric_states(module: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """The accumulated states of the torchmetrics objects in ``module`` (they are not in its ``state_dict``)."""
    out = {}
    for name, m in _metrics(module).items():
        state = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else [t.detach().clone() for t in v])
                 for k, v in m.metric_state.items()}
        out[name] = {"state": state, "update_count": m._update_count}
    return out


def set_metric_states(module: torch.nn.Module, states: dict[str, dict[str, Any]]) -> None:
    """Put :func:`metric_states`'s output back into the metrics of ``module`` (matched by name)."""
    metrics = _metrics(module)
    for name, saved in states.items():
        m = metrics.get(name)
        if m is None:
            continue
        for k, v in saved["state"].items():
            if isinstance(v, torch.Tensor):
                v = v.to(m.device)
            else:
                v = [t.to(m.device) for t in v]
            setattr(m, k, v)
        m._update_count = saved["update_count"]
        m._computed = None


def train_samplers(trainer: L.Trainer) -> list[tuple[Any, int]]:
    """``(sampler, items per batch)`` of the training dataloaders whose samplers accept ``set_start``."""
    loader = trainer.fit_loop._combined_loader
    out = []
    for dl in (loader.flattened if loader is not None else []):
        for sampler, per_batch in ((getattr(getattr(dl, "batch_sampler", None), "sampler", None),
                                    getattr(dl, "batch_size", None) or 1), (getattr(dl, "sampler", None), 1)):
            if sampler is not None and callable(getattr(sampler, "set_start", None)):
                out.append((sampler, per_batch))
                break
    return out


class ResumeState(L.Callback):
    """Saves and restores what Lightning's checkpoints leave out (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None
        self._pending_metrics: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Add the generators, the position in the epoch and the metric states to ``checkpoint``."""
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        checkpoint[KEY] = {"rng": rng_states(), "epoch": trainer.current_epoch, "batches": progress.processed,
                           "metrics": metric_states(pl_module)}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Keep the saved state for :meth:`on_train_start` (``fit(ckpt_path=…)`` only)."""
        self._pending = checkpoint.get(KEY)
        if self._pending is None:
            rank_zero_warn("the checkpoint holds no random-number-generator or sampler state (written before "
                           "diffrank.experiments.callbacks.ResumeState): the resumed run will not repeat the "
                           "original's draws")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Skip the consumed part of an interrupted epoch and set the generators as they were at the save."""
        state, self._pending = self._pending, None
        if state is None:
            return
        batches = int(state.get("batches", 0))
        if state.get("epoch") == trainer.current_epoch and 0 < batches < trainer.num_training_batches:
            samplers = train_samplers(trainer)
            for sampler, per_batch in samplers:
                sampler.set_start(batches * per_batch)
            if samplers:  # not a process-wide filter: a library callback leaves the user's warnings alone
                rank_zero_info(f"resuming after batch {batches} of epoch {trainer.current_epoch}: the samplers skip "
                               "the consumed batches, so Lightning's warning about resuming mid-epoch does not apply")
            else:
                rank_zero_warn(f"resuming in the middle of epoch {trainer.current_epoch} with a sampler that "
                               "cannot skip ahead: the rest of the epoch will not repeat the original's batches")
        set_rng_states(state["rng"])
        self._pending_metrics = state.get("metrics")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        """Restore the metric trackers once, after the module's ``on_train_start`` reset them."""
        if self._pending_metrics is not None:
            set_metric_states(pl_module, self._pending_metrics)
            self._pending_metrics = None
