"""Rendering of the report (:mod:`diffrank.experiments.analysis.report`): Markdown, the ours-vs-paper PNG and the
console tables (rich), and the atomic writes of its files (a failed write leaves no partial file and names it).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from diffrank.experiments.analysis.report_others import other_rows
from diffrank.experiments.records.disk import write_atomic
from diffrank.experiments.records.table_cells import table_rows


def markdown(result: dict[str, Any]) -> str:
    """The whole report as Markdown."""
    others = result.get("others")
    if others is None:  # the paper rows only (collect's result)
        counts = (f"{result['runs']} runs with a `paper` key; {result['skipped']} results.json without one were "
                  "skipped. ")
    else:  # every record is in a section: nothing skipped
        parts = [f"{result['runs']} runs with a `paper` key beside the papers' tables"]
        if others["runs"]:
            parts.append(f"{others['runs']} runs of no paper row in [their own section](#runs-of-no-paper-row)")
        parts += [f"{n} benchmark runs in the P_K grid `pk_{ds}.md`" for ds, n in others["benchmark"].items()]
        counts = "; ".join(parts) + ". "
    out = ["# Our runs vs the papers", "",
           counts + "Values in % (ours: mean ± sample std over runs); Δ = ours − paper; steps×batch = our training "
           "budget.", ""]
    for (paper, table), lines in result["tables"].items():
        header, cells = table_rows(lines)
        out += [f"## {paper}, Table {table}", "", "| " + " | ".join(header) + " |",
                "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        sources = sorted({ln["copy_of"] for ln in lines if ln.get("copy_of")})
        if sources:
            out += ["", f"Rows with `copy_of=` in `setting` reprint {', '.join(sources)}: ours there are the runs of "
                    "that table's row (also in its own section, counted once); Δ is against the number as printed "
                    "here."]
        out.append("")
    if others and others["lines"]:
        header, cells = other_rows(others["lines"])
        out += ["## Runs of no paper row", "",
                "Runs whose config has no `paper` key (the default `python train.py`, the digits100 runs, …): no "
                "published number to set them beside. One line per command (its overrides but the seed), machine, "
                "budget and metric: the value of each run in the order of `seeds`, their mean ± sample std; "
                "accuracies in %. `records`: the archive (or results.json) they were read from.", "",
                "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        out.append("")
    if result.get("not_done"):
        out += ["## Runs left out: not finished (status diverged, interrupted, failed, or anything but done)", ""]
        out += [f"- `{path}`: {status}" for path, status in result["not_done"]]
        out.append("")
    if result.get("left_out"):
        out += ["## Runs left out: not comparable with their line's other runs", ""]
        out += [f"- `{path}`: {why}" for path, why in result["left_out"]]
        out.append("")
    if result["unmatched"]:
        out += ["## Runs whose `paper` key matches no reference row", ""]
        out += [f"- `{path}`: `{json.dumps(key)}`" for path, key in result["unmatched"]]
        out.append("")
    return "\n".join(out)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Ours vs paper, one panel per table (error bars = std over runs); None when nothing to plot."""
    tables = {k: [ln for ln in v if ln["runs"] and not math.isnan(ln["paper"]) and not ln.get("copy_of")]
              for k, v in result["tables"].items()}
    tables = {k: v for k, v in tables.items() if v}
    if not tables:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(4.5 * len(tables), 4.2), squeeze=False)
    for ax, ((paper, table), lines) in zip(axes[0], tables.items()):
        for metric in sorted({ln["metric"] for ln in lines}):
            sel = [ln for ln in lines if ln["metric"] == metric]
            ax.errorbar([ln["paper"] for ln in sel], [ln["mean"] for ln in sel],
                        yerr=[ln["std"] or 0.0 for ln in sel], fmt="o", capsize=3, label=metric)
        lo = min(min(ln["paper"], ln["mean"]) for ln in lines)
        hi = max(max(ln["paper"], ln["mean"]) for ln in lines)
        pad = 0.05 * (hi - lo or 1.0)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=0.8)
        ax.set_xlabel("paper")
        ax.set_ylabel("ours")
        ax.set_title(f"{paper}\nTable {table}", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
    return path


def _named(e: OSError, path: Path) -> OSError:
    """``e`` (a failed write) as an OSError naming ``path`` (a full disk's ENOSPC names no file)."""
    return OSError(e.errno, f"cannot write {path}: {e.strerror or e}")


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as the PNG ``path`` through a temporary file renamed over it, so that a failed
    write (a full disk) leaves no empty or partial PNG. Folders are created. Returns the path.

    Raises:
        OSError: the file cannot be written (the message names ``path``; the temporary file is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, path)
    except OSError as e:
        raise _named(e, path) from e
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write or the rename failed
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`~diffrank.experiments.records.disk.write_atomic`: a
    failed write leaves no partial file). Returns the path.

    Raises:
        OSError: the file cannot be written (the message names ``path``).
    """
    try:
        return write_atomic(path, text)
    except OSError as e:
        raise _named(e, path) from e


def _console(renderables: list[Any]) -> Any:
    """A rich console for ``renderables``: the terminal's when stdout is one (rich fits the tables to it); else
    (piped, redirected, captured) one as wide as the widest of them, so that no table is cut or wrapped at rich's
    default of 80 columns."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console()
    if console.is_terminal or not renderables:
        return console
    wide = Console(width=1 << 20)
    width = max(Measurement.get(wide, wide.options, r).maximum for r in renderables)
    return Console(width=max(80, width))


def print_console(result: dict[str, Any]) -> None:
    """The report's tables in the console (rich), the runs of no paper row included (``result["others"]``:
    :func:`other_runs`); piped, at their full width (:func:`_console`)."""
    from rich.table import Table
    from rich.text import Text

    def table(title: str, header: list[str], cells: list[list[str]], right: tuple[str, ...]) -> Table:
        """A rich table of ``cells`` (rows of strings) under ``header``; the columns named in ``right`` are
        right-aligned (numbers)."""
        t = Table(title=title)
        for h in header:
            t.add_column(h, justify="right" if h in right else "left")
        for row in cells:
            t.add_row(*row)
        return t

    shown: list[Any] = []
    for (paper, table_name), lines in result["tables"].items():
        header, cells = table_rows(lines)
        shown.append(table(f"{paper}, Table {table_name}", header, cells, ("paper", "ours", "Δ", "runs", "n")))
    others = result.get("others")
    if others and others["lines"]:
        header, cells = other_rows(others["lines"])
        shown.append(table("Runs of no paper row", header, cells, ("runs", "wall s")))
    for path, key in result["unmatched"]:
        shown.append(Text.assemble(("no reference row for", "yellow"), f" {path}: {key}"))
    for path, status in result.get("not_done", []):
        shown.append(Text.assemble((f"left out ({status}):", "yellow"), f" {path}"))
    for path, why in result.get("left_out", []):
        shown.append(Text.assemble(("left out:", "yellow"), f" {path}: {why}"))
    console = _console(shown)
    for r in shown:
        console.print(r)
