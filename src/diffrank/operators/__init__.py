"""Relaxed ranking operators; the registry of their configs is the folder ``configs/operator/`` (shipped in the
wheel).

``load(name, **overrides)`` builds an operator from ``configs/operator/<name>.yaml`` without Hydra, so user
code, tests, scripts and notebooks use the same definitions as ``train.py``. Every operator class is exported
(``from diffrank.operators import LapSum``), written out below; its module is imported on first access, so that
``import diffrank.operators`` stays light (the sparse soft top-k brings numba, the kernels Triton).
``tests/operators/test_registry.py`` keeps the list complete: every :class:`RankingOperator` subclass of the
package and every class a config targets is exported. The operator table of the docs (docs/operators.md) is
generated from the configs and the classes' metadata (:mod:`diffrank.operators.table`).

Convention of every operator method: scores ``(B, n)``; P has rows = ranks (rank 1 = largest) and columns =
items. :mod:`diffrank.functional` wraps them in torch's conventions (ascending, any ``dim``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from diffrank.operators.base import RankingOperator
from diffrank.registry import build, list_options, load_yaml

if TYPE_CHECKING:
    from diffrank.operators.dftopk import DFTopK
    from diffrank.operators.fast_soft_sort import FastSoftSort
    from diffrank.operators.gumbel_sinkhorn import GumbelSinkhorn
    from diffrank.operators.lapsum import LapSum
    from diffrank.operators.neuralsort import NeuralSort
    from diffrank.operators.neuralsort_stochastic import NeuralSortStochastic
    from diffrank.operators.relaxed_bubble_sort import RelaxedBubbleSort
    from diffrank.operators.sinkhorn import SinkhornSort
    from diffrank.operators.soft_topk import SoftTopK
    from diffrank.operators.softsort import SoftSort
    from diffrank.operators.sorting_network import ComparatorNetwork
    from diffrank.operators.sparse_soft_topk import SparseSoftTopK

__all__ = [
    "ComparatorNetwork",
    "DFTopK",
    "FastSoftSort",
    "GumbelSinkhorn",
    "LapSum",
    "NeuralSort",
    "NeuralSortStochastic",
    "RankingOperator",
    "RelaxedBubbleSort",
    "SinkhornSort",
    "SoftSort",
    "SoftTopK",
    "SparseSoftTopK",
    "available",
    "load",
]

#: operator class → the module that defines it (imported on first access)
OPERATOR_MODULES = {
    "ComparatorNetwork": "diffrank.operators.sorting_network",
    "DFTopK": "diffrank.operators.dftopk",
    "FastSoftSort": "diffrank.operators.fast_soft_sort",
    "GumbelSinkhorn": "diffrank.operators.gumbel_sinkhorn",
    "LapSum": "diffrank.operators.lapsum",
    "NeuralSort": "diffrank.operators.neuralsort",
    "NeuralSortStochastic": "diffrank.operators.neuralsort_stochastic",
    "RelaxedBubbleSort": "diffrank.operators.relaxed_bubble_sort",
    "SinkhornSort": "diffrank.operators.sinkhorn",
    "SoftSort": "diffrank.operators.softsort",
    "SoftTopK": "diffrank.operators.soft_topk",
    "SparseSoftTopK": "diffrank.operators.sparse_soft_topk",
}


def __getattr__(name: str) -> Any:
    if name in OPERATOR_MODULES:
        return getattr(import_module(OPERATOR_MODULES[name]), name)
    raise AttributeError(f"module 'diffrank.operators' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
