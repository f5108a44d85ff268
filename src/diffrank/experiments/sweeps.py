"""Deprecated alias of :mod:`diffrank.experiments.analysis.sweep_summary`
and :mod:`diffrank.experiments.run.resolvers`: the framework is grouped by concern now.

``python -m diffrank.experiments.sweeps`` still runs
``python -m diffrank.experiments.analysis.sweep_summary``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.sweeps moved to "
              "diffrank.experiments.analysis.sweep_summary and diffrank.experiments.run.resolvers; "
              "the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.analysis.sweep_summary", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.analysis.sweep_summary import *  # noqa: F403
    from diffrank.experiments.run.resolvers import *  # noqa: F403
