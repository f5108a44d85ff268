"""Training entry point: compose → build data, loss (with the operator and P_K its yaml interpolates), model
→ fit → test → results.json.

``python train.py [overrides]`` calls :func:`main`; tests call :func:`train` with a composed config.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from diffrank.callbacks import ResumeState
from diffrank.utils.checkpoints import fit_and_test
from diffrank.utils.composition import check_model_fits_data, prepare
from diffrank.utils.instantiate import instantiate
from diffrank.utils.malloc import keep_freed_memory
from diffrank.utils.results import compute_environment, device_description, git_state, to_float, versions, write_results

log = logging.getLogger(__name__)


def _hydra_info() -> dict[str, Any]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {"choices": {}, "overrides": [], "run_dir": None}
    hc = HydraConfig.get()
    return {"choices": {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")},
            "overrides": list(hc.overrides.task), "run_dir": hc.runtime.output_dir}


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Run one experiment described by ``cfg``.

    A paper row run with another operator becomes a variant (its own operator config, no ``paper`` key), and
    groups nothing reads (P_K in a sorting run) are left out of the record: :mod:`diffrank.utils.composition`.

    Args:
        cfg: the composed ``configs/train.yaml`` (needs ``HydraConfig`` set when it uses ``${hydra:…}``).

    Returns:
        ``(metrics, objects)``: the final metrics (``test/*``, ``val/*``, ``train/*`` as floats) and the
        built objects (datamodule, operator, loss, model, trainer).

    Raises:
        ValueError: unknown or incompatible choices (e.g. a loss that the operator cannot serve).
    """
    t0 = time.time()
    info = _hydra_info()
    cfg, used = prepare(cfg, info["choices"], info["overrides"])
    if used["variant_of"]:
        log.warning("%s is a row of %s; operator=%s runs a variant of it, recorded without its paper key",
                    used["variant_of"]["experiment"], used["variant_of"]["paper_operator"],
                    used["variant_of"]["operator"])
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    loss = instantiate(cfg.loss)  # its yaml interpolates what it needs: operator: ${operator}, p_k: ${pk}
    operator = getattr(loss, "operator", None)
    check_model_fits_data(cfg, info["choices"])
    model = instantiate(cfg.model, loss=loss)
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    if cfg.trainer.get("enable_progress_bar") is False:  # Lightning refuses a progress-bar callback then
        callbacks = [c for c in callbacks if not isinstance(c, L.pytorch.callbacks.ProgressBar)]
    if not any(isinstance(c, ResumeState) for c in callbacks):
        callbacks.append(ResumeState())  # RNG states and sampler position in every checkpoint (exact resume)
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    if loggers:
        for lg in loggers:
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    # fit and test the selected checkpoint, or (train=false ckpt_path=…) evaluate a checkpoint
    done = fit_and_test(cfg, trainer, model, datamodule, loggers)
    metrics = {k: to_float(v) for k, v in {**done["fit"], **done["eval"], **done["test"]}.items()}
    objects = {"datamodule": datamodule, "operator": operator, "loss": loss, "model": model, "trainer": trainer}
    if trainer.is_global_zero:
        record = {
            "task_name": cfg.get("task_name"), "paper": OmegaConf.to_container(cfg.paper, resolve=True)
            if isinstance(cfg.get("paper"), DictConfig) else cfg.get("paper"),
            "variant_of": used["variant_of"],
            "metrics": metrics, "choices": used["choices"], "overrides": info["overrides"],
            "seed": cfg.get("seed"), "split_seed": cfg.data.get("split_seed") if cfg.get("data") else None,
            "global_step": done["checkpoint"]["global_step"] if done["evaluated_checkpoint"]
            else int(trainer.global_step),
            "evaluated_checkpoint": done["evaluated_checkpoint"], "checkpoint": done["checkpoint"],
            **git_state(), "versions": versions(), "wall_time_s": time.time() - t0,
            "device": device_description(env := compute_environment()), "compute": env, "run_dir": info["run_dir"],
            "config": OmegaConf.to_container(cfg, resolve=False),
        }
        out = cfg.paths.get("output_dir") if cfg.get("paths") else None
        if out:
            path = write_results(Path(out) / "results.json", record)
            log.info("results: %s", path)
        objects["results"] = record
    return metrics, objects


def summary_caption(record: dict[str, Any] | None) -> str | None:
    """The conditions of a headline number: which checkpoint was tested, on what device and threads."""
    if not record:
        return None
    ckpt = record.get("checkpoint") or {}
    what = f"{Path(ckpt['path']).name} (epoch {ckpt['epoch']}, step {ckpt['global_step']})" if ckpt \
        else "final weights"
    if record.get("evaluated_checkpoint"):
        what = f"evaluation of {what}"
    versions = record.get("versions") or {}
    return f"{what}; {record.get('device')}; torch {versions.get('torch')}"


def print_summary(metrics: dict[str, float], record: dict[str, Any] | None = None) -> None:
    """Print the test metrics as a rich table (what ``make train`` ends with), captioned with the tested
    checkpoint and the device when ``record`` (the ``results.json`` record) is given."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="test metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in sorted(metrics):
        if k.startswith("test/"):
            v = metrics[k]
            table.add_row(k, f"{100 * v:.2f} %" if "loss" not in k else f"{v:.4f}")
    console = Console()
    console.print(table)
    caption = summary_caption(record)
    if caption:
        console.print(f"tested: {caption}", soft_wrap=True, markup=False, highlight=False)


def main() -> None:
    """Console entry point (``diffrank-train``): same as ``python train.py``."""
    import sys

    from diffrank.utils.configs import config_dir

    sys.argv.insert(1, f"--config-path={config_dir()}")
    hydra.main(version_base="1.3", config_path=None, config_name="train")(run)()


def _runs_on_cpu(trainer_cfg: DictConfig) -> bool:
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def apply_process_settings(cfg: DictConfig) -> dict[str, bool]:
    """Process-wide settings of a script run (never applied by :func:`train`, which is a library function).

    - ``extras.ignore_warnings`` (default false): silence every Python warning for this process.
    - ``extras.keep_freed_memory`` (default true): for CPU runs only, glibc keeps freed memory instead of
      unmapping it every step (:func:`diffrank.utils.malloc.keep_freed_memory`); logged when applied.

    Returns:
        ``{"ignore_warnings": bool, "keep_freed_memory": bool}``: what was applied.
    """
    extras = cfg.get("extras") or {}
    applied = {"ignore_warnings": bool(extras.get("ignore_warnings")), "keep_freed_memory": False}
    if applied["ignore_warnings"]:
        warnings.filterwarnings("ignore")
    if extras.get("keep_freed_memory") and _runs_on_cpu(cfg.trainer):
        applied["keep_freed_memory"] = keep_freed_memory()
        log.info("CPU run, extras.keep_freed_memory: glibc malloc keeps freed memory (%s)",
                 "applied" if applied["keep_freed_memory"] else "not glibc, nothing changed")
    return applied


def run(cfg: DictConfig) -> float | None:
    """:func:`train`, then close W&B (so multirun jobs get their own runs), print the test metrics and
    return ``cfg.optimized_metric`` for sweepers.

    Raises:
        KeyError: if a training run did not log ``optimized_metric``.
    """
    if cfg.get("extras") and cfg.extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=False))
    apply_process_settings(cfg)
    try:
        metrics, objects = train(cfg)
    finally:
        try:
            import wandb

            if wandb.run is not None:
                wandb.finish()
        except ImportError:
            pass
    print_summary(metrics, objects.get("results"))
    if "results" in objects:
        log.info("wall time %.1f s; run folder %s", objects["results"]["wall_time_s"], objects["results"]["run_dir"])
    name = cfg.get("optimized_metric")
    if name and name not in metrics and cfg.get("train", True):  # an evaluation need not log it
        raise KeyError(f"optimized_metric '{name}' was not logged; logged: {sorted(metrics)}")
    return metrics.get(name) if name else None
