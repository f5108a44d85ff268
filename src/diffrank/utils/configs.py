"""Where the Hydra config tree lives, and what options a config group has."""

from __future__ import annotations

import os
from pathlib import Path


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


def list_options(group: str) -> list[str]:
    """Sorted option names of a config group, e.g. ``list_options("operator")``."""
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
