"""The import graph has two layers: the library (src/diffrank minus experiments/) never imports the
experiment framework or its stack, not even lazily inside a function."""

from __future__ import annotations

import ast

import pytest

from conftest import ROOT

# the benchmarks (diffrank.benchmark) sit beside the library: they may print with rich and plot with matplotlib,
# never build with the framework's stack
TOOLS = ("rich", "matplotlib")
FRAMEWORK = ("diffrank.experiments", "lightning", "pytorch_lightning", "hydra", "omegaconf", "torchmetrics", "wandb",
             "timm", "datasets", "sklearn", "matplotlib", "rich")
LIBRARY = sorted(p for p in (ROOT / "src" / "diffrank").rglob("*.py")
                 if "experiments" not in p.relative_to(ROOT).parts)


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            if node.module == "diffrank":
                yield from (f"diffrank.{a.name}" for a in node.names)


def test_library_files_found():
    names = {p.relative_to(ROOT).as_posix() for p in LIBRARY}
    assert {"src/diffrank/functional.py", "src/diffrank/operators/base.py", "src/diffrank/kernels/lapsum.py"} <= names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_upward_import(path):
    banned = [f for f in FRAMEWORK if not ("benchmark" in path.parts and f in TOOLS)]
    bad = [m for m in _imports(path) if any(m == f or m.startswith(f + ".") for f in banned)]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: the library layer must not"
