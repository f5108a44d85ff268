"""Where the Hydra config tree lives, and what options a config group has."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def config_dir() -> Path:
    """The ``configs/`` folder: ``$DIFFRANK_CONFIG_DIR`` if set, else the one beside ``src/``.

    Raises:
        FileNotFoundError: if no such folder exists (e.g. a non-editable install without the repo).
    """
    env = os.environ.get("DIFFRANK_CONFIG_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "configs"
    if not path.is_dir():
        raise FileNotFoundError(
            f"diffrank's config folder was not found at {path}; install the repository in editable "
            "mode (pip install -e .) or set DIFFRANK_CONFIG_DIR to its configs/ folder"
        )
    return path


def list_options(group: str, pattern: str = "*") -> list[str]:
    """Sorted option names of a config group, found recursively, matching a glob ``pattern``.

    ``list_options("operator")``; ``list_options("experiment", "sorting/thesis_t3_7/*")`` gives
    ``["sorting/thesis_t3_7/bitonic_art_n16", …]``, the names ``experiment=`` takes (Hydra's own
    ``glob()`` sweep sees only the files directly in the group folder).
    """
    root = config_dir() / group
    names = (p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def write_generated(out: Path, tables: Iterable[str], files: dict[str, str]) -> dict[str, str]:
    """Write generated row configs (``scripts/make_*_experiments.py``) and delete stale ones.

    Args:
        out: the benchmark's experiment folder (``configs/experiment/sorting``).
        tables: the table folders under ``out`` that the generator owns; a yaml in them not in ``files`` is
            removed (a renamed row leaves no stale copy behind).
        files: ``{path relative to out: yaml text}``.

    Returns:
        ``files``.
    """
    for table in tables:
        for old in (out / table).glob("*.yaml"):
            if f"{table}/{old.name}" not in files:
                old.unlink()
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return files


_YAML_WORDS = ("true", "false", "null", "yes", "no", "on", "off")


def yaml_flow(v: Any) -> str:
    """``v`` (dicts, lists, str, int, float, bool) as one line of YAML flow style, for generated configs:
    floats to 10 significant digits, strings quoted unless they are plain words (letters first; no YAML keyword)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_flow(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(float(f"{v:.10g}"))
    if isinstance(v, int):
        return str(v)
    s = str(v)
    plain = re.fullmatch(r"[^\W\d_][\w .&()\-]*", s) and s.lower() not in _YAML_WORDS and not s.endswith(" ")
    return s if plain else '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
