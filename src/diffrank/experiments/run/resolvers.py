"""The OmegaConf resolvers of the configs, which every run needs before Hydra composes.

The factor-2 temperature grid of the papers (Petersen et al., ICML 2022, §5 / the diffsort and difftopk READMEs
tune β on a grid of powers of two) is the resolver ``${beta_grid:0.0625,16}`` (:func:`beta_grid`), used by
``configs/hparams_search/beta_grid.yaml``; :func:`register_resolvers` registers it. Nothing registers on import:
the entry points call it (``train.py``, ``diffrank-train``, ``tests/conftest.py``) before Hydra composes.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any


def beta_grid(low: float, high: float) -> list[float]:
    """The factor-2 grid ``low, 2 low, 4 low, …`` up to ``high`` (inclusive within 1e-9 relative).

    Args:
        low: first value, > 0 (e.g. 0.0625 = 2⁻⁴).
        high: last value, >= ``low``; need not be ``low`` times a power of two (the grid stops below it).

    Returns:
        The grid as floats (β, inverse temperature; unitless).

    Raises:
        ValueError: non-finite or non-positive bounds, ``high < low``, or more than 64 points.
    """
    low, high = float(low), float(high)
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0 or high < low:
        raise ValueError(f"beta_grid needs 0 < low <= high (finite), got low={low}, high={high}")
    n = int(math.floor(math.log2(high / low) + 1e-9)) + 1
    if n > 64:
        raise ValueError(f"beta_grid from {low} to {high} has {n} points; at most 64")
    return [low * 2.0**i for i in range(n)]


def _beta_grid_resolver(low: Any, high: Any) -> str:
    # a sweep override string (``a,b,c``): Hydra's sweeper parses the resolved params value as a choice list
    return ",".join(repr(v) for v in beta_grid(float(low), float(high)))


def _short_hash(text: Any) -> str:
    return hashlib.sha1(str(text).encode()).hexdigest()[:8]


def job_dir_name(override_dirname: Any, width: int = 96) -> str:
    """A multirun job's folder name, keyed on its config: Hydra's ``override_dirname`` (the job's overrides,
    sorted: ``operator.beta=2,operator=softsort``) with ``/`` made ``-``, cut to ``width`` characters, then ``_``
    and :func:`_short_hash` of the whole ``override_dirname`` (so the name is unique however it was cut).

    Two grids run into one sweep folder thus share a folder only for the same config: a finished job of
    another config is never overwritten, and a job's ``last.ckpt`` is always its own config's.
    """
    text = str(override_dirname)
    readable = text.replace("/", "-")[:width] or "defaults"
    return f"{readable}_{_short_hash(text)}"


def register_resolvers() -> None:
    """Register the OmegaConf resolvers of the configs (idempotent).

    - ``${beta_grid:LOW,HIGH}`` → ``"LOW,2LOW,…"``: a sweep choice list (:func:`beta_grid`);
    - ``${job_dir:${hydra.job.override_dirname}}`` → :func:`job_dir_name`: multirun job folders keyed on the
      job's config (``configs/hydra/default.yaml``);
    - ``${short_hash:TEXT}`` → 8 hex digits of SHA-1(TEXT): folder names of Optuna trials
      (``${hydra.job.num}_${short_hash:${hydra.job.override_dirname}}``), so that a resumed search, whose job
      numbers restart at 0, never writes into a finished trial's folder.
    """
    from omegaconf import OmegaConf

    for name, fn in (("beta_grid", _beta_grid_resolver), ("short_hash", _short_hash), ("job_dir", job_dir_name)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


__all__ = ["beta_grid", "job_dir_name", "register_resolvers"]
