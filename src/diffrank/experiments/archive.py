"""Deprecated alias of :mod:`diffrank.experiments.records.archive`: the framework is grouped by concern now.

``python -m diffrank.experiments.archive`` still runs
``python -m diffrank.experiments.records.archive``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.archive moved to "
              "diffrank.experiments.records.archive; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.records.archive", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.records.archive import *  # noqa: F403
