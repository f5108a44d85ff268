"""Validation curves of runs from their CSV logs: one line per run, a metric against the optimizer step.

``python -m diffrank.experiments.analysis.curves outputs/cells/sorting/thesis_t3_5/bitonic_lambda04_n32_b4
--metric val/em5 --out docs/figures/t3_5_n32_b4.png`` finds every run folder below the given ones (a ``csv/`` log
inside) and labels each line with its folder name and, when finished, its tested value from ``results.json``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from diffrank.experiments.analysis.report_render import save_figure
from diffrank.experiments.records.record import RECORD_FILE, RunRecord


def read_curve(run_dir: str | Path, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` pairs of ``metric`` from every ``csv/*/metrics.csv`` of a run folder (a resumed run
    appends versions: all are read, the later value wins at a repeated step), sorted by step.

    Steps are Lightning's logged ``step`` + 1 (the logger writes a validation after step s at s − 1).

    Raises:
        ValueError: a row whose step or value is not a number (the message names the file and line).
    """
    points: dict[int, float] = {}
    for path in sorted(Path(run_dir).glob("csv/*/metrics.csv")):
        with path.open(newline="") as f:
            for line, row in enumerate(csv.DictReader(f), 2):  # line 1: the header
                value = row.get(metric)
                if value not in (None, ""):
                    try:
                        points[int(row["step"]) + 1] = float(value)
                    except (KeyError, TypeError, ValueError):
                        raise ValueError(f"{path}, line {line}: step {row.get('step')!r} or {metric} {value!r} is "
                                         "not a number") from None
    return sorted(points.items())


def run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run folders (holding ``csv/``) among and below ``paths``, sorted.

    Raises:
        FileNotFoundError: a path that does not exist.
    """
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"no such run folder: {p}")
        found |= {c.parent for c in p.rglob("csv") if c.is_dir()} | ({p} if (p / "csv").is_dir() else set())
    return sorted(found)


def plot(paths: list[str | Path], metric: str, out: str | Path, title: str | None = None,
         scale: float = 100.0) -> Path:
    """Draw ``metric`` (× ``scale``, % by default) against the step for every run below ``paths``; write a PNG.

    Raises:
        FileNotFoundError: a path that does not exist. ValueError: no run logged ``metric``, or a malformed
        ``metrics.csv`` (:func:`read_curve`). OSError: ``out`` cannot be written (named; no partial PNG is left).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for run in run_dirs(paths):
        curve = read_curve(run, metric)
        if not curve:
            continue
        rec = RunRecord.read(run / RECORD_FILE)
        test = metric.replace("val/", "test/")
        value = rec.metrics.get(test) if rec and isinstance(rec.metrics, dict) else None
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        label = run.name + (f" (test {scale * value:.2f})" if numeric else "")
        ax.plot([s for s, _ in curve], [scale * v for _, v in curve], marker="o", ms=3, label=label)
        drawn += 1
    if not drawn:
        raise ValueError(f"no run under {', '.join(map(str, paths))} logged {metric}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"{metric}" + (" (%)" if scale == 100.0 else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    out = Path(out)
    fig.tight_layout()
    try:
        save_figure(fig, out, dpi=110)
    finally:
        plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> Path:
    """Command line: see the module docstring.

    Raises:
        SystemExit: status 1 with ``error: <why>`` for a missing folder, no run that logged the metric, a
            malformed log or a PNG that cannot be written (status 2: bad arguments).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run folders or folders holding them")
    ap.add_argument("--metric", default="val/em5")
    ap.add_argument("--out", required=True, help="PNG file")
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    try:
        out = plot(a.paths, a.metric, a.out, a.title)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    print(out)
    return out


if __name__ == "__main__":
    main()
