"""Shared fixtures: offline environment, config composition (lightning-hydra-template style).

The library's tests (tests/operators, tests/losses, tests/test_functional.py, tests/kernels) collect and run with
the library's dependencies alone: nothing here imports the experiment framework (Hydra, OmegaConf, Lightning) at
module level; :func:`make_compose` imports it when a framework test asks for a config.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
if not torch.cuda.is_available():  # Triton kernels run on CPU tensors through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# real data sets (MNIST/raw/, …) for the tests that need them, the folder the configs read (paths.data_dir);
# those tests skip without it
DATA = Path(os.environ["DIFFRANK_DATA"]) if os.environ.get("DIFFRANK_DATA") else None


def real_data(*parts: str):
    """``skipif`` marker of a test that needs ``$DIFFRANK_DATA/<parts>`` (a folder of a real data set)."""
    return pytest.mark.skipif(DATA is None or not DATA.joinpath(*parts).is_dir(),
                              reason=f"needs $DIFFRANK_DATA/{'/'.join(parts)} (a real data set)")


def load_deterministic(name: str, **overrides):
    """``diffrank.operators.load(name, **overrides)`` in evaluation mode, for the registry-driven tests that call an
    operator several times and compare (contract, fuzz matrix, gradcheck): a stochastic operator
    (``gumbel_sinkhorn``, ``neuralsort_stochastic``) draws its noise only in training mode, so it is its noiseless
    relaxation here; every other operator ignores the mode (tests/operators/test_stochastic.py checks both)."""
    from diffrank.operators import load

    return load(name, **overrides).eval()


def options(group: str) -> list[str]:
    """Option names of a config group, found recursively (the config folder is the registry):
    ``options("experiment")`` holds ``sorting/mnist``, ``sorting/thesis_t3_7/odd_even_cauchy_n5``, …"""
    root = CONFIGS / group
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    yield


def make_compose(tmp_path):
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


@pytest.fixture
def compose_train(tmp_path):
    """:func:`make_compose` in the test's ``tmp_path``."""
    from hydra.core.global_hydra import GlobalHydra

    yield make_compose(tmp_path)
    GlobalHydra.instance().clear()


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
