"""Published numbers of the papers we reproduce, as package data (one CSV per table).

Copied from the project's reference folder (columns: ``paper, table, dataset, model, method, operator,
sigmoid, network, n, pk, m, setting, metric, value, std, n_runs, note``; all strings, empty = not
applicable; accuracies in %). ``lapsum_icml2025_table4.csv`` is transcribed from LapSum (Struski et al.,
ICML 2025) Table 4 in the same format, ``lapsum_icml2025_table3.csv`` from its Table 3 (deep kNN) and
``soft_topk_neurips2020_table1.csv`` from SOFT top-k (Xie et al., NeurIPS 2020) Table 1 (deep kNN; ``n`` empty,
k = 9 in ``setting``). ``newton_thesis_table7_1_classification.csv`` (thesis Table 7.1) names its metric
``top1`` (the classifier's ``test/top1``; the project's reference folder says ``test_acc``).
``lapsum_icml2025_table1.csv`` / ``table2.csv`` are LapSum's Tables 1 (CIFAR-100) and 2 (ImageNet-1K / 21K-P
heads), with α, batch and epochs of its Appendix D Table 5 in ``setting``.

**Copies.** A paper that reprints another's numbers as its baselines (LapSum Tables 1, 2 reprint Petersen et al.
2022 Tables 1, 2; LapSum Table 3 reprints Xie et al. 2020 Table 1) stores them with ``copy_of=<paper>:<table>``
in ``setting``; :func:`copy_source` finds the original row (same dataset, operator, P_K and metric). No experiment
config points at a copy: the original's row is the one run, and the report shows its runs beside the copy
without counting them again.

An experiment's ``paper:`` key is a dict of some of these columns (e.g. ``{paper: petersen_thesis_2022,
table: "3.7", dataset: mnist4, method: Cauchy CDF, network: odd_even, n: 5}``); :func:`match` returns the
rows whose columns equal every given value — one row per metric for a well-formed key.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

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
    return read_csv(path)


def read_csv(path: Path | Traversable) -> tuple[dict[str, str], ...]:
    """The rows of a reference CSV file (header = :data:`COLUMNS`, in any order; values are strings), each checked
    for its field count.

    Raises:
        ValueError: a header other than :data:`COLUMNS`, or a row with more or fewer fields than the header; the
            message names the file and the line (1 = the header; for a quoted field over several lines, the last).
    """
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or sorted(header) != sorted(COLUMNS):
            raise ValueError(f"{path}, line 1: the header {header} is not the reference columns {list(COLUMNS)}")
        rows = []
        for fields in reader:
            if len(fields) != len(header):
                raise ValueError(f"{path}, line {reader.line_num}: {len(fields)} fields where the header has "
                                 f"{len(header)} (an unquoted comma, or a missing one?): {','.join(fields)[:200]}")
            rows.append(dict(zip(header, fields)))
    return tuple(rows)


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


def copy_source(row: Mapping[str, str]) -> dict[str, str] | None:
    """The original of a copied reference row (``copy_of=<paper>:<table>`` in its ``setting``), else None.

    The original is the row of that paper and table with the same ``dataset``, ``operator``, ``pk`` and
    ``metric`` (the method labels differ between papers: "NeuralSort" vs "Top-5 NeuralSort").

    Raises:
        ValueError: a malformed ``copy_of`` or not exactly one original.
    """
    marks = [part.strip()[len("copy_of="):] for part in row.get("setting", "").split(";")
             if part.strip().startswith("copy_of=")]
    if not marks:
        return None
    paper, _, table = marks[0].partition(":")
    if len(marks) > 1 or not paper or not table:
        raise ValueError(f"bad copy_of in setting {row.get('setting')!r}: want one copy_of=<paper>:<table>")
    hits = [r for r in all_rows() if r["paper"] == paper and r["table"] == table
            and all(r[c] == row.get(c, "") for c in ("dataset", "operator", "pk", "metric"))]
    if len(hits) != 1:
        raise ValueError(f"{row.get('paper')} Table {row.get('table')} {row.get('method')!r} {row.get('metric')}: "
                         f"copy_of={paper}:{table} matches {len(hits)} rows, expected one")
    return {k: v for k, v in hits[0].items() if k != "source_file"}


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


__all__ = ["COLUMNS", "all_rows", "copy_source", "load_table", "match", "read_csv", "table_names"]
