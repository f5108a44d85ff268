"""LapSum's inverse Lap_s⁻¹ on the CPU as one numba pass per row (Struski et al. 2025, §4.1, Thm 4.1, eq. (4)).

The same closed form as :func:`diffrank.operators.lapsum._thresholds` (log-space knots, the branch of the
quadratic's root that does not cancel), with the knot sums from the paper's O(n) recurrences
B_i = 1 + e^{u_{i-1} - u_i} B_{i-1}, A_i = 1 + e^{u_i - u_{i+1}} A_{i+1} (every exponent <= 0, A, B in
[1, n]; the logs only at the knots a target needs), instead of two ``logcumsumexp`` passes, and a
values-only ``numpy.sort`` instead of ``torch.sort`` (which also builds the permutation the top-k forward
does not need): less forward time on one CPU thread at n = 10⁵ (docs/lapsum_figures.md). Imported lazily
(numba) by :mod:`diffrank.operators.lapsum`.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from torch import Tensor


@numba.njit(cache=True, nogil=True)
def _thresholds_rows(s_asc, beta, w, t, big_a, big_b, knots):  # pragma: no cover - compiled
    """t[b, m] with Σ_j F(t - u_j) = w[b, m], u = -β s sorted ascending (s_asc: each row ascending)."""
    B, n = s_asc.shape
    M = w.shape[1]
    for b in range(B):
        # u_i = -β s_(i) with s_(i) descending, i.e. s_asc read backwards
        # A_i, B_i in [1, n] by the paper's recurrences (every exponent <= 0: nothing overflows); their logs are
        # taken only at the two knots each target needs
        big_b[0] = 1.0
        for i in range(1, n):
            big_b[i] = 1.0 + math.exp(beta * (s_asc[b, n - 1 - i] - s_asc[b, n - i])) * big_b[i - 1]
        big_a[n - 1] = 1.0
        for i in range(n - 2, -1, -1):
            big_a[i] = 1.0 + math.exp(beta * (s_asc[b, n - 2 - i] - s_asc[b, n - 1 - i])) * big_a[i + 1]
        for i in range(n):
            knots[i] = i + 0.5 + 0.5 * (big_a[i] - big_b[i])
        for m in range(M):
            wv = w[b, m]
            lo_i, hi_i = 0, n  # c = #knots < wv (searchsorted, left)
            while lo_i < hi_i:
                mid = (lo_i + hi_i) // 2
                if knots[mid] < wv:
                    lo_i = mid + 1
                else:
                    hi_i = mid
            c = lo_i
            if c == 0:
                t[b, m] = -beta * s_asc[b, n - 1] + math.log(2.0 * wv) - math.log(big_a[0])
                continue
            if c == n:
                rest = 2.0 * (n - wv)
                t[b, m] = (-beta * s_asc[b, 0] - math.log(rest) + math.log(big_b[n - 1])) if rest > 0 else math.inf
                continue
            e = wv - c
            lo, hi = c - 1, c
            u_lo, u_hi = -beta * s_asc[b, n - 1 - lo], -beta * s_asc[b, n - 1 - hi]
            la_hi, lb_lo = math.log(big_a[hi]), math.log(big_b[lo])
            half_log_q = 0.5 * (la_hi + lb_lo + (u_lo - u_hi))
            log_abs_e = math.log(abs(e)) if e != 0 else -math.inf
            log_r = log_abs_e - half_log_q
            if log_r > 20:
                log_z = math.log(2.0) + log_abs_e
            else:
                log_z = half_log_q + math.asinh(math.exp(log_r))
            t[b, m] = u_hi + log_z - la_hi if e > 0 else u_lo - log_z + lb_lo


def thresholds(scores: Tensor, beta: float, w: Tensor) -> Tensor:
    """Lap⁻¹ in u-space for CPU scores: ``t (B, M)`` with Σ_j F(t + β s_j) = w (see lapsum._thresholds).

    Args:
        scores: ``(B, n)`` CPU float32 / float64 (validated, finite).
        beta: β > 0.
        w: ``(B, M)`` targets in (0, n] of the dtype of ``scores``; w >= n gives +inf.

    Returns:
        ``(B, M)`` thresholds, dtype of ``scores`` (computed in float64).
    """
    s_asc = np.sort(scores.detach().to(torch.float64).numpy(), axis=-1)
    wn = w.detach().to(torch.float64).contiguous().numpy()
    n = s_asc.shape[1]
    t = np.empty(wn.shape, np.float64)
    _thresholds_rows(s_asc, float(beta), wn, t, np.empty(n), np.empty(n), np.empty(n))
    return torch.from_numpy(t).to(scores.dtype)
