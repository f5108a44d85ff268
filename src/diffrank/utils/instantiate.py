"""The one place that calls ``hydra.utils.instantiate`` (Hydra 1.4's allow-list goes here)."""

from __future__ import annotations

from typing import Any

import hydra.utils


def instantiate(cfg: Any, **kwargs: Any) -> Any:
    """Instantiate a config node with a ``_target_``; ``kwargs`` are passed at the call site.

    Args:
        cfg: an OmegaConf node or dict with ``_target_``.
        **kwargs: extra constructor arguments (objects such as the operator or P_K).

    Returns:
        The built object.
    """
    return hydra.utils.instantiate(cfg, _convert_="all", **kwargs)
