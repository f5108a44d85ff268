"""Deprecated alias of :mod:`diffrank.experiments.tools.throughput`: the framework is grouped by concern now.

``python -m diffrank.experiments.throughput`` still runs
``python -m diffrank.experiments.tools.throughput``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.throughput moved to "
              "diffrank.experiments.tools.throughput; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.tools.throughput", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.tools.throughput import *  # noqa: F403
