"""diffrank.models."""
