"""Deprecated alias of :mod:`diffrank.experiments.run.train`: the framework is grouped by concern now.

``python -m diffrank.experiments.train`` still runs
``python -m diffrank.experiments.run.train``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.train moved to "
              "diffrank.experiments.run.train; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.run.train", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.run.train import *  # noqa: F403
