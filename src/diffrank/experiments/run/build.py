"""Build one run from its composed config: the data module, the loss (with the operator and P_K its yaml
interpolates), the Newton loss around it, the model, callbacks, loggers and the trainer (:func:`build`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from diffrank.experiments.algorithms.newton import with_newton
from diffrank.experiments.callbacks import DivergenceGuard, ResumeState, RunIdentity
from diffrank.experiments.callbacks.run_identity import run_identity
from diffrank.experiments.records.environment import git_state
from diffrank.experiments.run.choices import drop_unused_groups, pk_as_run
from diffrank.experiments.run.composition import check_model_fits_data, prepare
from diffrank.experiments.run.instantiate import instantiate
from diffrank.experiments.run.process import HydraJob


@dataclass
class Built:
    """What :func:`build` makes of a config: the objects of one run and what the record needs to know.

    ``choices`` are the config group choices the run used (groups it does not read left out, the P_K as run);
    ``job`` the Hydra job (:class:`~diffrank.experiments.run.process.HydraJob`); ``lineage`` the run's id, config
    hash and earlier segments (:func:`~diffrank.experiments.callbacks.run_identity.run_lineage`; None: a new run
    without one); ``identity`` what its checkpoints carry
    (:func:`~diffrank.experiments.callbacks.run_identity.run_identity`).
    """

    cfg: DictConfig
    choices: dict[str, Any]
    job: HydraJob
    lineage: dict[str, Any] | None
    paper: Any
    datamodule: Any
    loss: Any
    model: L.LightningModule
    trainer: L.Trainer
    loggers: list[Any] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)

    @property
    def components(self) -> dict[str, Any]:
        """The built objects by name: datamodule, operator, loss, model, trainer."""
        return {"datamodule": self.datamodule, "operator": getattr(self.loss, "operator", None), "loss": self.loss,
                "model": self.model, "trainer": self.trainer}

    def callback(self, kind: type) -> Any:
        """The trainer's first callback of type ``kind``, or None."""
        return next((c for c in self.trainer.callbacks if isinstance(c, kind)), None)


def build(cfg: DictConfig, job: HydraJob, lineage: dict[str, Any] | None = None) -> Built:
    """Compose what a run uses (:func:`~diffrank.experiments.run.composition.prepare`), seed, and build the data
    module, the loss (with the operator and P_K its yaml interpolates), the model, callbacks, loggers and trainer.
    Under DDP each rank loads ``data.batch_size / world_size`` items (``data.batch_size`` is the global batch).

    Raises:
        ValueError: unknown or incompatible choices, or a global batch that the world size does not divide.
    """
    cfg, choices = prepare(cfg, job.choices, job.overrides)
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    # the loss yaml interpolates what it needs (operator: ${operator}, p_k: ${pk}); a model that brings its own
    # loss (model.algorithm: the Warcraft protocol) has none
    loss = instantiate(cfg.loss) if cfg.get("loss") is not None else None
    choices = pk_as_run(cfg, drop_unused_groups(cfg, choices, loss))  # pk.weights=[…]: what ran
    model_kwargs: dict[str, Any] = {}
    if cfg.get("newton") is not None:  # newton=<variant>: the Newton loss (thesis §7.3) around the run's loss
        if loss is None and cfg.model.get("algorithm") is not None:  # the algorithm is the loss (Warcraft)
            model_kwargs["algorithm"] = with_newton(instantiate(cfg.model.algorithm),
                                                    **OmegaConf.to_container(cfg.newton, resolve=True))
        else:
            loss = instantiate(cfg.newton, loss=loss)
    check_model_fits_data(cfg, job.choices)
    model = instantiate(cfg.model, **model_kwargs, **({} if loss is None else {"loss": loss}))
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    if cfg.trainer.get("enable_progress_bar") is False:  # Lightning refuses a progress-bar callback then
        callbacks = [c for c in callbacks if not isinstance(c, L.pytorch.callbacks.ProgressBar)]
    if not any(isinstance(c, ResumeState) for c in callbacks):
        callbacks.append(ResumeState())  # RNG states and sampler position in every checkpoint (exact resume)
    if not any(isinstance(c, DivergenceGuard) for c in callbacks):
        callbacks.append(DivergenceGuard())  # a diverged run stops and is recorded as diverged, not done
    identity = run_identity(cfg, choices)
    # a resume / evaluation with other choices is refused; the run's id and segments go into every checkpoint
    identity_callback = RunIdentity(identity, lineage, git_state())
    callbacks.append(identity_callback)
    paper = OmegaConf.to_container(cfg.paper, resolve=True) if isinstance(cfg.get("paper"), DictConfig) \
        else cfg.get("paper")
    loggers = [instantiate(c, **_wandb_kwargs(c, cfg, choices, paper, job))
               for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    world_size = int(trainer.world_size)
    global_batch = getattr(datamodule, "batch_size", None)
    if global_batch is not None and world_size > 1:
        # data.batch_size is the global batch: each rank loads its share (same steps per epoch as 1 process)
        datamodule.batch_size = _per_device_batch(int(global_batch), world_size)
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    # the settings that decide what a step is; the precision the trainer uses (16-mixed on a CPU runs bf16-mixed)
    identity_callback.segment.update(accumulate_grad_batches=accumulate, precision=str(trainer.precision),
                            global_batch=None if global_batch is None else int(global_batch) * accumulate)
    return Built(cfg, choices, job, lineage, paper, datamodule, loss, model, trainer, loggers, identity)


def _per_device_batch(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise ValueError(f"data.batch_size={global_batch} is the global batch and must be divisible by the "
                         f"world size {world_size} (devices x nodes)")
    return global_batch // world_size


def _wandb_kwargs(logger_cfg: DictConfig, cfg: DictConfig, choices: dict[str, Any], paper: Any,
                  job: HydraJob) -> dict[str, Any]:
    """``group`` (paper table, or the sweep, :func:`diffrank.experiments.callbacks.loggers.wandb_group`) and
    ``tags`` for a W&B logger whose config leaves them null; nothing for other loggers."""
    if not str(logger_cfg.get("_target_", "")).endswith("WandbLogger"):
        return {}
    from diffrank.experiments.callbacks.loggers import wandb_group, wandb_tags

    sweep = Path(job.sweep_dir).name if job.sweep_dir else None
    kwargs: dict[str, Any] = {}
    if logger_cfg.get("group") is None:
        kwargs["group"] = wandb_group(paper, sweep, cfg.get("task_name"))
    if logger_cfg.get("tags") is None:
        extra = list(cfg.get("tags") or []) + ([f"sweep:{sweep}"] if sweep else [])
        kwargs["tags"] = wandb_tags(cfg, choices, extra)
    return kwargs
