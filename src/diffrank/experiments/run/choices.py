"""The config groups a run used, as its record and its W&B tags name them.

The ``operator`` and ``pk`` groups are read only through interpolation (``operator: ${operator}``, ``p_k: ${pk}``
in a loss yaml). A group that the built loss does not hold (P_K in a sorting run, the operator with
``loss=softmax_ce``) is dropped from the config and from the recorded choices (:func:`drop_unused_groups`). A ``pk``
choice whose weights were changed (``pk=half_top5 pk.weights=[…]``, or a row's ``pk: {weights: …}``) is recorded as
what ran (:func:`pk_as_run`), not as the option's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from diffrank.registry import config_dir, load_yaml

# groups built only where another node interpolates them (the loss reads ${operator} and ${pk})
INTERPOLATED_GROUPS = ("operator", "pk")


def drop_unused_groups(cfg: DictConfig, choices: dict[str, Any], loss: Any) -> dict[str, Any]:
    """Set every group of :data:`INTERPOLATED_GROUPS` that the built ``loss`` does not hold to ``None`` (in place):
    ``operator`` unless the loss has an ``operator``, ``pk`` unless it has a ``p_k``; without a loss (``None``: the
    model brings its own) the ``loss`` choice is dropped too. Those groups are read only
    through the loss yaml's ``${operator}`` / ``${pk}``, so the built loss says what the run used.

    Returns:
        ``choices`` without those groups.
    """
    held = {"operator": getattr(loss, "operator", None), "pk": getattr(loss, "p_k", None)}
    unused = [group for group in INTERPOLATED_GROUPS if held[group] is None and cfg.get(group) is not None]
    with open_dict(cfg):
        for group in unused:
            cfg[group] = None
    if loss is None:  # the model brings its own (model.algorithm): the loss group's choice names nothing it ran
        unused.append("loss")
    return {k: v for k, v in choices.items() if k not in unused}


def _trimmed(weights: Sequence[float]) -> tuple[float, ...]:
    """P_K weights without trailing zeros (``[1]`` and ``[1, 0, 0, 0, 0]`` are the same P_K)."""
    w = [float(v) for v in weights]
    while w and w[-1] == 0.0:
        w.pop()
    return tuple(w)


def pk_as_run(cfg: DictConfig, choices: dict[str, Any]) -> dict[str, Any]:
    """``choices`` with ``pk`` naming the P_K the run trains with (``cfg.pk.weights``): the chosen option when the
    weights are its own (``configs/pk/<option>.yaml``), else the option that has those weights, else the weights in
    the spelling of the reference tables and the P_K report (``"[.3,0,0,0,.7]"``). ``pk=half_top5
    pk.weights=[0.3,0,0,0,0.7]`` is thus recorded (``results.json``'s ``choices``, the W&B tag ``pk:…``) as
    ``[.3,0,0,0,.7]``, not as ``half_top5``; the command line (``overrides``) keeps the override itself."""
    name, node = choices.get("pk"), cfg.get("pk")
    if name is None or not isinstance(node, DictConfig) or node.get("weights") is None:
        return choices
    weights = _trimmed(OmegaConf.to_container(node.weights, resolve=True))

    def option_weights(option: str) -> tuple[float, ...] | None:
        """The weights of ``configs/pk/<option>.yaml`` (None: no such option, or no weights)."""
        try:
            w = load_yaml("pk", option).get("weights")
        except (ValueError, OSError):
            return None
        return None if w is None else _trimmed(w)

    if option_weights(str(name)) == weights:
        return choices
    folder = config_dir() / "pk"
    same = sorted(p.stem for p in folder.glob("*.yaml") if option_weights(p.stem) == weights) \
        if folder.is_dir() else []
    if same:
        return {**choices, "pk": same[0]}
    from diffrank.experiments.records.table_cells import canonical_pk

    return {**choices, "pk": canonical_pk(weights)}
