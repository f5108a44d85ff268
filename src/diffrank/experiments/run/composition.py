"""What a composed run config means beyond Hydra's merge: a paper row runs its own method, and the config groups a
run actually uses.

**A paper row runs its own method.** A row of a paper table (``configs/experiment/<family>/<table>/<row>.yaml``)
includes its protocol, selects its method (``override /operator: …`` or ``/algorithm``), sets that method's
parameters under ``operator:`` and names it in ``paper_method``. ``experiment=<row> operator=lapsum`` would let
Hydra merge the row's parameters (β, sigmoid) into LapSum's config and carry the row's ``paper:`` key for a run that
is not the row's method, so :func:`check_row_method` refuses it and names the row's protocol, which runs any
method with the table's settings. What a row runs is thus exactly its yaml and its protocol.

**Used groups.** The ``operator`` and ``pk`` groups are read only through interpolation (``operator: ${operator}``,
``p_k: ${pk}`` in a loss yaml). A group that the built loss does not hold (P_K in a sorting run, the operator with
``loss=softmax_ce``) is dropped from the config and from the recorded choices.
"""

from __future__ import annotations

import copy
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationKeyError

from diffrank.registry import config_dir, load_yaml

# groups built only where another node interpolates them (the loss reads ${operator} and ${pk})
INTERPOLATED_GROUPS = ("operator", "pk")
# the groups that name a table row's method (paper_method): the first one chosen counts (loss: rows without an
# operator or algorithm whose loss is the method, e.g. RESGRO for sorting, thesis Table 7.2)
METHOD_GROUPS = ("operator", "algorithm", "loss")


def row_protocol(experiment: str) -> str | None:
    """The protocol a row builds on: the first ``/experiment/…`` entry of ``configs/experiment/<experiment>.yaml``'s
    defaults list (``sorting/mnist`` for a Table 3.5 row), or ``None`` if it has none."""
    if not (config_dir() / "experiment" / f"{experiment}.yaml").is_file():
        return None
    for entry in load_yaml("experiment", experiment).get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            return entry.removeprefix("/experiment/")
    return None


def row_newton(experiment: str) -> str:
    """The ``newton`` choice a row makes: the ``override /newton`` entry of its defaults list, else of the
    experiments it includes (its protocol), else ``"none"`` (thesis "Regular")."""
    if not (config_dir() / "experiment" / f"{experiment}.yaml").is_file():
        return "none"
    included = []
    for entry in load_yaml("experiment", experiment).get("defaults", []):
        if isinstance(entry, dict) and "override /newton" in entry:
            return str(entry["override /newton"])
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            included.append(entry.removeprefix("/experiment/"))
    return next((n for n in map(row_newton, included) if n != "none"), "none")


def check_row_method(cfg: DictConfig, choices: dict[str, Any]) -> None:
    """Refuse a paper row (``paper_method`` set) run with another method. The method is the ``operator`` choice, or
    the ``algorithm`` choice of runs without an operator (Warcraft shortest paths), or the ``loss`` choice of runs
    with neither (RESGRO sorting rows). A row with a ``paper`` key also runs its own Newton loss: the ``newton``
    choice must be the row's (:func:`row_newton`; "Regular" rows: none), or the run would carry the key of another
    cell of Tables 7.1–7.5.

    Raises:
        ValueError: the chosen method or Newton loss is not the row's; the message names what to run instead.
    """
    row = choices.get("experiment")
    if row and isinstance(cfg.get("paper"), DictConfig) and choices.get("newton") is not None:
        own, chosen_newton = row_newton(row), str(choices.get("newton"))
        if chosen_newton != own:
            raise ValueError(
                f"experiment={row} is the paper's row for newton={own}: with newton={chosen_newton} the run would "
                f"carry that row's paper key. Run the row of that Newton loss "
                f"(configs/experiment/{row.rsplit('/', 1)[0]}/) or the row's protocol ({row_protocol(row)}) "
                f"with newton={chosen_newton}")
    row_method = cfg.get("paper_method")
    group = next((g for g in METHOD_GROUPS if choices.get(g) is not None), METHOD_GROUPS[0])
    chosen = choices.get(group)
    if not row_method or chosen is None or chosen == row_method:
        return
    protocol = row_protocol(row) if row else None
    instead = (f"experiment={protocol} {group}={chosen} plus the row's other settings (data, trainer) from "
               f"configs/experiment/{row}.yaml" if protocol else f"the row's protocol with {group}={chosen}")
    own = load_yaml("experiment", row).get("defaults", []) if row and row_protocol(row) else []
    row_group = next((g for g in METHOD_GROUPS for e in own if isinstance(e, dict)
                      and e.get(f"override /{g}") == row_method), group)
    raise ValueError(
        f"experiment={row} is the paper's row for {row_group}={row_method}: with {group}={chosen} Hydra would merge "
        f"the row's {group} parameters into {chosen}'s config and the run would carry the row's paper key. "
        f"Run {instead}")


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


def prepare(cfg: DictConfig, choices: dict[str, Any]) -> tuple[DictConfig, dict[str, Any]]:
    """The config :func:`diffrank.experiments.run.train.train` runs: a copy of ``cfg``, checked for a loss, a selection
    metric and a row's own method (:func:`check_row_method`).

    Args:
        cfg: the composed ``configs/train.yaml``.
        choices: Hydra's ``runtime.choices`` (``{}`` without HydraConfig).

    Returns:
        ``(cfg, {"choices": choices})``; :func:`drop_unused_groups` later trims the choices.

    Raises:
        ValueError: no loss, no ``optimized_metric``, or a paper row with another method (the message names the fix).
    """
    cfg = copy.deepcopy(cfg)
    model = choices.get("model", "<model>")
    if cfg.get("loss") is None and "algorithm" not in (cfg.get("model") or {}):
        raise ValueError(f"no loss: model={model} brings none. Add '- /loss: <name>' to the defaults of "
                         f"configs/model/{model}.yaml, or choose one with +loss=<name>")
    if OmegaConf.is_missing(cfg, "optimized_metric"):
        raise ValueError(f"no optimized_metric: model={model} sets none. Add 'optimized_metric: val/<metric>' to "
                         f"configs/model/{model}.yaml, or pass optimized_metric=val/<metric>")
    check_row_method(cfg, choices)
    return cfg, {"choices": dict(choices)}


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
