"""The papers' rows as printed cells: the header and cells of one comparison table (paper / ours / Δ, runs,
budget and what else varies), the decimals of a published number, and the reference tables' spelling of P_K
weights. The rows themselves are matched by :mod:`diffrank.experiments.records.matching`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

# the columns that identify a reference row to a reader; shown when they vary inside a table
LABEL_COLUMNS = ("dataset", "model", "method", "operator", "sigmoid", "network", "n", "pk", "m", "setting")


def decimals(printed: str, minimum: int = 2) -> int:
    """Decimals to print our number with: those of the published value (``"97.795"`` → 3), at least
    ``minimum``."""
    text = printed.strip()
    return max(minimum, len(text.split(".", 1)[1]) if "." in text and text.replace(".", "", 1).lstrip("-").isdigit()
               else 0)


def _label_columns(lines: list[dict[str, Any]]) -> list[str]:
    """Columns worth showing: those that vary inside the table, plus method, operator and n."""
    always = ("method", "operator", "n")
    cols = [c for c in LABEL_COLUMNS if len({ln["row"].get(c, "") for ln in lines}) > 1 or c in always]
    return [c for c in cols if any(ln["row"].get(c, "") for ln in lines)]


def fmt(v: float | None, digits: int = 2) -> str:
    """A number for the report (``—`` for None / NaN)."""
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _vs_regular(ln: dict[str, Any], digits: int) -> tuple[str, str]:
    """The two report cells of :func:`significance`: paper − Regular, and ours − Regular with Welch's p; ``**``
    marks a significant improvement (the thesis' black bold), ``(sig. worse)`` a significant loss."""
    vs = ln.get("vs_regular")
    if vs is None:
        return "", ""
    ours = fmt(vs["ours"], digits)
    if ours != "—":
        ours = ("+" if not ours.startswith("-") else "") + ours
        if vs["p"] is not None:
            mark = (" **" if vs["ours"] > 0 else " (sig. worse)") if vs["significant"] else ""
            ours += f" (p={vs['p']:.2g}){mark}"
    paper = fmt(vs["paper"], digits)
    return ("+" if paper != "—" and not paper.startswith("-") else "") + paper, ours


def table_rows(lines: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of one report table."""
    cols = _label_columns(lines)
    header = [*cols, "metric", "paper", "ours", "Δ", "runs", "steps×batch"]
    newton = any(ln.get("tikhonov") for ln in lines)
    if newton:  # Newton-loss runs (thesis ch. 7): their Tikhonov λ, not printed in the thesis
        header.append("Newton λ")
    devices = len({ln.get("device", "") for ln in lines if ln["runs"]}) > 1
    if devices:
        header.append("device")
    other_data = any(ln.get("data") for ln in lines)
    if other_data:  # say it on every row: a number on generated or swapped-in data is not a reproduction
        header.insert(len(cols), "data")
    selected = any(ln.get("selected") for ln in lines)
    if selected:
        header.append("selected")
    variants = any(ln.get("variant") for ln in lines)
    if variants:  # a run with other settings than the row's is that row's variant, never the row
        header.insert(len(cols), "variant of the row")
    codes = any(len(ln.get("codes") or ()) > 1 for ln in lines)
    if codes:  # runs of different code versions pooled in one line: say which
        header.append("code versions")
    duplicates = any(ln.get("duplicates") for ln in lines)
    if duplicates:
        header.append("re-runs left out")
    compared = any(ln.get("vs_regular") for ln in lines)
    if compared:
        header += ["paper − Regular", "ours − Regular (Welch p)"]
    cells = []
    for ln in lines:
        digits = decimals(ln["row"]["value"])
        ours = fmt(ln["mean"], digits) + ("" if ln["std"] is None else f" ± {fmt(ln['std'], digits)}")
        delta = fmt(ln["delta"], digits)
        if delta.startswith("-") and not delta.strip("-0."):  # a rounded-away negative is no difference
            delta = delta[1:]
        if delta != "—" and not delta.startswith("-"):
            delta = "+" + delta
        cells.append([*(ln["row"].get(c, "") for c in cols), *([ln.get("variant") or ""] if variants else []),
                      *([ln.get("data") or "real"] if other_data else []),
                      ln["metric"], ln["row"]["value"] or "—", ours, delta,
                      str(ln["runs"]), ln["budget"], *([ln.get("tikhonov") or ""] if newton else []),
                      *([ln.get("device", "")] if devices else []),
                      *([ln.get("selected") or ""] if selected else []),
                      *([", ".join(ln.get("codes") or ()) if len(ln.get("codes") or ()) > 1 else ""] if codes
                        else []),
                      *([str(ln.get("duplicates") or "")] if duplicates else []),
                      *(_vs_regular(ln, digits) if compared else ())])
    return header, cells


def canonical_pk(weights: Iterable[float], length: int = 5) -> str:
    """The reference CSVs' spelling of P_K weights, padded with zeros to ``length``: ``[0.5, 0, 0, 0, 0.5]`` →
    ``"[.5,0,0,0,.5]"``, ``[1.0]`` → ``"[1,0,0,0,0]"``."""
    w = [float(v) for v in weights]
    w += [0.0] * max(0, length - len(w))

    def fmt(v: float) -> str:
        """A P_K weight as written in the paper's tables (``1``, ``.5``)."""
        if v.is_integer():
            return str(int(v))
        return f"{v:g}".lstrip("0") if 0 < v < 1 else f"{v:g}"

    return "[" + ",".join(fmt(v) for v in w) + "]"
