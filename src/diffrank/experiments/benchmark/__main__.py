"""``python -m diffrank.experiments.benchmark``: deprecated, runs ``python -m diffrank.benchmark``."""

from diffrank.benchmark import main

if __name__ == "__main__":
    raise SystemExit(main())
