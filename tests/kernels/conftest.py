"""Kernel tests where the Triton interpreter is off (a CUDA machine: tests/conftest.py turns it on only
without CUDA, so that the ``gpu`` cases compile real kernels): the interpreter cases (marked ``triton``, not
``gpu``) run on CPU tensors and are skipped. Run them there with ``TRITON_INTERPRET=1 pytest -m triton``."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    skip = pytest.mark.skip(reason="Triton interpreter case on CPU tensors: run with TRITON_INTERPRET=1")
    for item in items:
        if "tests/kernels/" in item.nodeid and "triton" in item.keywords and "gpu" not in item.keywords:
            item.add_marker(skip)
