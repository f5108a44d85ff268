"""Print the experiment configs matching glob patterns, comma-joined: the value of a Hydra multirun.

Hydra's own ``glob()`` sweep lists only the files directly in ``configs/experiment/``, not the table folders::

    python train.py -m experiment=$(python scripts/list_experiments.py 'sorting/thesis_t3_3/*') seed=0,1,2,3,4
    python scripts/list_experiments.py 'sorting/*/svhn_*'      # every SVHN row

Usage: ``python scripts/list_experiments.py [PATTERN...]`` (default ``*``: every experiment config).
"""

from __future__ import annotations

import sys

from diffrank.registry import list_options


def main(patterns: list[str] | None = None) -> str:
    """The matching names, sorted and comma-joined.

    Raises:
        SystemExit: no config matches.
    """
    patterns = patterns or ["*"]
    names = sorted({name for p in patterns for name in list_options("experiment", p)})
    if not names:
        raise SystemExit(f"no experiment config matches {patterns}")
    return ",".join(names)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
