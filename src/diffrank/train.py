"""Training entry point: compose → build data, operator, P_K, loss, model → fit → test → results.json.

``python train.py [overrides]`` calls :func:`main`; tests call :func:`train` with a composed config.
"""

from __future__ import annotations

import inspect
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf

from diffrank.utils.instantiate import instantiate
from diffrank.utils.malloc import keep_freed_memory
from diffrank.utils.results import device_description, git_state, to_float, versions, write_results

log = logging.getLogger(__name__)


def _target_class(cfg: DictConfig) -> Any:
    return hydra.utils.get_class(cfg._target_)


def build_loss(cfg: DictConfig, operator: Any, p_k: Any) -> Any:
    """Instantiate the loss, passing ``operator=`` / ``p_k=`` only to losses whose ``__init__`` takes them.

    Raises:
        ValueError: if the loss needs an operator or P_K and the config gives none.
    """
    params = inspect.signature(_target_class(cfg).__init__).parameters
    kwargs = {}
    for name, obj, group in (("operator", operator, "operator"), ("p_k", p_k, "pk")):
        if name in params:
            if obj is None and params[name].default is inspect.Parameter.empty:
                raise ValueError(f"loss {cfg._target_} needs '{name}': choose one with {group}=<name>")
            kwargs[name] = obj
    return instantiate(cfg, **kwargs)


def _optional(cfg: DictConfig, key: str) -> Any:
    node = cfg.get(key)
    return None if node is None else instantiate(node)


def _hydra_info() -> dict[str, Any]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {"choices": {}, "overrides": [], "run_dir": None}
    hc = HydraConfig.get()
    return {"choices": {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")},
            "overrides": list(hc.overrides.task), "run_dir": hc.runtime.output_dir}


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Run one experiment described by ``cfg``.

    Args:
        cfg: the composed ``configs/train.yaml`` (needs ``HydraConfig`` set when it uses ``${hydra:…}``).

    Returns:
        ``(metrics, objects)``: the final metrics (``test/*``, ``val/*``, ``train/*`` as floats) and the
        built objects (datamodule, operator, loss, model, trainer).

    Raises:
        ValueError: unknown or incompatible choices (e.g. a loss that the operator cannot serve).
    """
    t0 = time.time()
    if cfg.get("extras") and cfg.extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if cfg.get("extras") and cfg.extras.get("keep_freed_memory"):
        keep_freed_memory()
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    operator = _optional(cfg, "operator")
    p_k = _optional(cfg, "pk")
    loss = build_loss(cfg.loss, operator, p_k)
    model = instantiate(cfg.model, loss=loss)
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    if cfg.trainer.get("enable_progress_bar") is False:  # Lightning refuses a progress-bar callback then
        callbacks = [c for c in callbacks if not isinstance(c, L.pytorch.callbacks.ProgressBar)]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    if loggers:
        for lg in loggers:
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    if cfg.get("train", True):
        # our own checkpoints hold Hydra partials (the optimizer) in hparams: not loadable with weights_only
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=False)
    train_metrics = dict(trainer.callback_metrics)
    test_metrics: dict[str, Any] = {}
    if cfg.get("test", True):
        ckpt = None
        cb = trainer.checkpoint_callback
        if cb is not None and getattr(cb, "best_model_path", ""):
            ckpt = cb.best_model_path
        else:
            log.warning("no best checkpoint (e.g. fast_dev_run): testing the current weights")
        tester = trainer
        if "spawn" in str(cfg.trainer.get("strategy") or ""):
            # a second ddp_spawn launch (fit, then test) aborts at exit on CPU/gloo ("terminate called
            # without an active exception"); the test set is small, so one process tests the best weights
            tester = instantiate(cfg.trainer, devices=1, strategy="auto", logger=loggers or False, callbacks=[])
        tester.test(model=model, datamodule=datamodule, ckpt_path=ckpt, weights_only=False)
        test_metrics = dict(tester.callback_metrics)
    metrics = {k: to_float(v) for k, v in {**train_metrics, **test_metrics}.items()}
    objects = {"datamodule": datamodule, "operator": operator, "loss": loss, "model": model, "trainer": trainer}
    if trainer.is_global_zero:
        info = _hydra_info()
        record = {
            "task_name": cfg.get("task_name"), "paper": OmegaConf.to_container(cfg.paper, resolve=True)
            if isinstance(cfg.get("paper"), DictConfig) else cfg.get("paper"),
            "metrics": metrics, "choices": info["choices"], "overrides": info["overrides"],
            "seed": cfg.get("seed"), "global_step": int(trainer.global_step), **git_state(), "versions": versions(),
            "wall_time_s": time.time() - t0,
            "device": device_description(), "run_dir": info["run_dir"],
            "config": OmegaConf.to_container(cfg, resolve=False),
        }
        out = cfg.paths.get("output_dir") if cfg.get("paths") else None
        if out:
            path = write_results(Path(out) / "results.json", record)
            log.info("results: %s", path)
        objects["results"] = record
    return metrics, objects


def print_summary(metrics: dict[str, float]) -> None:
    """Print the test metrics as a rich table (what ``make train`` ends with)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="test metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in sorted(metrics):
        if k.startswith("test/"):
            v = metrics[k]
            table.add_row(k, f"{100 * v:.2f} %" if "loss" not in k else f"{v:.4f}")
    Console().print(table)


def main() -> None:
    """Console entry point (``diffrank-train``): same as ``python train.py``."""
    import sys

    from diffrank.utils.configs import config_dir

    sys.argv.insert(1, f"--config-path={config_dir()}")
    hydra.main(version_base="1.3", config_path=None, config_name="train")(run)()


def run(cfg: DictConfig) -> float | None:
    """:func:`train`, then close W&B (so multirun jobs get their own runs), print the test metrics and
    return ``cfg.optimized_metric`` for sweepers.

    Raises:
        KeyError: if ``optimized_metric`` is not among the logged metrics.
    """
    if cfg.get("extras") and cfg.extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=False))
    try:
        metrics, objects = train(cfg)
    finally:
        try:
            import wandb

            if wandb.run is not None:
                wandb.finish()
        except ImportError:
            pass
    print_summary(metrics)
    if "results" in objects:
        log.info("wall time %.1f s; run folder %s", objects["results"]["wall_time_s"], objects["results"]["run_dir"])
    name = cfg.get("optimized_metric")
    if name and name not in metrics:
        raise KeyError(f"optimized_metric '{name}' was not logged; logged: {sorted(metrics)}")
    return metrics.get(name) if name else None
