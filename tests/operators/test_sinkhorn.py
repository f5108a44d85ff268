"""SinkhornSort's numeric range: a β beyond the compute dtype raises, a solve that stops above its tolerance warns."""

from __future__ import annotations

import pytest
import torch

from diffrank.operators import load


def test_beta_beyond_the_dtype_range_raises_and_non_convergence_warns():
    """At β = 1e8 / 1e9 in float32 rows summed to 1.91 / 186, silently (u·β ≥ 6)."""
    torch.manual_seed(0)
    s = torch.randn(4, 6)
    with pytest.raises(ValueError, match=r"beta=1e\+09 is out of float32's range.*float64"):
        load("sinkhorn", beta=1e9)(s)
    p = load("sinkhorn", beta=1e9)(s.double())  # float64 holds it: u·β ≈ 1e-7
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 6, dtype=torch.float64))
    torch.testing.assert_close(p.sum(-2), torch.ones(4, 6, dtype=torch.float64), atol=1e-2, rtol=0)
    p32 = load("sinkhorn", beta=1e6)(s)  # the largest decade float32 still converges at
    torch.testing.assert_close(p32.sum(-2), torch.ones(4, 6), atol=1e-2, rtol=0)
    with pytest.warns(RuntimeWarning, match="did not converge.*after 3 iterations"):
        load("sinkhorn", beta=100.0, max_iter=3, epsilon_start=None, check_every=1)(s)
