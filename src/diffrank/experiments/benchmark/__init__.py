"""Deprecated alias of :mod:`diffrank.benchmark` (the benchmarks moved beside the library; removed in 0.3)."""

import warnings

from diffrank.benchmark import *  # noqa: F403
from diffrank.benchmark import main  # noqa: F401

warnings.warn("diffrank.experiments.benchmark moved to diffrank.benchmark; the old path goes in 0.3",
              FutureWarning, stacklevel=2)
