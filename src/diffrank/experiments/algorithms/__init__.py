"""Exact and relaxed algorithms used as supervision (shortest paths on grids)."""
