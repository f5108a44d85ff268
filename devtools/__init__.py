"""Developer tooling that is not part of the installed package (run from the repository root)."""
