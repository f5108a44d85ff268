"""What a composed run config means beyond Hydra's merge: paper rows run with another operator, and the
config groups a run actually uses.

**Paper rows run with another operator.** A row of a paper table (``configs/experiment/sorting/<table>/<row>.yaml``)
includes its protocol, selects its operator, sets that operator's parameters under ``operator:`` and names it in
``paper_method``. ``experiment=<row> operator=lapsum`` would let Hydra merge the row's parameters (β, sigmoid)
into LapSum's config, and the run would carry the row's ``paper:`` key although it is not the row's method.
:func:`prepare` rebuilds ``operator`` from ``configs/operator/<choice>.yaml`` plus the command line's
``operator.*`` overrides (so nothing of the row's operator reaches the other one) and drops ``paper``: the run is
a *variant* of the row (``variant_of`` in results.json) and ``compare_to_paper`` never labels it with the row's
published numbers.

**Used groups.** The ``operator`` and ``pk`` groups are read only through interpolation (``operator: ${operator}``,
``p_k: ${pk}`` in a loss yaml). A group that the built loss does not hold (P_K in a sorting run, the operator with
``loss=softmax_ce``) is dropped from the config and from the recorded choices.
"""

from __future__ import annotations

import copy
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationKeyError

from diffrank.registry import config_dir

# groups built only where another node interpolates them (the loss reads ${operator} and ${pk})
INTERPOLATED_GROUPS = ("operator", "pk")
# the groups that name a table row's method (paper_method): the first one chosen counts
METHOD_GROUPS = ("operator", "algorithm")


def _override_key(line: str) -> str:
    return line.split("=", 1)[0].lstrip("+~")


def group_from_yaml(group: str, name: str, overrides: list[str]) -> DictConfig:
    """``configs/<group>/<name>.yaml`` with the ``<group>.*`` overrides of a command line applied.

    Args:
        group: a config group of :data:`METHOD_GROUPS` (``operator``, ``algorithm``).
        name: an option of that group.
        overrides: Hydra task overrides (``operator.beta=2``, ``+operator.x=1``, ``~operator.y``); others are ignored.

    Raises:
        FileNotFoundError: no such config.
    """
    path = config_dir() / group / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no {group} config {path}")
    root = OmegaConf.create({group: OmegaConf.load(path)})
    lines = [o for o in overrides if _override_key(o).startswith(f"{group}.")]
    for o in OverridesParser.create().parse_overrides(lines):
        key = o.key_or_group
        if o.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(root, parent)
            if isinstance(node, DictConfig) and leaf in node:
                del node[leaf]
        else:
            OmegaConf.update(root, key, o.value(), merge=True, force_add=True)
    return root[group]


def swap_operator(cfg: DictConfig, choices: dict[str, Any], overrides: list[str]) -> dict[str, Any] | None:
    """If ``cfg`` is a paper row (``paper_method`` set) run with another method, rebuild the method's group from
    that option's own config and drop ``paper`` (in place). The method is the ``operator`` choice, or the
    ``algorithm`` choice of runs without an operator (Warcraft shortest paths).

    Returns:
        ``None`` for a row run with its own operator (or no row); else what the run is a variant of:
        ``{"experiment", "paper_method", "method", "paper"}`` (the row's resolved paper key).
    """
    row_op = cfg.get("paper_method")
    group = next((g for g in METHOD_GROUPS if choices.get(g) is not None), METHOD_GROUPS[0])
    chosen = choices.get(group)  # Hydra's choice (a row's task_name needs HydraConfig anyway)
    if not row_op or chosen is None or chosen == row_op:
        return None
    paper = cfg.get("paper")
    variant = {"experiment": choices.get("experiment"), "paper_method": row_op, "method": chosen,
               "paper": OmegaConf.to_container(paper, resolve=True) if isinstance(paper, DictConfig) else paper}
    with open_dict(cfg):
        cfg[group] = group_from_yaml(group, chosen, overrides)
        cfg.paper = None
    return variant


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


def prepare(cfg: DictConfig, choices: dict[str, Any], overrides: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """The config :func:`diffrank.experiments.train.train` runs: a copy of ``cfg`` with :func:`swap_operator` and
    :func:`drop_unused_groups` applied, checked for a loss and a selection metric.

    Args:
        cfg: the composed ``configs/train.yaml``.
        choices: Hydra's ``runtime.choices`` (``{}`` without HydraConfig).
        overrides: Hydra's task overrides.

    Returns:
        ``(cfg, {"choices": the used choices, "variant_of": see swap_operator})``.

    Raises:
        ValueError: no loss or no ``optimized_metric`` (the message names the fix).
    """
    cfg = copy.deepcopy(cfg)
    model = choices.get("model", "<model>")
    if cfg.get("loss") is None and "algorithm" not in (cfg.get("model") or {}):
        raise ValueError(f"no loss: model={model} brings none. Add '- /loss: <name>' to the defaults of "
                         f"configs/model/{model}.yaml, or choose one with +loss=<name>")
    if OmegaConf.is_missing(cfg, "optimized_metric"):
        raise ValueError(f"no optimized_metric: model={model} sets none. Add 'optimized_metric: val/<metric>' to "
                         f"configs/model/{model}.yaml, or pass optimized_metric=val/<metric>")
    variant = swap_operator(cfg, choices, overrides)
    return cfg, {"choices": dict(choices), "variant_of": variant}


def check_model_fits_data(cfg: DictConfig, choices: dict[str, Any]) -> None:
    """Resolve ``cfg.model`` and turn a missing ``data.*`` key into a message naming the matching groups.

    Raises:
        ValueError: the model reads a key its data config lacks (e.g. model=classifier with sorting data).
    """
    try:
        OmegaConf.to_container(cfg.model, resolve=True)
    except InterpolationKeyError as e:
        raise ValueError(
            f"model={choices.get('model', '?')} does not fit data={choices.get('data', '?')}: "
            f"{str(e.msg).splitlines()[0]} (in {e.full_key}). "
            "Classification data (digits, digits100) go with model=classifier; sorting data (digits_sort, "
            "mnist_sort, svhn_sort) with model=sorting, or use a protocol: experiment=sorting/mnist"
        ) from None
