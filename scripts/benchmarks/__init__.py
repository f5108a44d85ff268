"""Benchmark suites for ``scripts/benchmark_operators.py``; one module per family of operators."""
