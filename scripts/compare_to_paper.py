"""Compare our runs with the papers' tables: ``python scripts/compare_to_paper.py RUN_DIR... [--out DIR]``.

A thin command line: the logic is :mod:`diffrank.experiments.analysis.report`
(``python -m diffrank.experiments.analysis.report``,
``diffrank-report``).
"""

from diffrank.experiments.analysis.report import main

if __name__ == "__main__":
    main()
