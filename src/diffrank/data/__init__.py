"""diffrank.data."""
