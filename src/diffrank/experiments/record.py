"""Deprecated alias of :mod:`diffrank.experiments.records.record`: the framework is grouped by concern now.

``python -m diffrank.experiments.record`` still runs
``python -m diffrank.experiments.records.record``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.record moved to "
              "diffrank.experiments.records.record; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.records.record", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.records.record import *  # noqa: F403
