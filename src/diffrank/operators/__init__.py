"""Relaxed ranking operators; the registry is the folder ``configs/operator/`` (shipped in the wheel).

``load(name, **overrides)`` builds an operator from ``configs/operator/<name>.yaml`` without Hydra, so user
code, tests, scripts and notebooks use the same definitions as ``train.py``. The classes are exported too
(``from diffrank.operators import LapSum``), imported on first access so that ``import diffrank.operators``
stays light (fast soft sort brings numba, the kernels Triton).

Convention of every operator method: scores ``(B, n)``; P has rows = ranks (rank 1 = largest) and columns =
items. :mod:`diffrank.functional` wraps them in torch's conventions (ascending, any ``dim``).
"""

from __future__ import annotations

import importlib
from typing import Any

from diffrank.operators.base import RankingOperator
from diffrank.registry import build, list_options, load_yaml

_CLASSES = {
    "ComparatorNetwork": "sorting_network", "DFTopK": "dftopk", "FastSoftSort": "fast_soft_sort", "LapSum": "lapsum",
    "NeuralSort": "neuralsort", "RelaxedBubbleSort": "relaxed_bubble_sort", "SinkhornSort": "sinkhorn",
    "SoftSort": "softsort", "SoftTopK": "soft_topk", "SparseSoftTopK": "sparse_soft_topk",
}


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return getattr(importlib.import_module(f"diffrank.operators.{_CLASSES[name]}"), name)
    raise AttributeError(f"module 'diffrank.operators' has no attribute '{name}'")


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


__all__ = ["RankingOperator", "available", "load", *_CLASSES]
