"""diffrank: differentiable sorting, ranking and top-k operators and the experiments of their papers."""

__version__ = "0.1.0"
