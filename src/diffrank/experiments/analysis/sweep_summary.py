"""A sweep ends in an answer: the summary table, the plot and the best configuration of a Hydra multirun.

A sweep folder (``hydra.sweep.dir``) holds one folder per job (``.hydra/overrides.yaml`` from Hydra, and our
``results.json`` once the job has finished, :mod:`diffrank.experiments.records.record`). :func:`summarize` reads them
all (finished, failed or never finished) and writes, atomically, into the sweep folder:

- ``sweep_summary.csv``: one row per job: its folder, status (``done`` / ``failed`` / ``incomplete``), its
  overrides (all of them, and one column per swept key), every final metric, wall time, optimizer steps,
  world size and global batch;
- ``sweep.png``: the optimised metric against each swept numeric key (log x for β and for grids spanning a
  decade or more), one line per combination of the other swept keys (operator, …), the mean over seeds with a
  min-max band;
- ``best.yaml``: the best configuration by the seed-mean of the optimised metric (and the best one per value of
  the first categorical swept key, e.g. per operator).

The Hydra callback :class:`diffrank.experiments.callbacks.hydra_callbacks.SweepSummary` (``on_multirun_end``) and
this module's command line both call :func:`summarize`; the command line rebuilds the summary of a sweep that was
stopped, that had a failed job (Hydra then skips ``on_multirun_end``) or is still running, and prints the best
configuration (exit status 1 when a folder holds no job)::

    python -m diffrank.experiments.analysis.sweep_summary SWEEP_DIR... [--metric val/em5] [--mode max] [--no-write]

The resolvers the sweep configs use (``${beta_grid:…}``, ``${job_dir:…}``) are in
:mod:`diffrank.experiments.run.resolvers`: every run needs them, this summary only afterwards.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from diffrank.experiments.analysis.sweep_jobs import (
    SEED_KEYS,
    _is_number,
    _overrides,
    _resolve_metric,
    best_configs,
    job_dirs,
    job_row,
    parse_value,
    split_override,
    swept_keys,
)
from diffrank.experiments.records.disk import write_atomic

SUMMARY_CSV = "sweep_summary.csv"
PLOT_PNG = "sweep.png"
BEST_YAML = "best.yaml"


def _fmt_csv(v: Any) -> Any:
    return "" if v is None else v


def _log_x(key: str, xs: list[float]) -> bool:
    positive = all(x > 0 for x in xs)
    return positive and (key.rsplit(".", 1)[-1] in ("beta", "lr", "tau") or max(xs) / min(xs) >= 10)


def plot_png(rows: list[dict[str, Any]], keys: list[str], metric: str) -> bytes | None:
    """``sweep.png`` as bytes: ``metric`` against each swept numeric key (not the seed), one line per combination
    of the other swept keys, mean over seeds with a min-max band; a plot per job when no numeric key was swept.
    None when no finished job logged ``metric``."""
    done = [r for r in rows if r["status"] == "done" and _is_number(r["metrics"].get(metric))]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ovs = [_overrides(r) for r in done]
    numeric = [k for k in keys if k not in SEED_KEYS and all(_is_number(o.get(k)) for o in ovs)
               and len({o.get(k) for o in ovs}) > 1]
    panels = numeric or [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0), squeeze=False)
    for ax, x_key in zip(axes[0], panels):
        if x_key is None:
            ax.plot(range(len(done)), [r["metrics"][metric] for r in done], "o")
            ax.set_xticks(range(len(done)), [r["job"].name for r in done], rotation=90, fontsize=7)
            ax.set_xlabel("job")
        else:
            others = [k for k in keys if k != x_key and k not in SEED_KEYS]
            lines: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
            for r, o in zip(done, ovs):
                lines[tuple((k, o.get(k)) for k in others)][float(o[x_key])].append(float(r["metrics"][metric]))
            for label, pts in sorted(lines.items(), key=lambda kv: str(kv[0])):
                xs = sorted(pts)
                mean = [statistics.fmean(pts[x]) for x in xs]
                n_max = max(len(pts[x]) for x in xs)
                name = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in label) or metric
                (ln,) = ax.plot(xs, mean, "o-", label=name + (f" (mean of {n_max})" if n_max > 1 else ""))
                if n_max > 1:
                    ax.fill_between(xs, [min(pts[x]) for x in xs], [max(pts[x]) for x in xs], alpha=0.2,
                                    color=ln.get_color())
            if _log_x(x_key, [float(o[x_key]) for o in ovs]):
                ax.set_xscale("log", base=2)
            ax.set_xlabel(x_key)
            ax.legend(fontsize=7)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def summary_csv(rows: list[dict[str, Any]], keys: list[str], root: Path) -> str:
    """``sweep_summary.csv`` as text: job, status, one column per swept key, every metric (sorted), wall time,
    optimizer steps, world size, global batch, all overrides and a failed job's error."""
    metric_names = sorted({m for r in rows for m in r["metrics"]})
    header = ["job", "status", *keys, *metric_names, "wall_time_s", "optimizer_steps", "world_size",
              "global_batch", "overrides", "error"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        ov = _overrides(r)
        w.writerow([r["job"].relative_to(root).as_posix(), r["status"], *(_fmt_csv(ov.get(k)) for k in keys),
                    *(_fmt_csv(r["metrics"].get(m)) for m in metric_names), _fmt_csv(r["wall_time_s"]),
                    _fmt_csv(r["optimizer_steps"]), _fmt_csv(r["world_size"]), _fmt_csv(r["global_batch"]),
                    " ".join(r["overrides"]), _fmt_csv(r["error"])])
    return buf.getvalue()


class _NoAliasDumper(yaml.SafeDumper):
    """best.yaml repeats the best configuration under ``by``; written out twice, not as a YAML alias."""

    def ignore_aliases(self, data: Any) -> bool:
        """Never write YAML anchors: ``best.yaml`` must read as plain overrides."""
        return True


def summarize(sweep_dir: str | Path, metric: str | None = None, mode: str | None = None,
              write: bool = True) -> dict[str, Any]:
    """Summarise one sweep folder (finished or partial) and write its summary files.

    Args:
        sweep_dir: a Hydra sweep folder (``hydra.sweep.dir``).
        metric: the metric to optimise (default: the runs' ``optimized_metric``).
        mode: ``max`` / ``min`` (default: the runs' ``optimized_mode``, else ``max``).
        write: write ``sweep_summary.csv``, ``sweep.png`` and ``best.yaml`` into ``sweep_dir`` (atomically).

    Returns:
        ``{"sweep_dir", "rows", "keys", "metric", "mode", "counts": {status: n}, "best": best_configs(...) or None,
        "files": {name: path}}``.

    Raises:
        FileNotFoundError: ``sweep_dir`` is not a folder.
        ValueError: a mode other than max / min.
    """
    root = Path(sweep_dir)
    rows = [job_row(j) for j in job_dirs(root)]
    keys = swept_keys(rows)
    metric, mode = _resolve_metric(rows, metric, mode)
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    best = best_configs(rows, keys, metric, mode) if metric else None
    out: dict[str, Any] = {"sweep_dir": root, "rows": rows, "keys": keys, "metric": metric, "mode": mode,
                           "counts": dict(counts), "best": best, "files": {}}
    if not write:
        return out
    out["files"]["csv"] = write_atomic(root / SUMMARY_CSV, summary_csv(rows, keys, root))
    png = plot_png(rows, keys, metric) if metric else None
    if png is not None:
        out["files"]["png"] = write_atomic(root / PLOT_PNG, png)
    if best is not None:
        doc = {"sweep_dir": str(root), "job_counts": dict(counts), **best,
               "command_overrides": " ".join(f"{k}={v}" for k, v in best["best"]["overrides"].items())}
        out["files"]["best"] = write_atomic(root / BEST_YAML, yaml.dump(doc, Dumper=_NoAliasDumper, sort_keys=False))
    return out


def format_report(summary: dict[str, Any]) -> str:
    """A few lines for the console: job counts, the best configuration (and the best per operator), files."""
    lines = [f"sweep {summary['sweep_dir']}: " + ", ".join(f"{n} {s}" for s, n in sorted(summary["counts"].items()))]
    best = summary["best"]
    if best is None:
        lines.append(f"no finished job logged {summary['metric']}")
    else:
        b = best["best"]
        std = "" if b["std"] is None else f" ± {b['std']:.4f}"
        # a seeds-only sweep (``-m seed=0,1,2``) has one configuration: its value is the mean over the seeds
        what = " ".join(f"{k}={v}" for k, v in b["overrides"].items()) or "the defaults (only the seed swept)"
        lines.append(f"best {best['metric']} ({best['mode']}): {b['mean']:.4f}{std} over {b['n']} run(s) with "
                     + what)
        for key, per in best["by"].items():
            for value, c in per.items():
                ov = " ".join(f"{k}={v}" for k, v in c["overrides"].items() if k != key)
                lines.append(f"  best for {key}={value}: {c['mean']:.4f} with {ov}")
    lines += [f"  {name}: {path}" for name, path in summary["files"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Command line (``python -m diffrank.experiments.analysis.sweep_summary SWEEP_DIR...``); returns one
    :func:`summarize` per folder.

    Raises:
        SystemExit: a folder that does not exist or holds no job (status 1), bad arguments (status 2).
    """
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.analysis.sweep_summary", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dirs", nargs="+", help="Hydra sweep folders (hydra.sweep.dir)")
    ap.add_argument("--metric", default=None, help="metric to optimise (default: the runs' optimized_metric)")
    ap.add_argument("--mode", choices=("max", "min"), default=None, help="default: the runs' optimized_mode")
    ap.add_argument("--no-write", action="store_true", help="print only; write no file")
    a = ap.parse_args(argv)
    out = []
    for d in a.sweep_dirs:
        try:
            summary = summarize(d, a.metric, a.mode, write=not a.no_write)
        except FileNotFoundError as e:
            sys.exit(f"error: {e}")
        except OSError as e:  # a summary file cannot be written (a full or read-only disk)
            sys.exit(f"error: cannot write the summary files into {d}: {e.strerror or e}")
        if not summary["rows"]:
            sys.exit(f"error: {d} holds no job folder (.hydra/overrides.yaml or results.json)")
        print(format_report(summary))
        out.append(summary)
    return out


__all__ = ["BEST_YAML", "PLOT_PNG", "SUMMARY_CSV", "best_configs", "format_report", "job_dirs", "job_row", "main",
           "parse_value", "plot_png", "split_override", "summarize", "summary_csv", "swept_keys"]


if __name__ == "__main__":
    main()
