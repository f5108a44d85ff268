"""Deprecated alias of :mod:`diffrank.experiments.analysis.report`: the framework is grouped by concern now.

``python -m diffrank.experiments.report`` still runs
``python -m diffrank.experiments.analysis.report``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.report moved to "
              "diffrank.experiments.analysis.report; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.analysis.report", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.analysis.report import *  # noqa: F403
