"""The config folder as a registry, without Hydra: where ``configs/`` is, what a group offers, and building an
object from a ``_target_`` node (the library's :func:`diffrank.operators.load` uses it; the experiment
framework builds with Hydra's ``instantiate``, :mod:`diffrank.experiments.run.instantiate`).

``configs/`` lives at the top of the repository and ships inside the wheel as ``diffrank.configs`` (package
data), so a checkout, an editable install and an installed wheel all find the same files.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def config_dir() -> Path:
    """The ``configs/`` folder: ``$DIFFRANK_CONFIG_DIR`` if set, else the installed ``diffrank.configs`` package
    (a wheel, or an editable install that maps it to the checkout's ``configs/``), else the checkout's
    ``configs/`` beside ``src/`` (``PYTHONPATH=src``).

    Raises:
        FileNotFoundError: if none of these exists (the message names all three).
    """
    env = os.environ.get("DIFFRANK_CONFIG_DIR")
    candidates = [Path(env)] if env else []
    with contextlib.suppress(ImportError, TypeError):  # TypeError: a namespace package has no __file__
        candidates.append(Path(importlib.import_module("diffrank.configs").__file__).parent)
    candidates.append(Path(__file__).resolve().parents[2] / "configs")
    for path in candidates:
        if (path / "operator").is_dir():
            return path
    raise FileNotFoundError(
        f"diffrank's config folder was not found (looked at {', '.join(map(str, candidates))}); reinstall "
        "diffrank (the wheel ships configs/ as diffrank.configs) or set DIFFRANK_CONFIG_DIR to a configs/ folder"
    )


def list_options(group: str, pattern: str = "*") -> list[str]:
    """Sorted option names of a config group, found recursively, matching a glob ``pattern``.

    ``list_options("operator")``; ``list_options("experiment", "sorting/thesis_t3_7/*")`` gives
    ``["sorting/thesis_t3_7/bitonic_art_n16", …]``, the names ``experiment=`` takes (Hydra's own
    ``glob()`` sweep sees only the files directly in the group folder).
    """
    root = config_dir() / group
    names = (p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def load_yaml(group: str, name: str) -> dict[str, Any]:
    """``configs/<group>/<name>.yaml`` as a plain dict (PyYAML; no interpolation is resolved).

    Raises:
        ValueError: no such option (the message lists the group's options).
    """
    import yaml

    path = config_dir() / group / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown {group} '{name}'; known {group}s: {', '.join(list_options(group))}")
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def locate(target: str) -> Any:
    """The object a dotted ``_target_`` names (``"diffrank.operators.sinkhorn.SinkhornSort"``).

    Raises:
        ImportError: the module or attribute does not exist.
    """
    module, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ImportError(f"cannot locate _target_ '{target}': {e}") from None


def build(node: Any) -> Any:
    """Build a config node: a mapping with ``_target_`` becomes ``target(**built arguments)``, recursively;
    lists and other mappings are built element-wise; anything else is returned as is.

    The library's subset of Hydra's ``instantiate`` (no interpolation, no ``_partial_``): enough for the
    operator, P_K and loss configs, without importing Hydra.

    Raises:
        ValueError: a string with an unresolved ``${…}`` interpolation (it needs the experiment framework).
        ImportError: an unknown ``_target_``.
    """
    if isinstance(node, Mapping):
        args = {k: build(v) for k, v in node.items() if not str(k).startswith("_")}
        return locate(node["_target_"])(**args) if "_target_" in node else args
    if isinstance(node, (list, tuple)):
        return [build(v) for v in node]
    if isinstance(node, str) and "${" in node:
        raise ValueError(f"'{node}' is an interpolation: build this config with the experiment framework "
                         "(diffrank.experiments.run.instantiate) or pass the value explicitly")
    return node
