"""``python -m diffrank.experiments.benchmark``: :func:`diffrank.experiments.benchmark.main`."""

from diffrank.experiments.benchmark import main

if __name__ == "__main__":
    main()
