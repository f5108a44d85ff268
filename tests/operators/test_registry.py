"""The operator registry is the config folder ``configs/operator/``, and nothing else holds a copy that can drift:
the written-out exports of ``diffrank.operators`` hold every operator class of the package and every class a
config targets, each class's constructor defaults are the values of its canonical config, and the operator table
of the docs (docs/operators.md) is generated from the configs and the classes' metadata.

Each check is a function of the current config folder (``DIFFRANK_CONFIG_DIR``), so the planted cases below run
it on a temporary folder and show that it fails.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import diffrank.operators as operators
from diffrank.operators import available, load
from diffrank.operators.table import (
    BEGIN,
    COMMAND,
    END,
    EXPORTS_BEGIN,
    EXPORTS_END,
    canonical_configs,
    constructor_defaults,
    default_files,
    render,
    render_exports,
    replace_block,
    stale,
)
from diffrank.registry import load_yaml, locate

ROOT = Path(__file__).resolve().parents[2]


def export_errors() -> list[str]:
    """What is wrong with the exports: a class targeted by a config that is not ``diffrank.operators.<Class>``
    (the same object), or not in ``__all__`` / ``dir()``."""
    errors = []
    exported = operators.__all__
    for name in available():
        target = load_yaml("operator", name)["_target_"]
        cls = locate(target)
        if getattr(operators, cls.__name__, None) is not cls:
            errors.append(f"{name}: {target} is not diffrank.operators.{cls.__name__}")
        if cls.__name__ not in exported or cls.__name__ not in dir(operators):
            errors.append(f"{name}: {cls.__name__} missing from diffrank.operators.__all__ / dir()")
    return errors


def unexported_operators(modules) -> list[str]:
    """Every public :class:`RankingOperator` subclass defined in ``modules`` that ``diffrank.operators`` does not
    export (under its name, from its module)."""
    out = []
    for module in modules:
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, operators.RankingOperator) and obj.__module__ ==
                    module.__name__ and not name.startswith("_") and obj is not operators.RankingOperator
                    and operators.OPERATOR_MODULES.get(name) != module.__name__):
                out.append(f"{module.__name__}.{name}")
    return out


def package_modules() -> list[types.ModuleType]:
    """Every module of ``diffrank.operators`` (imported)."""
    return [importlib.import_module(f"diffrank.operators.{info.name}")
            for info in pkgutil.iter_modules(operators.__path__)]


def default_mismatches() -> list[str]:
    """Every (config, key) where a class's constructor default differs from the value of its canonical config,
    and every key of any config that the constructor does not take."""
    out = []
    canonical = canonical_configs()
    for name in available():
        cfg = load_yaml("operator", name)
        cls = locate(cfg["_target_"])
        defaults = constructor_defaults(cls)
        for key, value in cfg.items():
            if key.startswith("_"):
                continue
            if key not in defaults:
                out.append(f"{name}.yaml sets {key}, which {cls.__name__}() takes without a default or not at all")
            elif canonical[cfg["_target_"]] == name and defaults[key] != value:
                out.append(f"{cls.__name__}({key}={defaults[key]!r}) but configs/operator/{name}.yaml: {value!r}")
    return out


def test_every_targeted_class_is_exported():
    assert not export_errors()
    assert set(operators.OPERATOR_MODULES) >= {"LapSum", "ComparatorNetwork", "NeuralSort", "DFTopK"}
    namespace: dict = {}
    exec("from diffrank.operators import *", namespace)
    assert {"LapSum", "load", "available", "RankingOperator"} <= set(namespace)


def test_every_operator_class_of_the_package_is_exported():
    """The written-out exports are complete: every RankingOperator subclass of the package's modules, and nothing
    more (``__all__`` = the map + the module's own names; the type checkers' imports = the map)."""
    assert not unexported_operators(package_modules())
    for name, module in operators.OPERATOR_MODULES.items():
        assert getattr(importlib.import_module(module), name) is getattr(operators, name)
    assert sorted(operators.__all__) == sorted({*operators.OPERATOR_MODULES, "RankingOperator", "available", "load"})
    tree = ast.parse(Path(operators.__file__).read_text(encoding="utf-8"))
    typed = {a.name: node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             for a in node.names if node.module in operators.OPERATOR_MODULES.values()}
    assert typed == operators.OPERATOR_MODULES


def test_planted_unexported_operator_class_fails():
    module = types.ModuleType("diffrank.operators.planted")
    exec("from diffrank.operators.base import RankingOperator\n"
         "class PlantedSort(RankingOperator):\n    pass\n", module.__dict__)
    assert unexported_operators([module]) == ["diffrank.operators.planted.PlantedSort"]


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchOperator'"):
        operators.NoSuchOperator  # noqa: B018


def test_import_stays_light():
    """``import diffrank.operators`` imports no operator class's module (nor numba); a class imports only its own."""
    code = ("import sys, diffrank.operators as o\n"
            "mods = set(o.OPERATOR_MODULES.values()) | {'numba'}\n"
            "print(sorted(mods & set(sys.modules)))\n"
            "o.SoftSort\n"
            "print(sorted(mods & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]", "['diffrank.operators.softsort']"]


def test_class_defaults_equal_config_defaults():
    """NeuralSort / SoftSort defaulted to β = 1 and RelaxedBubbleSort to 10 while their configs said 0.5 / 8."""
    assert not default_mismatches(), "\n".join(default_mismatches())


def test_several_configs_of_one_class_name_a_canonical_one():
    canonical = canonical_configs()
    assert canonical["diffrank.operators.sorting_network.ComparatorNetwork"] == "diffsort_bitonic"
    assert canonical["diffrank.operators.lapsum.LapSum"] == "lapsum"


def test_docs_table_and_exports_are_generated_from_the_registry():
    """The table lives in one page (docs/operators.md), the pages that used to repeat it link to it; the exports
    of ``diffrank.operators`` are the block that the same command writes."""
    files = default_files()
    assert files == [ROOT / "docs" / "operators.md", ROOT / "src" / "diffrank" / "operators" / "__init__.py"]
    differ = stale(files)
    assert not differ, f"{[str(f.relative_to(ROOT)) for f in differ]}: a generated block is stale; run `{COMMAND}`"
    for page in ("README.md", "docs/api.md", "docs/conventions.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert BEGIN not in text and "operators.md" in text, page


def test_per_config_metadata_names_the_configs_of_its_class():
    """A class that several configs target gives paper / parameter per config: exactly for those configs."""
    by_target: dict[str, set[str]] = {}
    for name in available():
        by_target.setdefault(load_yaml("operator", name)["_target_"], set()).add(name)
    for target, names in by_target.items():
        cls = locate(target)
        for key in ("paper", "parameter"):
            value = vars(cls).get(key)
            if isinstance(value, dict):
                assert set(value) == names, (cls.__name__, key)
            else:
                assert isinstance(value, str) and value and len(names) == 1, (cls.__name__, key)


def test_table_rows():
    lines = render().splitlines()
    assert len(lines) == 3 + len(available())
    assert "| `neuralsort` | `NeuralSort` | all four | 0.5 | τ = 1/β = 2 |" in render()
    assert "| `lapsum` | `LapSum` | all four | 1 | α = −1/β = −1 (" in render()
    assert "`ComparatorNetwork(network=\"splitter_selection\", sigmoid=\"logistic_phi\", art_lambda=0.5)` | " \
           "`topk_membership` | 1 |" in render()
    assert "| `dftopk` | `DFTopK` | `topk_membership` (does not sum to k) |" in render()


def test_replace_block():
    text = f"a\n{BEGIN}\nold\n{END}\nb\n"
    assert replace_block(text, "new") == f"a\n{BEGIN}\nnew\n{END}\nb\n"
    for bad in ("no markers", f"{END}\n{BEGIN}", f"{BEGIN}{BEGIN}{END}"):
        with pytest.raises(ValueError, match="exactly one"):
            replace_block(bad, "new", "x.md")


def test_command_line_check_and_write(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# t\n{BEGIN}\n| stale |\n{END}\n", encoding="utf-8")
    from diffrank.operators.table import main

    assert main(["--check", str(doc)]) == 1
    assert main([str(doc)]) == 0
    assert main(["--check", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8") == f"# t\n{BEGIN}\n{render()}\n{END}\n"
    module = tmp_path / "exports.py"
    module.write_text(f"from typing import TYPE_CHECKING\n{EXPORTS_BEGIN}\n{EXPORTS_END}\n", encoding="utf-8")
    assert main(["--check", str(module)]) == 1
    assert main([str(module)]) == 0
    namespace: dict = {}
    exec(module.read_text(encoding="utf-8"), namespace)
    assert namespace["OPERATOR_MODULES"] == operators.OPERATOR_MODULES
    assert namespace["__all__"] == operators.__all__


# -- planted cases: each check fails on a registry that breaks its rule -----------------------------------------


class PlantedOperator(operators.RankingOperator):
    """A planted operator whose β default (1) differs from its config's (0.5)."""

    capabilities = frozenset({"soft_rank"})
    paper = "nobody"
    parameter = "β"

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__(beta)

    def _soft_rank(self, x):
        return x


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A config folder holding one planted operator config (``PlantedOperator``, β = 0.5 in its yaml);
    returns a function that writes more ``operator/<name>.yaml`` files."""
    module = types.ModuleType("diffrank_planted_registry")
    module.PlantedOperator = PlantedOperator
    # another class of a name that diffrank.operators exports
    module.LapSum = type("LapSum", (PlantedOperator,), {"__module__": module.__name__})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    (tmp_path / "operator").mkdir()
    monkeypatch.setenv("DIFFRANK_CONFIG_DIR", str(tmp_path))

    def write(name: str, text: str) -> None:
        (tmp_path / "operator" / f"{name}.yaml").write_text(text, encoding="utf-8")

    write("planted", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 0.5\n")
    return write


def test_planted_class_default_differing_from_its_config_fails(planted):
    assert default_mismatches() == ["PlantedOperator(beta=1.0) but configs/operator/planted.yaml: 0.5"]
    planted("planted", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 1.0\n")
    assert not default_mismatches()
    planted("planted", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 1.0\nsteps: 3\n")
    assert default_mismatches() == ["planted.yaml sets steps, which PlantedOperator() takes without a default "
                                    "or not at all"]


def test_planted_configs_of_one_class_need_one_canonical(planted, monkeypatch):
    planted("planted_b", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 2.0\n")
    with pytest.raises(ValueError, match="its class attribute canonical must name the one whose values are the "
                                         "class defaults, got None"):
        canonical_configs()
    planted("planted_b", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 1.0\n")
    monkeypatch.setattr(PlantedOperator, "canonical", "planted_c")
    with pytest.raises(ValueError, match="got 'planted_c'"):
        canonical_configs()
    monkeypatch.setattr(PlantedOperator, "canonical", "planted_b")
    assert canonical_configs() == {"diffrank_planted_registry.PlantedOperator": "planted_b"}
    assert not default_mismatches()  # planted.yaml's β = 0.5 is its own value, not the class default


def test_planted_missing_export_fails(planted, monkeypatch):
    """A config whose class is left out of the written-out exports fails the check, and once exported passes."""
    assert export_errors() == [
        "planted: diffrank_planted_registry.PlantedOperator is not diffrank.operators.PlantedOperator",
        "planted: PlantedOperator missing from diffrank.operators.__all__ / dir()"]
    monkeypatch.setitem(operators.OPERATOR_MODULES, "PlantedOperator", "diffrank_planted_registry")
    monkeypatch.setattr(operators, "__all__", [*operators.__all__, "PlantedOperator"])
    assert operators.PlantedOperator is PlantedOperator
    assert not export_errors()


def test_planted_operator_is_exported_by_the_command(planted):
    """A new config is all the command needs: its class enters the written-out exports; a stale block fails."""
    block = render_exports()
    assert '    "PlantedOperator": "diffrank_planted_registry",' in block
    assert "    from diffrank_planted_registry import PlantedOperator" in block
    init = Path(operators.__file__)
    assert stale([init]) == [init]


def test_planted_class_name_clash_fails(planted):
    """A config whose class has the name of another exported class is not diffrank.operators.<name>."""
    planted("clash", "_target_: diffrank_planted_registry.LapSum\nbeta: 1.0\n")
    assert "clash: diffrank_planted_registry.LapSum is not diffrank.operators.LapSum" in export_errors()
    planted("lapsum", "_target_: diffrank.operators.lapsum.LapSum\nbeta: 1.0\n")
    with pytest.raises(ValueError, match="can export one class of each name"):
        render_exports()


class PlantedChild(PlantedOperator):
    """A planted subclass that sets no paper of its own (its parent's does not count)."""


def test_planted_class_without_paper_fails_the_table(planted, monkeypatch):
    monkeypatch.setattr(sys.modules["diffrank_planted_registry"], "PlantedChild", PlantedChild, raising=False)
    planted("bare", "_target_: diffrank_planted_registry.PlantedChild\nbeta: 1.0\n")
    with pytest.raises(ValueError, match=r"bare.yaml lacks \['paper', 'parameter'\] \(paper and parameter are "
                                         r"attributes of PlantedChild"):
        render()
    assert load("bare").beta == 1.0  # the config itself is fine for load()
