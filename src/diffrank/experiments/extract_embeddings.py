"""Deprecated alias of :mod:`diffrank.experiments.tools.extract_embeddings`: the framework is grouped by concern now.

``python -m diffrank.experiments.extract_embeddings`` still runs
``python -m diffrank.experiments.tools.extract_embeddings``; the old path goes in 0.3.
"""

import warnings

warnings.warn("diffrank.experiments.extract_embeddings moved to "
              "diffrank.experiments.tools.extract_embeddings; the old path goes in 0.3",
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
    import runpy

    runpy.run_module("diffrank.experiments.tools.extract_embeddings", run_name="__main__", alter_sys=True)
else:
    from diffrank.experiments.tools.extract_embeddings import *  # noqa: F403
