"""LapSum's soft top-k on the CPU in numba (Struski et al. 2025, §4.1, Thm 4.1, eq. (4), App. C.2).

The inverse Lap_s⁻¹ is the closed form of :func:`diffrank.operators.lapsum._thresholds` (log-space knots, the
branch of the quadratic's root that does not cancel), with the knot sums from the paper's O(n) recurrences
B_i = 1 + e^{u_{i-1} - u_i} B_{i-1}, A_i = 1 + e^{u_i - u_{i+1}} A_{i+1} (every exponent <= 0, A, B in
[1, n]; the two recurrences share the n - 1 factors e^{u_{i-1} - u_i}; the logs only at the knots a target
needs) instead of two ``logcumsumexp`` passes, and a values-only sort instead of ``torch.sort``, which also
builds the permutation the top-k does not need (``numpy.sort`` for :func:`thresholds`; in the top-k kernel
numba's quicksort, or from n = 2048 on a radix sort, 2.5x faster than ``numpy.sort`` at n = 10⁵).

- :func:`thresholds`: the inverse alone (float32 / float64), for the PyTorch path of
  :class:`diffrank.operators.lapsum._LapSumTopK`.
- :func:`topk_forward` / :func:`topk_backward`: the whole top-k of float32 / float64 scores (computed in
  float64), forward (with the NaN / inf test of the scores, the inverse and the memberships p = F(t + β s)) and
  closed-form first-order VJP (which reads e^{-|x|} off p where that is exact), one numba call each
  (:class:`diffrank.operators.lapsum._LapSumTopKNumba`).
  The PyTorch path runs ~20 tensor operations (each a dispatch and an allocation) where these make one call;
  at n = 10³ that overhead was most of the time (docs/lapsum_figures.md).

The kernels (the functions marked compiled) run compiled ahead of time by numba's ``pycc`` when
``python -m diffrank.operators.aot --build`` has run on this machine (:mod:`diffrank.operators.aot`; switch
``DIFFRANK_LAPSUM_AOT=build|0``), else by numba's JIT (``cache=True``). A fresh process's first top-k (forward and
backward) then skips ``import numba`` and numba's cache loading (measured, B = 8, n = 100, 2-core machine under
load: 0.02 s vs 0.47 s with numba's cache warm, float32 and float64). The ahead-of-time code is no slower: at
B = 64, n = 10⁴, k = 5 (one thread) forward 4.0 vs 6.7 ms, backward 1.9 vs 2.1 ms (numba's JIT code for the host
CPU was the slower one here; with ``NUMBA_CPU_NAME=generic`` it takes 4.4 ms).

Imported lazily by :mod:`diffrank.operators.lapsum`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from diffrank.operators.aot import Kernels
from diffrank.operators.base import non_finite_error

_TINY = float(np.finfo(np.float64).tiny)


def _knot_sums(s_asc, beta, big_a, big_b, knots, rest=0.0):  # pragma: no cover - compiled
    """A_i, B_i and the knot values Lap(u_i) = i + ½ + ½(A_i - B_i) of one row (u = -β s, s_asc ascending).

    ``rest``: Σ_j e^{β(s_j - s_asc[0])} over items left out of ``s_asc`` (all <= s_asc[0]): then ``s_asc`` holds the
    m largest scores of a row and the sums are those of the whole row for its m first knots (the top-k forward)."""
    n = s_asc.shape[0]
    # u_i = -β s_(i) with s_(i) descending, i.e. s_asc read backwards; knots holds the shared factors
    # d_j = e^{β (s_asc[j] - s_asc[j+1])} <= 1 until it is overwritten by the knot values
    big_b[0] = 1.0
    for i in range(1, n):
        d = math.exp(beta * (s_asc[n - 1 - i] - s_asc[n - i]))
        knots[n - 1 - i] = d
        big_b[i] = 1.0 + d * big_b[i - 1]
    big_a[n - 1] = 1.0 + rest
    for i in range(n - 2, -1, -1):
        big_a[i] = 1.0 + knots[n - 2 - i] * big_a[i + 1]
    for i in range(n):
        knots[i] = i + 0.5 + 0.5 * (big_a[i] - big_b[i])


def _threshold(s_asc, beta, wv, big_a, big_b, knots):  # pragma: no cover - compiled
    """t with Σ_j F(t - u_j) = wv for one row (after :func:`_knot_sums`); wv >= n gives +inf."""
    n = s_asc.shape[0]
    lo_i, hi_i = 0, n  # c = #knots < wv (searchsorted, left)
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        if knots[mid] < wv:
            lo_i = mid + 1
        else:
            hi_i = mid
    c = lo_i
    if c == 0:
        return -beta * s_asc[n - 1] + math.log(2.0 * wv) - math.log(big_a[0])
    if c == n:
        rest = 2.0 * (n - wv)
        return (-beta * s_asc[0] - math.log(rest) + math.log(big_b[n - 1])) if rest > 0 else math.inf
    e = wv - c
    lo, hi = c - 1, c
    u_lo, u_hi = -beta * s_asc[n - 1 - lo], -beta * s_asc[n - 1 - hi]
    la_hi, lb_lo = math.log(big_a[hi]), math.log(big_b[lo])
    # log z, z = |e| + sqrt(e² + q), q = A_{i+1} B_i e^{u_i - u_{i+1}}, in log space (q underflows for knots far
    # apart): z = √q (r + sqrt(r² + 1)), r = |e|/√q; each branch of the root avoids a cancellation
    half_log_q = 0.5 * (la_hi + lb_lo + (u_lo - u_hi))
    log_abs_e = math.log(abs(e)) if e != 0 else -math.inf
    log_r = log_abs_e - half_log_q
    if log_r > 20:
        log_z = math.log(2.0) + log_abs_e
    else:
        log_z = half_log_q + math.asinh(math.exp(log_r))
    return u_hi + log_z - la_hi if e > 0 else u_lo - log_z + lb_lo


def _thresholds_rows(s_asc, beta, w, t):  # pragma: no cover - compiled
    """t[b, m] with Σ_j F(t - u_j) = w[b, m], u = -β s sorted ascending (s_asc: each row ascending)."""
    B, n = s_asc.shape
    big_a, big_b, knots = np.empty(n), np.empty(n), np.empty(n)
    for b in range(B):
        _knot_sums(s_asc[b], beta, big_a, big_b, knots)
        for m in range(w.shape[1]):
            t[b, m] = _threshold(s_asc[b], beta, w[b, m], big_a, big_b, knots)


_RADIX_MIN_N = 2048  # from this n on, a radix sort beats numba's quicksort (and numpy's sort): 2.5x faster at n = 10⁵


def _radix_sorted(a):  # pragma: no cover - compiled
    """``a`` (float64, finite, 1-D) sorted ascending: LSD radix sort, 8 passes of 8 bits over order-preserving
    integer keys (sign bit flipped for x >= 0, every bit for x < 0); a pass whose byte is the same in every key
    is skipped. The same values as ``numpy.sort`` (only -0.0 and 0.0 may come in another order: -0.0 first)."""
    n = a.shape[0]
    keys = a.copy().view(np.uint64)
    sign = np.uint64(1) << np.uint64(63)
    ones = ~np.uint64(0)
    for i in range(n):
        k = keys[i]
        keys[i] = k ^ ones if k & sign else k | sign
    counts = np.zeros((8, 256), np.int64)
    for i in range(n):
        k = keys[i]
        for d in range(8):
            counts[d, (k >> np.uint64(8 * d)) & np.uint64(255)] += 1
    src, dst = keys, np.empty_like(keys)
    for d in range(8):
        c = counts[d]
        if c[(src[0] >> np.uint64(8 * d)) & np.uint64(255)] == n:
            continue
        total = 0
        for j in range(256):
            cj = c[j]
            c[j] = total
            total += cj
        shift = np.uint64(8 * d)
        for i in range(n):
            k = src[i]
            byte = (k >> shift) & np.uint64(255)
            dst[c[byte]] = k
            c[byte] += 1
        src, dst = dst, src
    out = np.empty(n)
    bits = out.view(np.uint64)
    for i in range(n):
        k = src[i]
        bits[i] = k ^ sign if k & sign else k ^ ones
    return out


def _sorted(a):  # pragma: no cover - compiled
    """``a`` (1-D, finite) sorted ascending, by quicksort below :data:`_RADIX_MIN_N`, by radix sort from there."""
    return np.sort(a) if a.shape[0] < _RADIX_MIN_N else _radix_sorted(a)


_BUFFER_MAX_TOP = 64  # up to this many largest, one pass with a sorted buffer beats np.partition (a copy, a select)


def _largest_sorted(a, m):  # pragma: no cover - compiled
    """The m largest values of ``a`` (1-D, m <= len(a)), ascending, float64: one pass keeping them in a sorted
    buffer (insertion; an item below the buffer's minimum, most of them, costs one comparison)."""
    out = np.empty(m)
    for i in range(m):  # the first m, by insertion
        x = a[i]
        j = i
        while j > 0 and out[j - 1] > x:
            out[j] = out[j - 1]
            j -= 1
        out[j] = x
    for i in range(m, a.shape[0]):
        x = a[i]
        if x <= out[0]:
            continue
        j = 1
        while j < m and out[j] < x:
            out[j - 1] = out[j]
            j += 1
        out[j - 1] = x
    return out


def _topk_forward_rows(s, k, beta, t, p):  # pragma: no cover - compiled
    """t[b, m] = Lap⁻¹(k[b, m]) and p[b, m, i] = F(t[b, m] + β s[b, i]); rows with k >= n are all ones.
    ``k``: ``(1 or B, M)``.

    Only the knots up to c = #knots below k enter Lap⁻¹(k), and Lap(u_i) >= (i + 1)/2 (A_i >= 1, B_i <= i + 1), so
    c <= 2k - 1: the m = ⌊2 max k⌋ + 2 largest scores are selected (``np.partition``, O(n)) and sorted, the others
    enter through one sum, rest = Σ_j e^{β(s_j - s_ref)} (s_ref the m-th largest). Those items lie below the
    threshold (the m >= 2k + 1 largest all at or above it would give Σ p >= m/2 > k), so
    p_j = ½ e^{t + β s_ref} e^{β(s_j - s_ref)} reuses the exponentials of that sum: one exp per item and no full
    sort (for k <= n/8; otherwise the whole row is sorted).

    Returns False, computing nothing, when ``s`` holds NaN or ±inf."""
    B, n = s.shape
    for b in range(B):
        for i in range(n):
            if not math.isfinite(s[b, i]):
                return False
    big_a, big_b, knots, ex = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    for b in range(B):
        kb = b if k.shape[0] > 1 else 0
        kmax = 0.0
        for m in range(k.shape[1]):
            if kmax < k[kb, m] < n:
                kmax = k[kb, m]
        top_n = int(2.0 * kmax) + 2
        partial = 4 * top_n <= n
        if partial:
            if top_n <= _BUFFER_MAX_TOP:
                row = _largest_sorted(s[b], top_n)
            else:
                row = np.sort(np.partition(s[b], n - top_n)[n - top_n:]).astype(np.float64)
            ref = row[0]
            rest = 0.0
            for i in range(n):
                if s[b, i] <= ref:
                    e = math.exp(beta * (s[b, i] - ref))
                    ex[i] = e
                    rest += e
                else:
                    ex[i] = -1.0
            for i in range(top_n):  # the copies of ref among the top_n counted e^0 = 1 each above
                if row[i] == ref:
                    rest -= 1.0
            _knot_sums(row, beta, big_a, big_b, knots, max(rest, 0.0))
        else:
            row = _sorted(s[b].astype(np.float64))  # float32 scores: the radix sort reads float64 bits
            ref = 0.0
            _knot_sums(row, beta, big_a, big_b, knots)
        for m in range(k.shape[1]):
            if k[kb, m] >= n:
                t[b, m] = math.inf  # not used: the backward skips these rows (p ≡ 1)
                p[b, m, :] = 1.0
                continue
            tv = _threshold(row, beta, k[kb, m], big_a, big_b, knots)
            t[b, m] = tv
            half_ref = 0.5 * math.exp(tv + beta * ref) if partial else 0.0
            for i in range(n):
                if partial and ex[i] >= 0.0:
                    p[b, m, i] = half_ref * ex[i]
                    continue
                x = tv + beta * s[b, i]
                e = math.exp(-abs(x))
                p[b, m, i] = 0.5 * e if x <= 0 else 1.0 - 0.5 * e
    return True


def _topk_backward_rows(s, k, t, p, g, beta, grad_s, grad_k):  # pragma: no cover - compiled
    """The VJP of :func:`_topk_forward_rows` (rows with k >= n contribute nothing), see topk_backward;
    ``grad_k`` is ``(B, M)`` whatever the rows of ``k``.

    e = e^{-|x|} is read off the forward's p where that is exact, instead of a second exp: tiny < p < ½ means
    x <= 0 (x > 0 gives p = fl(1 - ½e) >= ½) and p = ½e with ½e a normal number (halving is exact there), so
    e = 2p to the bit (for float32 p, to float32 rounding: the precision of a float32 gradient). That holds for all
    items but the ~k largest, which are recomputed (the same exp)."""
    B, n = s.shape
    ex = np.empty(n)
    for b in range(B):
        grad_s[b, :] = 0.0
        kb = b if k.shape[0] > 1 else 0
        for m in range(k.shape[1]):
            if k[kb, m] >= n:
                grad_k[b, m] = 0.0
                continue
            tv = t[b, m]
            total = 0.0
            for i in range(n):
                pv = p[b, m, i]
                e = 2.0 * pv if _TINY < pv < 0.5 else math.exp(-abs(tv + beta * s[b, i]))
                ex[i] = e
                total += e
            denom = max(total, _TINY)
            vpi = 0.0  # ⟨v, π⟩, π = softmax(-|x|) = ∂p/∂k
            for i in range(n):
                vpi += g[b, m, i] * (ex[i] / denom)
            # ∂p_i/∂s_l = β R (δ_il π_i - π_i π_l), R = ½ Σ e^{-|x|}; the PyTorch path's formulas and order
            coef = 0.5 * beta * total
            for i in range(n):
                grad_s[b, i] += coef * (ex[i] / denom) * (g[b, m, i] - vpi)
            grad_k[b, m] = vpi


def _signatures() -> dict[str, dict[str, str]]:
    """The pycc signatures of the entry points, by dtype code of the scores (``"f4"`` / ``"f8"``; the thresholds
    are float64 only): C-contiguous arrays, as the callers below pass them."""
    out = {"_thresholds_rows": {"f8": "void(f8[:, ::1], f8, f8[:, ::1], f8[:, ::1])"},
           "_topk_forward_rows": {}, "_topk_backward_rows": {}}
    for f in ("f4", "f8"):
        s2, s3 = f"{f}[:, ::1]", f"{f}[:, :, ::1]"
        out["_topk_forward_rows"][f] = f"b1({s2}, f8[:, ::1], f8, f8[:, ::1], {s3})"
        out["_topk_backward_rows"][f] = f"void({s2}, f8[:, ::1], f8[:, ::1], {s3}, {s3}, f8, {s2}, {s2})"
    return out


#: the kernels, ahead of time or by numba's JIT (:class:`diffrank.operators.aot.Kernels`)
KERNELS = Kernels("_diffrank_lapsum", __file__, globals(), _signatures(),
                  helpers=("_knot_sums", "_threshold", "_radix_sorted", "_sorted", "_largest_sorted"),
                  env="DIFFRANK_LAPSUM_AOT")


def _f64(x: Tensor) -> np.ndarray:
    """A C-contiguous float64 numpy view (or copy) of a CPU tensor."""
    if x.dtype != torch.float64:
        x = x.to(torch.float64)
    if not x.is_contiguous():
        x = x.contiguous()
    return x.detach().numpy()


def thresholds(scores: Tensor, beta: float, w: Tensor) -> Tensor:
    """Lap⁻¹ in u-space for CPU scores: ``t (B, M)`` with Σ_j F(t + β s_j) = w (see lapsum._thresholds).

    Args:
        scores: ``(B, n)`` CPU float32 / float64 (validated, finite).
        beta: β > 0.
        w: ``(B, M)`` targets in (0, n] of the dtype of ``scores``; w >= n gives +inf.

    Returns:
        ``(B, M)`` thresholds, dtype of ``scores`` (computed in float64).
    """
    s_asc = np.sort(_f64(scores), axis=-1)
    wn = _f64(w)
    t = np.empty(wn.shape, np.float64)
    KERNELS("_thresholds_rows", "f8")(s_asc, float(beta), wn, t)
    return torch.from_numpy(t).to(scores.dtype)


def _ks_array(k: Tensor | list[float]) -> np.ndarray:
    """The ks as a float64 ``(1 or B, M)`` array of their own (a copy, never written): a list or an ``(M,)`` tensor
    gives one row for every set, a ``(B, M)`` tensor one per set."""
    if isinstance(k, Tensor):
        # order="C": an expanded (M,) → (B, M) tensor has strides (0, 8), which np.array would copy in Fortran order,
        # and the ahead-of-time kernels read every array as C-contiguous
        return np.array(k.detach().to(torch.float64).numpy(), np.float64, ndmin=2, order="C")
    return _ks_list(tuple(k))


@functools.lru_cache(maxsize=64)
def _ks_list(ks: tuple[float, ...]) -> np.ndarray:
    return np.array(ks, np.float64, ndmin=2)


def _array(x: Tensor) -> np.ndarray:
    """A C-contiguous numpy view (or copy) of a CPU tensor, in its own dtype."""
    return (x if x.is_contiguous() else x.contiguous()).detach().numpy()


def topk_forward(scores: Tensor, k: Tensor | list[float], beta: float) -> tuple[Tensor, tuple]:
    """The soft top-k forward.

    Args:
        scores: ``(B, n)`` float32 / float64 CPU (validated but for NaN / inf, which this pass tests); float32
            scores are computed in float64 and p rounded once to float32.
        k: ks in (0, n] (k >= n gives all ones): a list (one row of ks for every set) or a tensor ``(M,)`` or
            ``(B, M)``.
        beta: β > 0.

    Returns:
        ``(p, state)``: the memberships ``p (B, M, n)`` in the dtype of ``scores``, p = F(t + β s) with the float64
        thresholds t = Lap⁻¹(k) (+inf where k >= n), and what :func:`topk_backward` takes (numpy views of the scores
        and of p, the ks and t: no conversion in the backward; the caller keeps autograd's in-place check on the
        scores and p).

    Raises:
        ValueError: ``scores`` hold NaN or ±inf (the validation's error, :func:`~diffrank.operators.base.
            non_finite_error`: this pass is the operator's finiteness test, ``LapSum._hook_checks_finite``).
    """
    s = _array(scores)  # float32 is read as it is (numba promotes it): no converted copy
    kn = _ks_array(k)
    B, n = s.shape
    t = np.empty((B, kn.shape[1]), np.float64)
    p = np.empty((B, kn.shape[1], n), np.float64 if scores.dtype == torch.float64 else np.float32)
    if not KERNELS("_topk_forward_rows", f"f{s.itemsize}")(s, kn, float(beta), t, p):
        raise non_finite_error()
    return torch.from_numpy(p), (s, kn, t, p)


def topk_backward(state: tuple, grad_p: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """The VJP of :func:`topk_forward` (first order only: the operator's double backward takes the differentiable
    PyTorch form, :func:`diffrank.operators.lapsum._topk_vjp_graph`).

    With x = t + β s, e = e^{-|x|}, π = e / Σe (= ∂p/∂k) and R = ½ Σe: ∂L/∂k = ⟨v, π⟩ and
    ∂L/∂s_l = β R Σ_m π_l (v_l - ⟨v, π⟩) (paper App. C.2; rows with k >= n contribute nothing).

    Args:
        state: what :func:`topk_forward` returned with p.
        grad_p: ``(B, M, n)`` upstream gradient.
        beta: β > 0.

    Returns:
        ``(grad_s (B, n), grad_k (B, M))`` in the dtype of the scores (sums over the ks in it).
    """
    s, kn, t, p = state
    grad_s = np.empty(s.shape, s.dtype)
    grad_k = np.empty(t.shape, s.dtype)
    g = _array(grad_p)  # autograd gives the output's dtype
    KERNELS("_topk_backward_rows", f"f{s.itemsize}")(s, kn, t, p, g if g.dtype == p.dtype else g.astype(p.dtype),
                                                       float(beta), grad_s, grad_k)
    return torch.from_numpy(grad_s), torch.from_numpy(grad_k)
