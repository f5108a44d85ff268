"""Every public function and class of diffrank (and of its public classes' methods) has a docstring.

An override of a documented base method needs none: ``inspect.getdoc`` on the bound attribute inherits the
base's docstring (``torch.autograd.Function.forward``, ``nn.Module.forward``, ``LightningModule`` hooks, …).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import diffrank


def _modules():
    names = ["diffrank"]
    for info in pkgutil.walk_packages(diffrank.__path__, "diffrank."):
        names.append(info.name)
    return names


def _undocumented(module) -> list[str]:
    missing = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not inspect.isfunction(member):
                    continue
                if not inspect.getdoc(getattr(obj, attr)):
                    missing.append(f"{name}.{attr}")
    return missing


@pytest.mark.parametrize("name", _modules())
def test_public_api_is_documented(name):
    try:
        module = importlib.import_module(name)
    except ImportError as err:  # optional dependencies (e.g. triton on a machine without it)
        pytest.skip(str(err))
    assert inspect.getdoc(module), f"module {name} has no docstring"
    assert not _undocumented(module), f"{name}: no docstring on {_undocumented(module)}"
