"""Published numbers of the papers we reproduce, as package data (one CSV per table).

Copied from the project's reference folder (columns: ``paper, table, dataset, model, method, operator,
sigmoid, network, n, pk, m, setting, metric, value, std, n_runs, note``; all strings, empty = not
applicable; accuracies in %). ``lapsum_icml2025_table4.csv`` is transcribed from LapSum (Struski et al.,
ICML 2025) Table 4 in the same format, ``lapsum_icml2025_table3.csv`` from its Table 3 (deep kNN) and
``soft_topk_neurips2020_table1.csv`` from SOFT top-k (Xie et al., NeurIPS 2020) Table 1 (deep kNN; ``n`` empty,
k = 9 in ``setting``).

An experiment's ``paper:`` key is a dict of some of these columns (e.g. ``{paper: petersen_thesis_2022,
table: "3.7", dataset: mnist4, method: Cauchy CDF, network: odd_even, n: 5}``); :func:`match` returns the
rows whose columns equal every given value — one row per metric for a well-formed key.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from functools import cache
from importlib import resources

COLUMNS = ("paper", "table", "dataset", "model", "method", "operator", "sigmoid", "network", "n", "pk", "m",
           "setting", "metric", "value", "std", "n_runs", "note")


def table_names() -> list[str]:
    """Names of the bundled tables (CSV file stems), sorted."""
    return sorted(p.name[:-4] for p in resources.files(__name__).iterdir() if p.name.endswith(".csv"))


@cache
def _load(name: str) -> tuple[dict[str, str], ...]:
    path = resources.files(__name__) / f"{name}.csv"
    if not path.is_file():
        raise KeyError(f"no reference table {name!r}; known: {table_names()}")
    with path.open(newline="", encoding="utf-8") as f:
        rows = tuple(dict(r) for r in csv.DictReader(f))
    for r in rows:
        if set(r) != set(COLUMNS):
            raise ValueError(f"reference table {name!r} has columns {sorted(r)}, expected {list(COLUMNS)}")
    return rows


def load_table(name: str) -> list[dict[str, str]]:
    """Rows of one bundled table, e.g. ``load_table("sorting_thesis_table3_7")`` (copies; values are strings).

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    return [dict(r) for r in _load(name)]


def all_rows() -> list[dict[str, str]]:
    """Every row of every bundled table, each with an extra ``source_file`` field."""
    return [{**r, "source_file": name} for name in table_names() for r in _load(name)]


def _norm(v: object) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def match(key: Mapping[str, object], rows: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """Rows whose columns equal every entry of ``key`` (compared as strings, ``5`` == ``"5"``), duplicates once.

    Args:
        key: an experiment's ``paper:`` dict; its keys must be column names.
        rows: where to look (default: :func:`all_rows`).

    Raises:
        KeyError: a key that is not a column.
    """
    bad = [k for k in key if k not in COLUMNS]
    if bad:
        raise KeyError(f"paper key fields {bad} are not reference columns {list(COLUMNS)}")
    want = {k: _norm(v) for k, v in key.items()}
    out, seen = [], set()
    for r in (all_rows() if rows is None else rows):
        if all(r[k].strip() == v for k, v in want.items()):
            # a table that prints the same cell twice (Table 3.5's n = 1024, batch 4 column) stores it twice
            ident = tuple(r[c] for c in COLUMNS)
            if ident not in seen:
                seen.add(ident)
                out.append(r)
    return out


__all__ = ["COLUMNS", "all_rows", "load_table", "match", "table_names"]
