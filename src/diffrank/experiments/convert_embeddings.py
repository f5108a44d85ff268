"""Deprecated alias of :mod:`diffrank.experiments.tools.convert_embeddings`: the framework is grouped by concern now.

``python -m diffrank.experiments.convert_embeddings`` still runs
``python -m diffrank.experiments.tools.convert_embeddings``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.convert_embeddings moved to "
              "diffrank.experiments.tools.convert_embeddings; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.tools.convert_embeddings", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.tools.convert_embeddings import *  # noqa: F403
