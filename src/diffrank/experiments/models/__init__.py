"""diffrank.experiments.models."""
