"""Relaxed ranking operators; the registry is the folder ``configs/operator/``.

``load(name, **overrides)`` builds an operator from ``configs/operator/<name>.yaml`` outside Hydra,
so tests, scripts and notebooks use the same definitions as ``train.py``.
"""

from __future__ import annotations

from diffrank.operators.base import RankingOperator
from diffrank.utils.configs import config_dir, list_options


def available() -> list[str]:
    """Names of every operator config (``configs/operator/*.yaml``), sorted."""
    return list_options("operator")


def load(name: str, **overrides) -> RankingOperator:
    """Build an operator from ``configs/operator/<name>.yaml``.

    Args:
        name: the config name, e.g. ``"sinkhorn"``.
        **overrides: values that replace the yaml's, e.g. ``beta=2.0``.

    Returns:
        The instantiated :class:`RankingOperator`.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    from omegaconf import OmegaConf

    from diffrank.utils.instantiate import instantiate

    known = available()
    if name not in known:
        raise ValueError(f"unknown operator '{name}'; known operators: {', '.join(known)}")
    cfg = OmegaConf.load(config_dir() / "operator" / f"{name}.yaml")
    cfg = OmegaConf.merge(cfg, OmegaConf.create(overrides))
    return instantiate(cfg)


__all__ = ["RankingOperator", "available", "load"]
