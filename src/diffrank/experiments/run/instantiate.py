"""The one place that calls ``hydra.utils.instantiate`` (Hydra 1.4's allow-list goes here)."""

from __future__ import annotations

from typing import Any

import hydra.utils
from hydra.errors import InstantiationException

# Errors our constructors raise on bad input; Hydra wraps them, we hand them on as they are so that
# users (and tests) see ``ValueError: P_K has negative mass …`` rather than an InstantiationException.
_USER_ERRORS = (ValueError, TypeError, FileNotFoundError, KeyError, RuntimeError)


def instantiate(cfg: Any, **kwargs: Any) -> Any:
    """Instantiate a config node with a ``_target_``; ``kwargs`` are passed at the call site.

    Args:
        cfg: an OmegaConf node or dict with ``_target_``.
        **kwargs: extra constructor arguments (objects such as the operator or P_K).

    Returns:
        The built object.

    Raises:
        The constructor's own ValueError / TypeError / FileNotFoundError / KeyError / RuntimeError
        (with a note naming the target), or Hydra's InstantiationException for anything else.
    """
    try:
        return hydra.utils.instantiate(cfg, _convert_="all", **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, _USER_ERRORS):
            cause.add_note(f"(while building {cfg.get('_target_', '?') if hasattr(cfg, 'get') else cfg})")
            raise cause from None
        raise
