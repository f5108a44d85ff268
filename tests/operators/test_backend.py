"""``operator.backend`` for every operator config that has it (the config folder is the registry)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONFIGS, options
from diffrank.operators import load
from diffrank.operators.backend import check_backend, use_triton

WITH_BACKEND = [n for n in options("operator") if "backend" in OmegaConf.load(CONFIGS / "operator" / f"{n}.yaml")]


def test_every_kernel_operator_has_the_key():
    assert {"neuralsort", "softsort", "sinkhorn", "lapsum", "soft_topk", "diffsort_odd_even", "diffsort_bitonic",
            "difftopk_bitonic", "difftopk_splitter"} <= set(WITH_BACKEND)


@pytest.mark.parametrize("name", WITH_BACKEND)
def test_unknown_backend_raises(name):
    with pytest.raises(ValueError, match="backend must be one of"):
        load(name, backend="bogus")


@pytest.mark.parametrize("name", WITH_BACKEND)
def test_triton_on_cpu_without_the_interpreter_raises(name, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    op = load(name, backend="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        op.topk_membership(torch.randn(2, 6), [2])


def test_the_decision():
    x = torch.zeros(2)
    assert not use_triton("torch", x) and not use_triton("auto", x)  # auto: PyTorch off CUDA
    assert check_backend("auto") == "auto"
