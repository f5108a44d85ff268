"""``diffrank.losses`` exports every public class and function of its modules (the README sends users there): the
imports of its ``__init__`` are written out, and this test keeps them complete."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import diffrank.losses as losses


def _public(module) -> dict[str, object]:
    return {name: obj for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module.__name__}


def test_every_public_class_and_function_is_exported():
    found = 0
    for info in pkgutil.iter_modules(losses.__path__):
        module = importlib.import_module(f"diffrank.losses.{info.name}")
        for name, obj in _public(module).items():
            assert getattr(losses, name) is obj, f"diffrank.losses.{name} is not {module.__name__}.{name}"
            assert name in losses.__all__ and name in dir(losses), name
            found += 1
    assert found == len(losses.__all__) == len(set(losses.__all__))
    assert {"TopKCrossEntropyLoss", "PK", "SortingBCELoss", "NeighbourLoss", "NewtonLoss"} <= set(losses.__all__)


def test_star_import_and_unknown_name():
    namespace: dict = {}
    exec("from diffrank.losses import *", namespace)
    assert namespace["TopKCrossEntropyLoss"] is losses.TopKCrossEntropyLoss
    try:
        losses.NoSuchLoss  # noqa: B018
    except AttributeError as err:
        assert "no attribute 'NoSuchLoss'" in str(err)
    else:
        raise AssertionError("diffrank.losses.NoSuchLoss did not raise")


def test_import_is_light():
    """The losses import their operators' modules, never numba or Triton (those load with the first call)."""
    code = "import sys, diffrank.losses\nprint(sorted({'numba', 'triton'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
