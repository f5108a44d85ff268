"""The import graph has two layers: the library (src/diffrank minus experiments/) never imports the
experiment framework or its stack, not even lazily inside a function."""

from __future__ import annotations

import ast

import pytest

from helpers import ROOT

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
            if node.module == "diffrank" or node.module.startswith("diffrank."):  # from diffrank.x import module
                yield from (f"{node.module}.{a.name}" for a in node.names)


def test_library_files_found():
    names = {p.relative_to(ROOT).as_posix() for p in LIBRARY}
    assert {"src/diffrank/functional.py", "src/diffrank/operators/base.py", "src/diffrank/kernels/lapsum.py"} <= names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_upward_import(path):
    banned = [f for f in FRAMEWORK if not ("benchmark" in path.parts and f in TOOLS)]
    bad = [m for m in _imports(path) if any(m == f or m.startswith(f + ".") for f in banned)]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: the library layer must not"


# The Triton kernels (src/diffrank/kernels) are launch functions: the operators own the autograd Functions and call
# them, so the arrow points from operators to kernels only; what both need sits in diffrank/_shared.py
KERNELS = sorted((ROOT / "src" / "diffrank" / "kernels").glob("*.py"))


def _all_imports(path):
    """Every module ``path`` imports, relative imports resolved against its package (a kernel may not reach the
    operators by ``from ..operators import x`` either)."""
    package = path.relative_to(ROOT / "src").parent.parts
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[:len(package) - node.level + 1] + ((node.module,) if node.module else ()))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)
    yield from _imports(path)


def test_kernel_files_found():
    assert {"lapsum.py", "networks.py", "fast_soft_sort.py"} <= {p.name for p in KERNELS}


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_kernels_never_import_operators(path):
    """Not even lazily inside a function: a kernel module imports Triton, torch, kernels/ and diffrank._shared."""
    bad = sorted({m for m in _all_imports(path) if m == "diffrank.operators" or m.startswith("diffrank.operators.")})
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: kernels are launch functions, the operators call them"


def test_shared_helpers_import_neither_side():
    """diffrank/_shared.py is what kernels and operators both import: it imports neither (nor Triton, so the PyTorch
    path never loads the kernels), no circle."""
    mods = set(_all_imports(ROOT / "src" / "diffrank" / "_shared.py"))
    bad = sorted(m for m in mods if m.split(".")[0] == "triton"
                 or m.startswith(("diffrank.operators", "diffrank.kernels")))
    assert not bad, f"diffrank/_shared.py imports {bad}"


# The framework (src/diffrank/experiments) by concern: what runs during a training job (run/ and the parts it builds:
# algorithms, callbacks, data, metrics, models), the record it writes (records/), what reads records afterwards
# (analysis/), the row configs of the paper tables (rows/) and the command-line tools around runs (tools/).
EXPERIMENTS = ROOT / "src" / "diffrank" / "experiments"
# concern -> the concerns it must not import (not even lazily inside a function)
FORBIDDEN = {
    "run": ("analysis", "rows", "tools"),
    # the callbacks and loggers a run builds: run/ builds them, so they never import it
    "callbacks": ("run", "rows", "tools"),
    "records": ("run", "callbacks", "analysis", "rows", "tools"),
    "analysis": ("run",),
}
CONCERN_FILES = sorted((concern, p) for concern in FORBIDDEN for p in (EXPERIMENTS / concern).rglob("*.py"))


def _concern_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["diffrank", "experiments"] and len(parts) > 2 else None


def test_concern_files_found():
    names = {p.relative_to(EXPERIMENTS).as_posix() for _, p in CONCERN_FILES}
    assert {"run/train.py", "run/resolvers.py", "records/record.py", "analysis/report.py"} <= names
    # every module of the framework sits in a concern folder
    top = {p.name for p in EXPERIMENTS.glob("*.py") if p.name != "__init__.py"}
    assert not top, sorted(top)


@pytest.mark.parametrize(("concern", "path"), CONCERN_FILES,
                         ids=lambda x: x.relative_to(ROOT).as_posix() if hasattr(x, "relative_to") else x)
def test_concerns_import_downward_only(concern, path):
    rel = path.relative_to(EXPERIMENTS).as_posix()
    bad = sorted({m for m in _imports(path) if _concern_of(m) in FORBIDDEN[concern]})
    assert not bad, f"{rel} imports {bad}: {concern}/ must not import {', '.join(FORBIDDEN[concern])}"


@pytest.mark.parametrize("path", [p for p in LIBRARY if "benchmark" not in p.parts],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_library_does_not_import_the_benchmarks(path):
    """The benchmarks sit beside the library (they import it and the peers); the library never needs them."""
    bad = [m for m in _imports(path) if m == "diffrank.benchmark" or m.startswith("diffrank.benchmark.")]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
