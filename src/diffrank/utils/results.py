"""``results.json``: the record of one run that the paper report reads."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("torch", "lightning", "hydra-core", "torchmetrics", "timm", "numpy", "diffrank")


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """``{"git_sha": str | None, "git_dirty": bool | None}`` of the repository holding ``cwd``."""
    cwd = str(cwd or Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                    capture_output=True, text=True, timeout=10, check=True).stdout.strip())
        return {"git_sha": sha, "git_dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide a result."""
    out: dict[str, str | None] = {}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    out["python"] = platform.python_version()
    return out


def device_description() -> str:
    """The accelerator (CUDA device name) or the CPU with its thread count."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def to_float(v: Any) -> Any:
    """Tensors and numpy scalars → Python floats (for JSON)."""
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if hasattr(v, "item"):
        return v.item()
    return v


def write_results(path: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as indented JSON to ``path`` (folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str))
    return path
