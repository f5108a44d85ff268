"""diffrank.experiments.metrics."""
