"""Print the experiment configs matching glob patterns, comma-joined: the value of a Hydra multirun.

Hydra's own ``glob()`` sweep lists only the files directly in ``configs/experiment/``, not the table folders::

    python train.py -m experiment=$(python -m diffrank.experiments.rows.list_experiments 'sorting/thesis_t3_3/*') \\
        seed=0,1,2,3,4
    python -m diffrank.experiments.rows.list_experiments 'sorting/*/svhn_*'      # every SVHN row

Usage: ``python -m diffrank.experiments.rows.list_experiments [PATTERN...]`` (default ``*``: every experiment config;
also ``diffrank-list-experiments``).
"""

from __future__ import annotations

import sys

from diffrank.registry import list_options


def experiment_names(patterns: list[str] | None = None) -> str:
    """The experiment config names matching any of the glob ``patterns`` (default ``*``), sorted and comma-joined.

    Raises:
        SystemExit: no config matches.
    """
    patterns = patterns or ["*"]
    names = sorted({name for p in patterns for name in list_options("experiment", p)})
    if not names:
        raise SystemExit(f"no experiment config matches {patterns}")
    return ",".join(names)


def main(argv: list[str] | None = None) -> None:
    """Print :func:`experiment_names` of the command line's patterns (``sys.argv[1:]`` by default)."""
    if argv is None:
        argv = sys.argv[1:]
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    print(experiment_names(argv))


if __name__ == "__main__":
    main()
