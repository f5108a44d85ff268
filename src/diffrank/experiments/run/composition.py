"""What a composed run config means beyond Hydra's merge: a paper row runs its own method, and its keys and values
are checked before anything is built (:func:`prepare`).

**A paper row runs its own method.** A row of a paper table (``configs/experiment/<family>/<table>/<row>.yaml``)
includes its protocol, selects its method (``override /operator: …`` or ``/algorithm``), sets that method's
parameters under ``operator:`` and names it in ``paper_method``. ``experiment=<row> operator=lapsum`` would let
Hydra merge the row's parameters (β, sigmoid) into LapSum's config and carry the row's ``paper:`` key for a run that
is not the row's method, so :func:`check_row_method` refuses it and names the row's protocol, which runs any
method with the table's settings. What a row runs is thus exactly its yaml and its protocol.

**Keys and values.** Hydra accepts ``+key=value`` for any top-level key and carries it along unread: the typo
``+operater=neuralsort`` (Hydra's own suggestion for ``operater=…``) trained the default Sinkhorn, ``+max_epochs=3``
the default budget. :func:`check_new_keys` refuses a top-level key that no config defines and nothing reads, naming
the nearest known key. :func:`check_value_types` refuses a string where a number is meant (``seed=abc``,
``model.optimizer.lr=abc``) before anything is built, naming the key: the numbers of ``configs/train.yaml`` by
their defaults' types, every other value by the annotation of the ``_target_`` parameter it is passed to.

The config groups a run actually uses (what it records) are :mod:`diffrank.experiments.run.choices`.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

from diffrank.registry import config_dir, load_yaml

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


# top-level keys that the code reads although no config defines them (given as +key=value)
READ_WITHOUT_DEFAULT = ("resume_with_changes",)


def known_top_level_keys() -> set[str]:
    """The top-level keys a run may have: those of ``configs/train.yaml``, the config groups (folders of the config
    directory: ``+loss=<name>`` adds a group), ``hydra`` and :data:`READ_WITHOUT_DEFAULT`."""
    import yaml

    root = config_dir()
    own = yaml.safe_load((root / "train.yaml").read_text(encoding="utf-8")) or {}
    groups = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    return {*own, *groups, "hydra", *READ_WITHOUT_DEFAULT} - {"defaults"}


def _leaf_paths(node: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every key under ``node`` (a DictConfig), without resolving interpolations."""
    out = []
    for key in node.keys() if isinstance(node, DictConfig) else ():
        path = f"{prefix}{key}"
        out.append(path)
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            out.extend(_leaf_paths(child, f"{path}."))
    return out


def check_new_keys(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Refuse a top-level key added on the command line (``+key=value`` / ``++key=value``) that is none of
    :func:`known_top_level_keys`: nothing would read it, and the run would silently train without it.

    Args:
        cfg: the composed config (the key is in it).
        overrides: Hydra's task overrides (``hydra.overrides.task``).

    Raises:
        ValueError: naming the key and the nearest known key (``trainer.max_epochs`` for ``+max_epochs=3``,
            ``operator`` for ``+operater=…``).
    """
    known = None
    for override in overrides:
        if not override.startswith("+"):
            continue
        key, _, value = override.lstrip("+").partition("=")
        if "." in key or "@" in key or not key:
            continue
        known = known if known is not None else known_top_level_keys()
        if key in known:
            continue
        paths = [p for p in _leaf_paths(cfg) if p != key and not p.startswith("hydra.")]
        nested = [p for p in paths if p.rsplit(".", 1)[-1] == key]
        near = nested or difflib.get_close_matches(key, sorted(known - {"hydra"}), n=1, cutoff=0.6) or \
            difflib.get_close_matches(key, paths, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}={value}? " if near else ""
        raise ValueError(
            f"{override}: '{key}' is no key of this config and nothing reads it, so the run would go on without "
            f"it; {hint}Top-level keys: {', '.join(sorted(known - {'hydra'}))} (a nested setting goes under its "
            "group, e.g. trainer.max_epochs=3)")


def _numeric_only(annotation: Any) -> bool:
    """Whether a parameter annotation admits numbers (or tensors, None) only: a string passed there is an error."""
    import numbers
    import types
    import typing

    import torch

    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
    else:
        members = [annotation]
    return bool(members) and all(isinstance(a, type) and (issubclass(a, (numbers.Number, torch.Tensor)))
                                 for a in members)


def _parameter_types(target: str) -> dict[str, Any]:
    """The annotations of the parameters of a ``_target_`` (a class's ``__init__`` or a function); ``{}`` where
    they cannot be read (the target does not import, or its annotations do not evaluate)."""
    import inspect
    import typing

    from diffrank.registry import locate

    try:
        obj = locate(target)
        fn = obj.__init__ if inspect.isclass(obj) else obj
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - only a help for the message: the build reports a target that fails
        return {}


def check_value_types(cfg: DictConfig) -> None:
    """Refuse, before anything is built, a string where a number is meant: a top-level key whose
    ``configs/train.yaml`` default is a number or a bool (``seed=abc``), or a key of a ``_target_`` node whose
    parameter is annotated with numbers (or tensors) only (``model.optimizer.lr=abc``: ``torch.optim.Adam``'s
    ``lr: float | Tensor``). Without this the run failed deep inside the optimiser or the seeding with a bare
    Python error (``'<=' not supported between 'float' and 'str'``) that named no key. Interpolated values are not
    checked (``${oc.env:…}`` yields strings that their target converts; ``${seed}`` is checked at ``seed``).

    Raises:
        ValueError: naming the key, the value and what it takes.
    """
    import yaml

    own = yaml.safe_load((config_dir() / "train.yaml").read_text(encoding="utf-8")) or {}
    for key, default in own.items():
        if isinstance(default, (bool, int, float)) and isinstance(cfg.get(key), str):
            kind = "true or false" if isinstance(default, bool) else \
                "an integer" if isinstance(default, int) else "a number"
            raise ValueError(f"{key}={cfg.get(key)}: {key} takes {kind} (configs/train.yaml: {key}: "
                             f"{str(default).lower() if isinstance(default, bool) else default}), not a string")
    _check_target_values(cfg, "")


def _check_target_values(node: Any, prefix: str) -> None:
    """:func:`check_value_types` for the ``_target_`` nodes under ``node`` (recursively; not ``hydra``)."""
    if isinstance(node, ListConfig):
        for i in range(len(node)):
            _check_target_values(node._get_node(i), f"{prefix}{i}.")
        return
    if not isinstance(node, DictConfig):
        return
    types_ = _parameter_types(str(node.get("_target_"))) if "_target_" in node else {}
    for key in node:
        if prefix == "" and key == "hydra":
            continue
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            _check_target_values(child, f"{prefix}{key}.")
            continue
        # an interpolation is left alone: ${oc.env:SLURM_NNODES,1} is a string the target converts, and ${seed}
        # is checked where it is set
        if key not in types_ or not _numeric_only(types_[key]) or OmegaConf.is_interpolation(node, key):
            continue
        value = node[key]
        if isinstance(value, str):
            kind = "true or false" if types_[key] is bool else "a number"
            raise ValueError(
                f"{prefix}{key}={value}: {node.get('_target_')} takes {kind} for '{key}' "
                f"({_annotation_text(types_[key])}), not the string {value!r}. Pass {kind}: {prefix}{key}=<value>")


def _annotation_text(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("torch.Tensor", "Tensor").replace("<class '", "") \
        .replace("'>", "")


def prepare(cfg: DictConfig, choices: dict[str, Any],
            overrides: Sequence[str] = ()) -> tuple[DictConfig, dict[str, Any]]:
    """The config :func:`diffrank.experiments.run.build.build` builds: a copy of ``cfg``, checked for unknown
    top-level keys (:func:`check_new_keys`), strings where numbers are meant (:func:`check_value_types`), a loss,
    a selection metric and a row's own method (:func:`check_row_method`).

    Args:
        cfg: the composed ``configs/train.yaml``.
        choices: Hydra's ``runtime.choices`` (``{}`` without HydraConfig).
        overrides: Hydra's task overrides (``[]`` without HydraConfig).

    Returns:
        ``(cfg, choices)``: the copy, and a copy of ``choices``
        (:func:`~diffrank.experiments.run.choices.drop_unused_groups` later trims them).

    Raises:
        ValueError: an unknown top-level key, a string for a number, no loss, no ``optimized_metric``, or a paper
            row with another method (the message names the key or the fix).
    """
    check_new_keys(cfg, overrides)
    check_value_types(cfg)
    cfg = copy.deepcopy(cfg)
    model = choices.get("model", "<model>")
    if cfg.get("loss") is None and "algorithm" not in (cfg.get("model") or {}):
        raise ValueError(f"no loss: model={model} brings none. Add '- /loss: <name>' to the defaults of "
                         f"configs/model/{model}.yaml, or choose one with +loss=<name>")
    if OmegaConf.is_missing(cfg, "optimized_metric"):
        raise ValueError(f"no optimized_metric: model={model} sets none. Add 'optimized_metric: val/<metric>' to "
                         f"configs/model/{model}.yaml, or pass optimized_metric=val/<metric>")
    check_row_method(cfg, choices)
    return cfg, dict(choices)


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
