"""Shared fixtures: offline environment, config composition (lightning-hydra-template style).

The library's tests (tests/operators, tests/losses, tests/test_functional.py, tests/kernels) collect and run with
the library's dependencies alone: nothing here imports the experiment framework (Hydra, OmegaConf, Lightning) at
module level; :func:`_make_compose` imports it when a framework test asks for a config. The plain helpers that tests
use while pytest collects (paths, config option names, the real-data marker) are in ``tests/helpers.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
if not torch.cuda.is_available():  # Triton kernels run on CPU tensors through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    yield


def _make_compose(tmp_path):
    """``compose(overrides, fast=True) -> cfg``: configs/train.yaml shrunk for tests, output in ``tmp_path``.

    Sets ``HydraConfig`` so that ``${hydra:…}`` interpolations resolve, as ``train.py`` would.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from diffrank.experiments.run.resolvers import register_resolvers

    register_resolvers()  # the configs' ${beta_grid:…} / ${short_hash:…}, as train.py registers them

    def _compose(overrides: list[str], fast: bool = True):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path)
            cfg.paths.log_dir = str(tmp_path)
            cfg.hydra.runtime.output_dir = str(tmp_path)
            cfg.hydra.job.num = 0
            cfg.extras.print_config = False
            if fast:
                cfg.trainer.fast_dev_run = True
                cfg.trainer.enable_progress_bar = False
                cfg.trainer.enable_model_summary = False
                cfg.callbacks = {k: v for k, v in cfg.callbacks.items() if k != "rich_progress_bar"} \
                    if cfg.get("callbacks") else cfg.callbacks
        HydraConfig().set_config(cfg)
        return cfg

    return _compose


@pytest.fixture(scope="session")
def make_compose():
    """``make_compose(folder) -> compose``: :func:`_make_compose`, for a fixture of a wider scope than a test (one
    training run a module's tests share) that has no ``tmp_path``."""
    return _make_compose


@pytest.fixture
def compose_train(tmp_path):
    """:func:`_make_compose` in the test's ``tmp_path``."""
    from hydra.core.global_hydra import GlobalHydra

    yield _make_compose(tmp_path)
    GlobalHydra.instance().clear()


# 4 steps of 64 per epoch, validation and test on 128 images: a digits100 run of an epoch or two takes a few seconds
TINY_RUN = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "~logger",
            "extras.keep_freed_memory=false", "~callbacks.run_time_estimate", "~callbacks.throughput"]


@pytest.fixture
def tiny_run(compose_train):
    """``tiny_run(out, overrides) -> cfg``: the default run on digits100 at a few steps (no logger, no progress
    bar, no throughput or run-time callbacks) with its output folder ``out``, for ``train`` / ``run`` (CPU)."""
    from omegaconf import open_dict

    def _cfg(out: Path, overrides=()):
        cfg = compose_train([*TINY_RUN, *overrides], fast=False)
        with open_dict(cfg):
            cfg.paths.output_dir = str(out)
        return cfg

    return _cfg


@pytest.fixture
def train_built(monkeypatch):
    """``train(cfg)`` that also hands back what the run built: ``(record, objects)``, the run's ``RunRecord`` and
    its components (datamodule, operator, loss, model, trainer), for tests that inspect them."""
    from diffrank.experiments.run import train as runner

    built = []
    real = runner.build

    def capture(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(runner, "build", capture)

    def call(cfg, *args, **kwargs):
        built.clear()
        record = runner.train(cfg, *args, **kwargs)
        return record, built[-1].components

    return call


def pytest_collection_modifyitems(config, items):
    """Where the Triton interpreter is off (a CUDA machine: it is turned on above only without CUDA, so that
    the ``gpu`` cases compile real kernels), skip the interpreter cases of tests/kernels (marked ``triton``,
    not ``gpu``: they run on CPU tensors). Run them there with ``TRITON_INTERPRET=1 pytest -m triton``."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    skip = pytest.mark.skip(reason="Triton interpreter case on CPU tensors: run with TRITON_INTERPRET=1")
    for item in items:
        if "tests/kernels/" in item.nodeid and "triton" in item.keywords and "gpu" not in item.keywords:
            item.add_marker(skip)
