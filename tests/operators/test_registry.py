"""The operator registry is the config folder ``configs/operator/``, and nothing else holds a copy that can drift:
every class a config targets is exported by ``diffrank.operators``, each class's constructor defaults are the
values of its canonical config, and the operator tables of the docs are generated from the configs.

Each check is a function of the current config folder (``DIFFRANK_CONFIG_DIR``), so the planted cases below run
it on a temporary folder and show that it fails.
"""

from __future__ import annotations

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
    canonical_configs,
    constructor_defaults,
    render,
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
    assert set(operators.exported_classes()) >= {"LapSum", "ComparatorNetwork", "NeuralSort", "DFTopK"}
    namespace: dict = {}
    exec("from diffrank.operators import *", namespace)
    assert {"LapSum", "load", "available", "RankingOperator"} <= set(namespace)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchOperator'"):
        operators.NoSuchOperator  # noqa: B018


def test_import_stays_light():
    """``import diffrank.operators`` imports no operator class's module (nor numba); a class imports only its own."""
    code = ("import sys, diffrank.operators as o\n"
            "mods = {t.rpartition('.')[0] for t in o.exported_classes().values()} | {'numba'}\n"
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


def test_docs_tables_are_generated_from_the_registry():
    files = [ROOT / "README.md", ROOT / "docs" / "api.md", ROOT / "docs" / "conventions.md"]
    differ = stale(files)
    assert not differ, f"{[str(f.relative_to(ROOT)) for f in differ]}: the operator table is stale; run `{COMMAND}`"


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


# -- planted cases: each check fails on a registry that breaks its rule -----------------------------------------


class PlantedOperator(operators.RankingOperator):
    """A planted operator whose β default (1) differs from its config's (0.5)."""

    capabilities = frozenset({"soft_rank"})

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
    module.LapSum = PlantedOperator  # a class name that the shipped configs already export
    monkeypatch.setitem(sys.modules, module.__name__, module)
    (tmp_path / "operator").mkdir()
    monkeypatch.setenv("DIFFRANK_CONFIG_DIR", str(tmp_path))

    def write(name: str, text: str) -> None:
        (tmp_path / "operator" / f"{name}.yaml").write_text(
            f"# paper: nobody\n# parameter: β\n{text}", encoding="utf-8")

    write("planted", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 0.5\n")
    return write


def test_planted_class_default_differing_from_its_config_fails(planted):
    assert default_mismatches() == ["PlantedOperator(beta=1.0) but configs/operator/planted.yaml: 0.5"]
    planted("planted", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 1.0\n")
    assert not default_mismatches()
    planted("planted", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 1.0\nsteps: 3\n")
    assert default_mismatches() == ["planted.yaml sets steps, which PlantedOperator() takes without a default "
                                    "or not at all"]


def test_planted_configs_of_one_class_need_one_canonical(planted):
    planted("planted_b", "_target_: diffrank_planted_registry.PlantedOperator\nbeta: 2.0\n")
    with pytest.raises(ValueError, match="exactly one of them needs a '# canonical: …' line"):
        canonical_configs()
    planted("planted_b", "# canonical: the class defaults\n_target_: diffrank_planted_registry.PlantedOperator\n"
                         "beta: 1.0\n")
    assert canonical_configs() == {"diffrank_planted_registry.PlantedOperator": "planted_b"}
    assert not default_mismatches()  # planted.yaml's β = 0.5 is its own value, not the class default


def test_planted_class_is_exported_without_an_edit(planted):
    """A new config's class is exported the moment the config exists (no hand-edited list) …"""
    assert operators.PlantedOperator is PlantedOperator
    assert not export_errors()


def test_planted_missing_export_fails(planted, monkeypatch):
    """… and a class left out of the exports (what a hand-edited list did) fails the check."""
    monkeypatch.setattr(operators, "exported_classes", lambda: {})
    assert export_errors() == [
        "planted: diffrank_planted_registry.PlantedOperator is not diffrank.operators.PlantedOperator",
        "planted: PlantedOperator missing from diffrank.operators.__all__ / dir()"]


def test_planted_class_name_clash_fails(planted, monkeypatch):
    """Two configs targeting different classes of one name cannot both be diffrank.operators.<name>."""
    planted("clash", "_target_: diffrank_planted_registry.LapSum\nbeta: 1.0\n")
    planted("lapsum", "_target_: diffrank.operators.lapsum.LapSum\nbeta: 1.0\n")
    with pytest.raises(ValueError, match="two operator configs target classes named 'LapSum'"):
        operators.LapSum  # noqa: B018


def test_planted_config_without_paper_fails_the_table(planted, tmp_path):
    (tmp_path / "operator" / "bare.yaml").write_text("_target_: diffrank_planted_registry.PlantedOperator\n"
                                                     "beta: 1.0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bare.yaml lacks \['paper', 'parameter'\]"):
        render()
    assert load("bare").beta == 1.0  # the config itself is fine for load()
