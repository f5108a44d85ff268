"""The OmegaConf resolvers of the configs, which every run needs before Hydra composes.

Two of them make the configs resolve in every mode, a single run and a multirun: ``${project_root:}`` (the folder
``paths.root_dir`` defaults to, found like lightning-hydra-template's ``rootutils`` by a marker file) and
``${hydra_any:KEY}`` (Hydra's own config, also while Hydra prepares a sweep: ``${hydra:KEY}`` needs a job's
``HydraConfig``, which Hydra sets only inside each job, after it has made the sweep folder).

The factor-2 temperature grid of the papers (Petersen et al., ICML 2022, §5 / the diffsort and difftopk READMEs
tune β on a grid of powers of two) is the resolver ``${beta_grid:0.0625,16}`` (:func:`beta_grid`), used by
``configs/hparams_search/beta_grid.yaml``; :func:`register_resolvers` registers it. Nothing registers on import:
the entry points call it (``train.py``, ``diffrank-train``, ``tests/conftest.py``) before Hydra composes.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

from diffrank.experiments.callbacks.job_env import SWEPT_KEYS_ENV

#: the file that marks the project's root folder (as lightning-hydra-template's ``.project-root``)
ROOT_MARKER = ".project-root"


def project_root(start: str | os.PathLike[str] | None = None) -> str:
    """The folder runs write under by default (``paths.root_dir``; ``outputs/`` and ``data/`` lie in it).

    ``$DIFFRANK_ROOT`` when set; else the nearest folder at or above ``start`` (default: the working directory)
    that holds :data:`ROOT_MARKER` (a checkout of this repository); else the working directory itself (an
    installed ``diffrank-train`` run outside a checkout writes under the folder it was started in).

    Returns:
        An absolute path, as a string.
    """
    env = os.environ.get("DIFFRANK_ROOT")
    if env:
        return str(Path(env).expanduser().resolve())
    here = Path(start if start is not None else os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ROOT_MARKER).is_file():
            return str(folder)
    return str(here)


def _hydra_any(key: str, *, _root_: Any) -> Any:
    """``${hydra_any:KEY}``: ``KEY`` of Hydra's config: the job's ``HydraConfig`` when set (inside a job),
    else the composed config's own ``hydra`` node (while Hydra makes a sweep folder, before any job)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if HydraConfig.initialized():
        return OmegaConf.select(HydraConfig.get(), key)
    node = _root_.get("hydra") if hasattr(_root_, "get") else None
    if node is None:
        raise ValueError(f"${{hydra_any:{key}}}: neither a Hydra job nor a config composed with its hydra node")
    return OmegaConf.select(node, key)


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


def split_top_level(text: str) -> list[str]:
    """Split ``text`` at the commas outside brackets, braces and quotes, as Hydra reads a list of values or a job's
    ``override_dirname``: ``a=1,b=[2,3],c=x`` → ``["a=1", "b=[2,3]", "c=x"]``.

    Raises:
        ValueError: a closing bracket without its opening one, or brackets or quotes left open.
    """
    out, depth, quote, current = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth < 0:
                raise ValueError("a closing bracket without its opening one")
        elif ch == "," and depth == 0:
            out.append(current)
            current = ""
            continue
        current += ch
    if depth or quote:
        raise ValueError("unbalanced brackets or quotes")
    out.append(current)
    return out


def _override_key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def job_dir_name(override_dirname: Any, width: int = 120) -> str:
    """A multirun job's folder name, keyed on its config: Hydra's ``override_dirname`` (the job's overrides,
    ``operator.beta=2,operator=softsort``) with ``/`` made ``-``, then ``_`` and :func:`_short_hash` of the whole
    ``override_dirname`` (so the name is unique however it was cut).

    The swept keys come first (``$DIFFRANK_SWEPT_KEYS``, which the sweep callback sets from the command line and
    the ``hparams_search`` config before the first job), then the other overrides; whole ``key=value`` items are
    kept while they fit in ``width`` characters, and what does not fit is only in the hash. Two grids run into one
    sweep folder thus share a folder only for the same config: a finished job of another config is never
    overwritten, and a job's ``last.ckpt`` is always its own config's.
    """
    text = str(override_dirname)
    swept = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k]
    try:
        items = [it for it in split_top_level(text) if it]
    except ValueError:  # not Hydra's own joining: keep it whole
        items = [text] if text else []
    rank = {k: i for i, k in enumerate(swept)}
    items.sort(key=lambda it: rank.get(_override_key(it), len(rank)))  # stable: the rest keep Hydra's order
    kept: list[str] = []
    for item in (it.replace("/", "-") for it in items):
        if len(",".join([*kept, item])) > width:
            break
        kept.append(item)
    readable = ",".join(kept) or (text.replace("/", "-")[:width] if text else "defaults")
    return f"{readable}_{_short_hash(text)}"


def register_resolvers() -> None:
    """Register the OmegaConf resolvers of the configs (idempotent).

    - ``${beta_grid:LOW,HIGH}`` → ``"LOW,2LOW,…"``: a sweep choice list (:func:`beta_grid`);
    - ``${job_dir:${hydra.job.override_dirname}}`` → :func:`job_dir_name`: multirun job folders keyed on the
      job's config (``configs/hydra/default.yaml``);
    - ``${short_hash:TEXT}`` → 8 hex digits of SHA-1(TEXT): folder names of Optuna trials
      (``${hydra.job.num}_${short_hash:${hydra.job.override_dirname}}``), so that a resumed search, whose job
      numbers restart at 0, never writes into a finished trial's folder;
    - ``${project_root:}`` → :func:`project_root` (``paths.root_dir``);
    - ``${hydra_any:KEY}`` → Hydra's ``KEY`` in a job and while Hydra prepares a sweep (task names, W&B names).
    """
    from omegaconf import OmegaConf

    for name, fn in (("beta_grid", _beta_grid_resolver), ("short_hash", _short_hash), ("job_dir", job_dir_name),
                     ("project_root", lambda: project_root()), ("hydra_any", _hydra_any)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


__all__ = ["ROOT_MARKER", "SWEPT_KEYS_ENV", "beta_grid", "job_dir_name", "project_root", "register_resolvers",
           "split_top_level"]
