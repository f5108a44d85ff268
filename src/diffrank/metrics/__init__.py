"""diffrank.metrics."""
