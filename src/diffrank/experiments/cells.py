"""Deprecated alias of :mod:`diffrank.experiments.tools.cells`: the framework is grouped by concern now.

``python -m diffrank.experiments.cells`` still runs
``python -m diffrank.experiments.tools.cells``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.cells moved to "
              "diffrank.experiments.tools.cells; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.tools.cells", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.tools.cells import *  # noqa: F403
