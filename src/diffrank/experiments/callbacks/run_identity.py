"""What a checkpoint was trained with, so that resuming or evaluating it with other choices is refused.

Every checkpoint of a run carries, under :data:`KEY`, the run's identity (:func:`run_identity`): the config
groups it used (operator, P_K, loss, model, net, data, …), the resolved ``model``, ``loss`` and ``newton`` configs
(λ included), and the
data config without the keys that only say where or how the data loads. Before ``ckpt_path`` is resumed
(``train=true``) or evaluated (``train=false``), :func:`check_checkpoint` compares that identity with the
current run's: a resume differing in anything refuses, an evaluation differing in the data (another
``data.split_seed``: another test set) or the model refuses, unless ``+resume_with_changes=true`` is given,
and then the differences are recorded in ``results.json`` (``resumed_with_changes``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

KEY = "diffrank_run"
# config groups that say how a run is executed or logged, not what it trains
EXECUTION_GROUPS = frozenset({"callbacks", "logger", "trainer", "paths", "extras", "hparams_search", "local", "debug",
                              "experiment"})
# data keys that say where the data lives or how fast it loads, not which data it is
LOADING_KEYS = frozenset({"data_dir", "root", "download", "num_workers", "pin_memory", "persistent_workers",
                          "device_resident", "eval_batch_size", "cache_dir"})
# data keys that shape training only: an evaluation may differ in them
TRAINING_ONLY_KEYS = frozenset({"data.seed", "data.batch_size"})


def _container(node: Any) -> Any:
    if not isinstance(node, DictConfig):
        return node
    try:
        return OmegaConf.to_container(node, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation needing HydraConfig: the unresolved form still identifies
        return OmegaConf.to_container(node, resolve=False)


def run_identity(cfg: DictConfig, choices: dict[str, Any]) -> dict[str, Any]:
    """The identity of a run as :data:`KEY` stores it in its checkpoints (JSON-like; no tensors).

    Args:
        cfg: the run's composed config (after :func:`~diffrank.experiments.run.composition.drop_unused_groups`).
        choices: the config groups the run used (group → option).

    Returns:
        ``{"choices": {group: option}, "model": …, "loss": …, "newton": …, "data": …}``: the model-relevant
        choices, the resolved ``model`` / ``loss`` / ``newton`` configs and the data config without
        :data:`LOADING_KEYS`.
    """
    data = _container(cfg.get("data"))
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in LOADING_KEYS}
    return {"choices": {g: v for g, v in sorted(choices.items()) if g not in EXECUTION_GROUPS and v is not None},
            "model": _container(cfg.get("model")), "loss": _container(cfg.get("loss")),
            "newton": _container(cfg.get("newton")), "data": data}


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    if isinstance(node, dict):
        flat: dict[str, Any] = {}
        for k, v in node.items():
            flat.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return flat
    return {prefix: node}


def differences(saved: dict[str, Any], current: dict[str, Any], evaluation: bool = False) -> list[str]:
    """``"key: saved → current"`` for every leaf where two identities differ (sorted by key); for an
    ``evaluation`` the training-only data keys (:data:`TRAINING_ONLY_KEYS`) do not count."""
    a, b = _flatten(saved, ""), _flatten(current, "")
    keys = sorted(set(a) | set(b))
    if evaluation:
        keys = [k for k in keys if k not in TRAINING_ONLY_KEYS]
    missing = "<unset>"
    return [f"{k}: {a.get(k, missing)!r} → {b.get(k, missing)!r}" for k in keys
            if a.get(k, missing) != b.get(k, missing)]


def check_checkpoint(path: str | Path, identity: dict[str, Any], *, evaluation: bool, allow_changes: bool) -> list[str]:
    """Compare the identity stored in checkpoint ``path`` with the current run's before resuming or evaluating it.

    Args:
        path: a Lightning checkpoint file.
        identity: the current run's :func:`run_identity`.
        evaluation: ``train=false`` (only the model and the evaluation data must match).
        allow_changes: ``+resume_with_changes=true``: log the differences instead of raising.

    Returns:
        The differences (:func:`differences`); empty when they match or the checkpoint holds no identity
        (written before this callback existed: a warning says it cannot be checked).

    Raises:
        ValueError: the identities differ and ``allow_changes`` is false (the message lists the keys).
    """
    saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True).get(KEY)
    if saved is None:
        log.warning("%s holds no run identity (written before diffrank.experiments.callbacks.RunIdentity): "
                    "cannot check that it was trained with this run's choices", path)
        return []
    diff = differences(saved, identity, evaluation)
    if not diff:
        return []
    what = "evaluated" if evaluation else "resumed"
    listing = "\n  ".join(diff[:30]) + ("" if len(diff) <= 30 else f"\n  … {len(diff) - 30} more")
    if not allow_changes:
        raise ValueError(f"ckpt_path={path} was trained with other choices than this run; it would be {what} as if "
                         f"they were the same:\n  {listing}\nRepeat the checkpoint's choices (its run folder's "
                         f".hydra/overrides.yaml), or pass +resume_with_changes=true to go on anyway (recorded in "
                         f"results.json)")
    log.warning("+resume_with_changes=true: %s %s with other choices:\n  %s", what, path, listing)
    return diff


class RunIdentity(L.Callback):
    """Writes the run's :func:`run_identity` into every checkpoint under :data:`KEY`.

    Args:
        identity: the run's identity (JSON-like).
    """

    def __init__(self, identity: dict[str, Any]) -> None:
        self.identity = identity

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Add the identity to ``checkpoint``."""
        checkpoint[KEY] = self.identity
