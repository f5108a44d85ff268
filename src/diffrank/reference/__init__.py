"""diffrank.reference."""
