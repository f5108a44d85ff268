"""``python -m diffrank.benchmark``: :func:`diffrank.benchmark.main`."""

from diffrank.benchmark import main

if __name__ == "__main__":
    main()
