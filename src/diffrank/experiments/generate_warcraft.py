"""Deprecated alias of :mod:`diffrank.experiments.rows.warcraft`: the framework is grouped by concern now.

``python -m diffrank.experiments.generate_warcraft`` still runs
``python -m diffrank.experiments.rows.warcraft``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.generate_warcraft moved to "
              "diffrank.experiments.rows.warcraft; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.rows.warcraft", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.rows.warcraft import *  # noqa: F403
