"""diffrank.experiments.data."""
