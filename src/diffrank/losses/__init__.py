"""diffrank.losses."""
