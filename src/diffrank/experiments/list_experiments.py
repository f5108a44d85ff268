"""Deprecated alias of :mod:`diffrank.experiments.rows.list_experiments`: the framework is grouped by concern now.

``python -m diffrank.experiments.list_experiments`` still runs
``python -m diffrank.experiments.rows.list_experiments``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.list_experiments moved to "
              "diffrank.experiments.rows.list_experiments; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.rows.list_experiments", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.rows.list_experiments import *  # noqa: F403
