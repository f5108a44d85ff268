"""What a checkpoint was trained with, so that resuming or evaluating it with other choices is refused.

Every checkpoint of a run carries, under :data:`KEY`, the run's identity (:func:`run_identity`): the config
groups it used (operator, P_K, loss, model, net, data, …), the resolved ``model``, ``loss`` and ``newton`` configs
(λ included), and the
data config without the keys that only say where or how the data loads. Before ``ckpt_path`` is resumed
(``train=true``) or evaluated (``train=false``), :func:`check_checkpoint` compares that identity with the
current run's: a resume differing in anything refuses, an evaluation differing in the data (another
``data.split_seed``: another test set) or the model refuses, unless ``+resume_with_changes=true`` is given,
and then the differences are recorded in ``results.json`` (``resumed_with_changes``).

Beside it, under :data:`META_KEY`, every checkpoint carries the run's id, its config hash and its segments (one per
start or resume: the step it started at, the code version, and the settings that change the budget: accumulated
batches, global batch, the precision the trainer used). A resume keeps the run id (:func:`read_checkpoint` reads it)
and :func:`check_segment` compares the settings: another code version is warned about (and recorded per segment),
another budget setting is refused unless ``+resume_with_changes=true``.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from diffrank.experiments.records.record import LOADING_KEYS, NOT_THE_CONFIG, code_version, config_hash

log = logging.getLogger(__name__)

KEY = "diffrank_run"
META_KEY = "diffrank_run_meta"  # {"run_id", "config_hash", "segments": [...]}
# segment settings that change what a step is: a resume with another value trains another budget
BUDGET_SETTINGS = ("accumulate_grad_batches", "global_batch", "precision")
# config groups that say how a run is executed or logged, not what it trains
EXECUTION_GROUPS = frozenset({"callbacks", "logger", "trainer", "paths", "extras", "hparams_search", "local", "debug",
                              "experiment"})
# data keys that shape training only: an evaluation may differ in them
TRAINING_ONLY_KEYS = frozenset({"data.seed", "data.batch_size"})


def _container(node: Any) -> Any:
    if not isinstance(node, (DictConfig, ListConfig)):
        return node
    try:
        return OmegaConf.to_container(node, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation needing HydraConfig: the unresolved form still identifies
        return OmegaConf.to_container(node, resolve=False)


def resolved_config_hash(cfg: DictConfig) -> str:
    """:func:`~diffrank.experiments.records.record.config_hash` of ``cfg`` resolved key by key (a key whose
    interpolation needs what is not there, e.g. ``HydraConfig``, enters unresolved)."""
    return config_hash({str(k): _container(cfg.get(k)) for k in cfg if k not in NOT_THE_CONFIG})


#: the attribute that marks an error as the refusal of a command-line value (set to the key, e.g. ``ckpt_path``):
#: its message names the value and what to give instead, so a single run reports it in one line, not a traceback
#: (:func:`~diffrank.experiments.callbacks.hydra_callbacks.one_line_error`)
REFUSED_KEY = "diffrank_refused_key"


def _refused(error: Exception, key: str = "ckpt_path") -> Exception:
    setattr(error, REFUSED_KEY, key)
    return error


def _checkpoint_file(path: str | Path) -> Path:
    """``path`` when it names an existing, readable file; the checks of ``ckpt_path`` that need no loading."""
    if not str(path).strip():
        raise _refused(ValueError("ckpt_path is empty: give a checkpoint file (<run>/checkpoints/last.ckpt), or "
                                  "leave ckpt_path out (null) to start a new run"))
    path = Path(path)
    if path.is_dir():
        from diffrank.experiments.records.folder import resume_checkpoint

        inside = resume_checkpoint(path) or (path / "last.ckpt" if (path / "last.ckpt").is_file() else None)
        give = f"ckpt_path={inside}" if inside is not None else "a <run>/checkpoints/*.ckpt file"
        raise _refused(IsADirectoryError(f"ckpt_path={path} is a folder, not a checkpoint file: give {give}"))
    if not path.is_file():
        raise _refused(FileNotFoundError(f"ckpt_path={path}: no such checkpoint file"))
    try:
        with open(path, "rb"):
            pass
    except PermissionError as e:
        raise _refused(PermissionError(e.errno, f"ckpt_path={path} cannot be read ({e.strerror})")) from None
    return path


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The contents of checkpoint ``path`` (memory-mapped: tensors are read when used).

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a folder (the message names the checkpoint in it to give, when there is one).
        PermissionError: the file cannot be read.
        ValueError: an empty ``path`` (``ckpt_path=``), or a file that is not a readable checkpoint (truncated,
            corrupted, or not a ``torch.save`` of a Lightning checkpoint dict); the message names the file and the
            cause.

    Each is marked as the refusal of ``ckpt_path`` (:data:`REFUSED_KEY`).
    """
    path = _checkpoint_file(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError, UnpicklingError, EOFError, UnicodeDecodeError…
        raise _refused(ValueError(
            f"ckpt_path={path} is not a readable checkpoint ({path.stat().st_size} bytes; {type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}): a file cut short by a full disk or a copy, damaged, "
            f"or not a checkpoint; give another one (the run folder's checkpoints/ holds last.ckpt and the best "
            f"epoch_*.ckpt)")) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise _refused(ValueError(f"ckpt_path={path} is not a Lightning checkpoint (a {type(ckpt).__name__}"
                                  f"{' without state_dict' if isinstance(ckpt, dict) else ''}): give a "
                                  f"<run>/checkpoints/*.ckpt file"))
    return ckpt


def check_segment(saved: dict[str, Any] | None, segment: dict[str, Any], path: str | Path, *,
                  allow_changes: bool) -> list[str]:
    """Compare the last segment of a checkpoint's run (``saved``: its :data:`META_KEY`) with the segment about to
    resume it: another code version is logged as a warning (the record lists both segments); another budget
    setting (:data:`BUDGET_SETTINGS`) is refused.

    Returns:
        The budget differences (``"key: saved → current"``), accepted by ``allow_changes``.

    Raises:
        ValueError: a budget setting differs and ``allow_changes`` is false.
    """
    segments = (saved or {}).get("segments") or []
    if not segments:
        return []
    last = segments[-1]
    was, now = code_version(last.get("git_sha"), last.get("git_dirty")), \
        code_version(segment.get("git_sha"), segment.get("git_dirty"))
    if was != now:
        log.warning("resuming %s, written by code %s, with code %s: the record lists both segments", path, was, now)
    diff = [f"{k}: {last.get(k)!r} → {segment.get(k)!r}" for k in BUDGET_SETTINGS
            if last.get(k) is not None and segment.get(k) is not None and last.get(k) != segment.get(k)]
    if diff and not allow_changes:
        raise _refused(ValueError(f"ckpt_path={path} was trained with other settings that change the budget: "
                                  f"{'; '.join(diff)}. Resume with the checkpoint's settings, or pass "
                                  f"+resume_with_changes=true (each segment's budget is recorded in results.json)"))
    if diff:
        log.warning("+resume_with_changes=true: resuming %s with %s", path, "; ".join(diff))
    return diff


def run_identity(cfg: DictConfig, choices: dict[str, Any]) -> dict[str, Any]:
    """The identity of a run as :data:`KEY` stores it in its checkpoints (JSON-like; no tensors).

    Args:
        cfg: the run's composed config (after :func:`~diffrank.experiments.run.choices.drop_unused_groups`).
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
        ValueError: the identities differ and ``allow_changes`` is false (the message lists the keys); the file
            is not a readable checkpoint (:func:`read_checkpoint`).
    """
    saved = read_checkpoint(path).get(KEY)
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
        raise _refused(ValueError(f"ckpt_path={path} was trained with other choices than this run; it would be "
                                  f"{what} as if they were the same:\n  {listing}\nRepeat the checkpoint's choices "
                                  f"(its run folder's .hydra/overrides.yaml), or pass +resume_with_changes=true to go "
                                  f"on anyway (recorded in results.json)"))
    log.warning("+resume_with_changes=true: %s %s with other choices:\n  %s", what, path, listing)
    return diff


def run_lineage(cfg: DictConfig) -> dict[str, Any]:
    """The run's id, config hash and earlier segments (``{"run_id", "config_hash", "segments"}``, and under
    ``checkpoint_meta`` what ``ckpt_path`` holds under :data:`META_KEY`): a training run resumed from ``ckpt_path``
    continues that checkpoint's run (its id and segments); any other run gets a new id.

    Raises:
        FileNotFoundError / ValueError: ``ckpt_path`` is missing or not a readable checkpoint (:func:`read_checkpoint`).
    """
    lineage: dict[str, Any] = {"run_id": uuid.uuid4().hex, "config_hash": resolved_config_hash(cfg), "segments": []}
    ckpt = cfg.get("ckpt_path")
    if ckpt is not None:
        saved = read_checkpoint(ckpt).get(META_KEY) or {}
        if cfg.get("train", True) and saved.get("run_id"):
            lineage.update(run_id=saved["run_id"], segments=list(saved.get("segments") or []))
        lineage["checkpoint_meta"] = saved
    return lineage


class RunIdentity(L.Callback):
    """Writes the run's :func:`run_identity` into every checkpoint under :data:`KEY`, and its id, config hash and
    segments under :data:`META_KEY`.

    Args:
        identity: the run's identity (JSON-like).
        meta: the run's lineage (:func:`run_lineage`: ``{"run_id", "config_hash", "segments"}``): the segments
            before this one (a resumed run's, from its checkpoint; empty for a new run).
        segment: this segment's code version and budget settings (``from_step`` is set when training starts).
    """

    def __init__(self, identity: dict[str, Any], meta: dict[str, Any] | None = None,
                 segment: dict[str, Any] | None = None) -> None:
        self.identity = identity
        self.meta = dict(meta or {})
        self.segment = dict(segment or {})

    @property
    def segments(self) -> list[dict[str, Any]]:
        """The run's segments so far, this one last."""
        return [*(self.meta.get("segments") or []), self.segment]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """This segment starts at the step the run resumed from (0 for a new run)."""
        self.segment["from_step"] = int(trainer.global_step)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Add the identity and the run's id, config hash and segments to ``checkpoint``."""
        checkpoint[KEY] = self.identity
        checkpoint[META_KEY] = {**self.meta, "segments": self.segments}
