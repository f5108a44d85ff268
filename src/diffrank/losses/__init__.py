"""Losses built on the ranking operators (top-k cross-entropy, sorting, kNN, smooth top-k SVM, Newton, smoothing,
ReSGRO) and their helpers; docs/api.md, "Losses", has the table with shapes and papers.

Every public class and function of the modules of this package is exported here (``from diffrank.losses import
TopKCrossEntropyLoss``): the name → module map is read from the modules' source (top-level ``class`` / ``def``
whose name does not start with ``_``) and a module is imported on first access, so ``import diffrank.losses`` stays
light and a new loss is exported without an edit here.
"""

from __future__ import annotations

import ast
import pkgutil
from functools import cache
from importlib import import_module
from pathlib import Path
from typing import Any


@cache
def exported_names() -> dict[str, str]:
    """Public name → module (e.g. ``"TopKCrossEntropyLoss"`` → ``"diffrank.losses.topk_cross_entropy"``) of every
    top-level class and function of the package's modules.

    Raises:
        ValueError: two modules define one public name (the export would be ambiguous).
    """
    out: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.ispkg or info.name.startswith("_"):
            continue
        tree = ast.parse((Path(__path__[0]) / f"{info.name}.py").read_text(encoding="utf-8"))
        module = f"{__name__}.{info.name}"
        for name in (n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))):
            if not name.startswith("_") and out.setdefault(name, module) != module:
                raise ValueError(f"{name} is defined in {out[name]} and {module}; rename one")
    return out


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return ["exported_names", *sorted(exported_names())]
    if not name.startswith("_") and name in (names := exported_names()):
        return getattr(import_module(names[name]), name)
    raise AttributeError(f"module 'diffrank.losses' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted({*globals(), *exported_names()})
