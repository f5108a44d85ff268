"""Small helpers: config lookup, instantiation, results files."""
