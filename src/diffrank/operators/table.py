"""The operator table of the docs (docs/operators.md), generated from the registry (``configs/operator/*.yaml``)
and the classes the configs target.

One row per config: the class and the arguments that differ from its constructor defaults (from ``_target_`` and
the signature), the capabilities of the built operator (``load(name).capabilities``: they may depend on the
arguments, e.g. the splitter network gives top-k membership only), β, and the class attributes of
:class:`~diffrank.operators.base.RankingOperator` that say where the method comes from:

- ``paper``: authors, venue year, section / equation;
- ``parameter``: the paper's own parameter and its relation to β, e.g. ``τ = 1/β``, ``α = −1/β (…)`` or ``β (…)``
  when the paper uses β itself; for the forms ``X = 1/β`` / ``X = −1/β`` the table prints the value at the
  config's β;
- ``canonical``: only for a class that several configs target (``diffsort_*`` / ``difftopk_*`` →
  ``ComparatorNetwork``): the config whose values are the class's constructor defaults. Such a class gives
  ``paper`` and ``parameter`` per config (a mapping config name → text). A class targeted by one config has that
  config as its canonical one.

Both texts must be set on the class itself (a subclass such as ``GumbelSinkhorn`` does not show its parent's).

The same command writes the second listing derived from the configs: the exports of ``diffrank.operators``
(``__all__``, the class → module map that imports a class on first access, and the type checkers' imports), so
that they are written out in ``operators/__init__.py``, as optax writes its imports, yet adding an operator stays
one module + one yaml + this command.

``python -m diffrank.operators.table`` rewrites the block between ``<!-- operators:begin -->`` and
``<!-- operators:end -->`` in docs/operators.md of the checkout (README.md, docs/api.md and docs/conventions.md
link to it) and the block between ``# operators:begin`` and ``# operators:end`` in ``operators/__init__.py`` (or
the files given: a ``.py`` file gets the exports, any other the table); ``--check`` only reports the files whose
block differs (exit status 1), as the tests do.
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffrank.operators.base import ALL_CAPABILITIES, PERMUTATION, SOFT_RANK, SOFT_SORT, TOPK_MEMBERSHIP
from diffrank.registry import list_options, load_yaml, locate

BEGIN, END = "<!-- operators:begin -->", "<!-- operators:end -->"
EXPORTS_BEGIN, EXPORTS_END = "# operators:begin", "# operators:end"
#: what diffrank.operators exports besides the operator classes
MODULE_NAMES = ("RankingOperator", "available", "load")
COMMAND = "python -m diffrank.operators.table"
METADATA = ("paper", "parameter")
_RELATION = re.compile(r"^(\S+) = ([-−]?)1/β")
_ORDER = (PERMUTATION, TOPK_MEMBERSHIP, SOFT_SORT, SOFT_RANK)


def metadata(name: str, cls: type) -> dict[str, str]:
    """``paper`` and ``parameter`` of the config ``name`` from its class ``cls``: the class attribute, or its entry
    for ``name`` where the class gives a mapping per config. Only what is set on ``cls`` itself counts (a subclass
    does not show its parent's paper); a missing or empty text is left out."""
    out = {}
    for key in METADATA:
        value = vars(cls).get(key, "")
        value = value.get(name, "") if isinstance(value, Mapping) else value
        if value:
            out[key] = value
    return out


def canonical_configs() -> dict[str, str]:
    """``_target_`` → the name of its canonical config, for every class that an operator config targets: the
    class's ``canonical`` attribute, or its one config.

    Raises:
        ValueError: a class targeted by several configs whose ``canonical`` names none of them, or a ``canonical``
            that names no config of its class.
    """
    by_target: dict[str, list[str]] = {}
    for name in list_options("operator"):
        by_target.setdefault(load_yaml("operator", name)["_target_"], []).append(name)
    out = {}
    for target, names in by_target.items():
        canonical = getattr(locate(target), "canonical", None)
        if canonical is None and len(names) == 1:
            canonical = names[0]
        if canonical not in names:
            raise ValueError(f"{target} is the target of configs {names}: its class attribute canonical must name "
                             f"the one whose values are the class defaults, got {canonical!r}")
        out[target] = canonical
    return out


def constructor_defaults(cls: type) -> dict[str, Any]:
    """The keyword defaults of ``cls.__init__`` (parameters without a default are left out)."""
    params = inspect.signature(cls.__init__).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


@dataclass(frozen=True)
class Row:
    """One operator config as the table shows it."""

    name: str
    cls: str
    arguments: dict[str, Any]  # the config's values that differ from the class defaults, β aside
    capabilities: frozenset[str]
    sums_to_k: bool
    beta: float
    parameter: str
    paper: str


def rows() -> list[Row]:
    """One :class:`Row` per operator config, in the order of :func:`diffrank.operators.available`.

    Raises:
        ValueError: a config without a ``beta``, or whose class does not give its ``paper`` / ``parameter``.
    """
    from diffrank.operators import load

    out = []
    for name in list_options("operator"):
        cfg = load_yaml("operator", name)
        cls = locate(cfg["_target_"])
        meta = metadata(name, cls)
        missing = [t for t in METADATA if t not in meta] + ([] if "beta" in cfg else ["beta"])
        if missing:
            raise ValueError(f"configs/operator/{name}.yaml lacks {missing} (paper and parameter are attributes "
                             f"of {cls.__name__}: the module docstring of diffrank.operators.table says what each "
                             "holds)")
        defaults = constructor_defaults(cls)
        args = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "beta" and defaults.get(k, ...) != v}
        op = load(name)
        out.append(Row(name, cls.__name__, args, frozenset(op.capabilities), op.sums_to_k, float(cfg["beta"]),
                       meta["parameter"], meta["paper"]))
    return out


def _value(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else f"{v:g}" if isinstance(v, float) else str(v)


def _parameter(text: str, beta: float) -> str:
    """``τ = 1/β (…)`` → ``τ = 1/β = 2 (…)`` at β = 0.5; other forms unchanged."""
    hit = _RELATION.match(text)
    if not hit:
        return text
    value = (-1.0 if hit.group(2) else 1.0) / beta
    shown = f"{value:.3g}".replace("-", "−")
    return f"{hit.group(0)} = {shown}{text[hit.end():]}"


def _capabilities(row: Row) -> str:
    text = "all four" if row.capabilities == ALL_CAPABILITIES else ", ".join(
        f"`{c}`" for c in _ORDER if c in row.capabilities)
    return text + (" (does not sum to k)" if TOPK_MEMBERSHIP in row.capabilities and not row.sums_to_k else "")


def render() -> str:
    """The generated block (without the markers): a markdown table, one row per operator config."""
    lines = [f"<!-- generated by `{COMMAND}` from configs/operator/*.yaml and the operator classes: edit those "
             "and rerun it -->",
             "| config | class (the config's other arguments) | capabilities | β | paper's parameter | paper |",
             "|---|---|---|---|---|---|"]
    for r in rows():
        args = ", ".join(f"{k}={_value(v)}" for k, v in r.arguments.items())
        cells = [f"`{r.name}`", f"`{r.cls}({args})`" if args else f"`{r.cls}`", _capabilities(r),
                 f"{r.beta:g}" if math.isfinite(r.beta) else str(r.beta), _parameter(r.parameter, r.beta), r.paper]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def render_exports() -> str:
    """The exports block of ``diffrank/operators/__init__.py`` (without the markers): the type checkers' imports,
    ``__all__`` and ``OPERATOR_MODULES`` (class → module), one entry per class that an operator config targets.

    Raises:
        ValueError: two configs target different classes of one name.
    """
    modules: dict[str, str] = {}
    for name in list_options("operator"):
        module, _, cls = load_yaml("operator", name)["_target_"].rpartition(".")
        if modules.setdefault(cls, module) != module:
            raise ValueError(f"configs/operator/{name}.yaml targets {module}.{cls}, but another config targets "
                             f"{modules[cls]}.{cls}: diffrank.operators can export one class of each name")
    modules = dict(sorted(modules.items()))
    return "\n".join([
        f"# generated by `{COMMAND}` from configs/operator/*.yaml: edit those and rerun it",
        "if TYPE_CHECKING:",
        *sorted(f"    from {module} import {cls}" for cls, module in modules.items()),
        "",
        "__all__ = [",
        *(f'    "{name}",' for name in sorted({*modules, *MODULE_NAMES})),
        "]",
        "",
        "#: operator class → the module that defines it (imported on first access)",
        "OPERATOR_MODULES = {",
        *(f'    "{cls}": "{module}",' for cls, module in modules.items()),
        "}"])


def replace_block(text: str, block: str, where: str = "the text", begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the part between the markers replaced by ``block`` (the markers stay, each on its line).

    Raises:
        ValueError: not exactly one ``begin`` followed by one ``end``.
    """
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{where} needs exactly one '{begin}' … '{end}' pair (in this order)")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def default_files() -> list[Path]:
    """The two files of the checkout this module lives in that hold a generated block: docs/operators.md (the
    one page with the table) and ``diffrank/operators/__init__.py`` (the exports)."""
    here = Path(__file__).resolve()
    return [here.parents[3] / "docs" / "operators.md", here.parent / "__init__.py"]


def refreshed(path: Path, text: str) -> str:
    """``text`` (the contents of ``path``) with its generated block rendered anew: the exports for a ``.py``
    file, the operator table for any other.

    Raises:
        ValueError: ``text`` without exactly one marker pair of its kind.
    """
    if Path(path).suffix == ".py":
        return replace_block(text, render_exports(), str(path), EXPORTS_BEGIN, EXPORTS_END)
    return replace_block(text, render(), str(path))


def stale(files: Sequence[Path]) -> list[Path]:
    """The files whose generated block differs from what :func:`refreshed` renders.

    Raises:
        FileNotFoundError: a missing file. ValueError: a file without exactly one marker pair.
    """
    texts = {Path(p): Path(p).read_text(encoding="utf-8") for p in files}
    return [path for path, text in texts.items() if refreshed(path, text) != text]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: write the generated blocks into the files (default :func:`default_files`), or ``--check``.

    Returns:
        0, or 1 with ``--check`` when a file's block differs (the files are named on stderr).
    """
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="files with a marker pair (.py: the exports)")
    parser.add_argument("--check", action="store_true", help="only report files whose block differs")
    args = parser.parse_args(argv)
    changed = []
    for path in args.files or default_files():
        text = path.read_text(encoding="utf-8")
        new = refreshed(path, text)
        if new == text:
            continue
        changed.append(path)
        if args.check:
            print(f"{path}: the generated block differs from configs/operator; run `{COMMAND}`", file=sys.stderr)
        else:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path}")
    return int(bool(changed)) if args.check else 0

if __name__ == "__main__":
    sys.exit(main())
