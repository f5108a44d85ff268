"""P_K: the distribution over k in the top-k cross-entropy (Petersen et al., ICML 2022, §3)."""

from __future__ import annotations

import math
from collections.abc import Sequence


class PK:
    """A validated distribution P_K(k), k = 1..len(weights).

    Args:
        weights: P_K(1), P_K(2), ... as a sequence of non-negative floats summing to 1 (± 1e-4, the
            reference code's tolerance), e.g. ``[0.5, 0, 0, 0, 0.5]`` (the paper's P_K = [.5,0,0,0,.5]).

    Attributes:
        weights: tuple of floats.
        k_max: the largest k with P_K(k) > 0 ("max k": the m-subset must be larger).

    Raises:
        ValueError: if empty, non-finite, negative, or not summing to 1.
    """

    def __init__(self, weights: Sequence[float]) -> None:
        if isinstance(weights, (int, float)):
            weights = [weights]
        w = [float(x) for x in weights]
        if not w:
            raise ValueError("P_K must have at least one weight")
        if not all(math.isfinite(x) for x in w):
            raise ValueError(f"P_K weights must be finite, got {w}")
        if any(x < 0 for x in w):
            raise ValueError(f"P_K has negative mass: {w}")
        if abs(sum(w) - 1.0) > 1e-4:
            raise ValueError(f"P_K must sum to 1 (±1e-4), got sum {sum(w):.6f} for {w}")
        self.weights = tuple(w)
        self.k_max = max(i + 1 for i, x in enumerate(w) if x > 0)

    def __len__(self) -> int:
        return len(self.weights)

    def __repr__(self) -> str:
        return f"PK({list(self.weights)})"

    def support(self, start: int = 1) -> list[int]:
        """The ks >= ``start`` with P_K(k) > 0, ascending."""
        return [i + 1 for i, x in enumerate(self.weights) if x > 0 and i + 1 >= start]
