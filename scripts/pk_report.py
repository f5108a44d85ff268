"""The P_K × method grid of a top-k benchmark run offline: ``python scripts/pk_report.py RUN_DIR... [--out DIR]``.

A thin command line: the logic is :mod:`diffrank.experiments.analysis.report_pk`
(``python -m diffrank.experiments.analysis.report_pk``).
"""

from diffrank.experiments.analysis.report_pk import main

if __name__ == "__main__":
    main()
