"""Benchmark every operator against its reference implementation: ``python scripts/benchmark_operators.py [--suite
grid] [--device cuda] ...``.

A thin command line: the benchmark is :mod:`diffrank.benchmark` (``python -m
diffrank.benchmark``, ``make bench``).
"""

from diffrank.benchmark import main

if __name__ == "__main__":
    main()
