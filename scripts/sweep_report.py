"""Rebuild a sweep's summary from its job folders: ``python scripts/sweep_report.py SWEEP_DIR... [--metric M]``.

A thin command line: the logic is :mod:`diffrank.experiments.analysis.sweep_summary`
(``python -m diffrank.experiments.analysis.sweep_summary``).
"""

from diffrank.experiments.analysis.sweep_summary import main

if __name__ == "__main__":
    main()
