"""Relaxed ranking operators; the registry is the folder ``configs/operator/`` (shipped in the wheel).

``load(name, **overrides)`` builds an operator from ``configs/operator/<name>.yaml`` without Hydra, so user
code, tests, scripts and notebooks use the same definitions as ``train.py``. Every class that a config targets
(its ``_target_``) is exported too (``from diffrank.operators import LapSum``): the name → module map is read
from the configs and the module imported on first access, so that ``import diffrank.operators`` stays light
(fast soft sort brings numba, the kernels Triton) and a new config's class is exported without an edit here.
The operator table of the docs is generated from the same configs (:mod:`diffrank.operators.table`).

Convention of every operator method: scores ``(B, n)``; P has rows = ranks (rank 1 = largest) and columns =
items. :mod:`diffrank.functional` wraps them in torch's conventions (ascending, any ``dim``).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from diffrank.operators.base import RankingOperator
from diffrank.registry import build, config_dir, list_options, load_yaml, locate

_OWN = ("RankingOperator", "available", "exported_classes", "load")
_TARGET = re.compile(r"^_target_:\s*['\"]?([\w.]+)['\"]?\s*(?:#.*)?$", re.MULTILINE)


@cache
def _targets(folder: Path, mtime_ns: int) -> dict[str, str]:
    """Class name → dotted ``_target_`` of every config in ``folder`` (the operator group), read without YAML;
    cached per modification time of the folder (a config added or removed is seen).

    Raises:
        ValueError: two configs target different classes of one name (the export would be ambiguous).
    """
    out: dict[str, str] = {}
    for path in sorted(folder.rglob("*.yaml")):
        hit = _TARGET.search(path.read_text(encoding="utf-8"))
        if hit is None:
            continue
        target = hit.group(1)
        name = target.rpartition(".")[2]
        if out.setdefault(name, target) != target:
            raise ValueError(f"two operator configs target classes named {name!r} ({out[name]} and {target}, "
                             f"the latter in {path}); rename one class: diffrank.operators.{name} must be one class")
    return out


def exported_classes() -> dict[str, str]:
    """Class name → dotted ``_target_`` of every class that a ``configs/operator/*.yaml`` targets, i.e. the
    classes exported as ``diffrank.operators.<name>`` (imported on first access).

    Raises:
        ValueError: two configs target different classes of one name.
        FileNotFoundError: no config folder (see :func:`diffrank.registry.config_dir`).
    """
    folder = config_dir() / "operator"
    return dict(_targets(folder, folder.stat().st_mtime_ns))


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return [*_OWN, *sorted(exported_classes())]
    if not name.startswith("_") and name in (targets := exported_classes()):
        return locate(targets[name])
    raise AttributeError(f"module 'diffrank.operators' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted({*globals(), *exported_classes()})


def available() -> list[str]:
    """Names of every operator config (``configs/operator/*.yaml``), sorted."""
    return list_options("operator")


def load(name: str, **overrides: Any) -> RankingOperator:
    """Build an operator from ``configs/operator/<name>.yaml`` (no Hydra needed).

    Args:
        name: the config name, e.g. ``"sinkhorn"`` (see :func:`available`).
        **overrides: values that replace the yaml's, e.g. ``beta=2.0``.

    Returns:
        The instantiated :class:`RankingOperator`.

    Raises:
        ValueError: for an unknown name (the message lists the known ones), or the operator's own
            ValueError / TypeError for bad parameters.
    """
    cfg = load_yaml("operator", name)
    return build({**cfg, **overrides})
