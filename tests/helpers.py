"""Helpers the tests import (``from helpers import …``): paths, the config groups' option names, the real-data
marker and the noiseless operator loader. They are plain names, not fixtures, because the tests use them while
pytest collects (``@pytest.mark.parametrize("name", options("operator"))``, ``@real_data("MNIST", "raw")``,
module-level lists of operators); the fixtures are in ``tests/conftest.py``.

Like the conftest, nothing here imports the experiment framework (Hydra, OmegaConf, Lightning): the library's tests
collect and run with the library's dependencies alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
