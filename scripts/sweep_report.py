"""Rebuild a sweep's summary from its job folders: ``python scripts/sweep_report.py SWEEP_DIR... [--metric M]``.

A thin command line: the logic is :mod:`diffrank.experiments.sweeps` (``python -m diffrank.experiments.sweeps``).
"""

from diffrank.experiments.sweeps import main

if __name__ == "__main__":
    main()
