"""Writing generated row configs (:mod:`diffrank.experiments.rows.sorting`,
:mod:`diffrank.experiments.rows.topk`): one rule for files and one for YAML."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def write_generated(out: Path, tables: Iterable[str], files: dict[str, str]) -> dict[str, str]:
    """Write generated row configs (``python -m diffrank.experiments.rows.sorting`` / ``generate_topk``) and
    delete stale ones.

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


def render_rows(rows: Sequence[Any], render_row: Callable[[Any], str]) -> dict[str, str]:
    """``{"<row.name>.yaml": render_row(row)}`` for a generator's rows (each with a ``name``).

    Raises:
        ValueError: two rows share a name (one would overwrite the other).
    """
    out = {f"{r.name}.yaml": render_row(r) for r in rows}
    if len(out) != len(rows):
        raise ValueError("two rows share a name")
    return out


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
