"""The CPU kernels of fast soft sort / rank (Blondel et al. 2020, §3-§5): the projection onto the permutahedron
by pool adjacent violators (PAV) and its vector-Jacobian product, one call each for the whole batch.

For each row, with σ sorting z descending, s = z_σ and w sorted descending (paper Prop. 3):

- ``l2`` (P_Q): v = argmin_{v_1 >= ... >= v_n} ½‖v - (s - w)‖², block value mean(s_B) - mean(w_B);
- ``kl`` (P_E): v = argmin_{v_1 >= ... >= v_n} ⟨e^{s - v}, 1⟩ + ⟨e^w, v⟩, block value LSE(s_B) - LSE(w_B);

and the projection is μ = s - v, written back in z's order. The Jacobian of v is block diagonal (paper
Lemma 2, §5): within a block, ∂v/∂s has every row equal to 1/|B| (l2) or softmax(s_B) (kl), and ∂v/∂w to
-1/|B| or -softmax(w_B).

**Kinks and ties** (the convention of the authors' code, google-research/fast-soft-sort, and of torchsort):
adjacent blocks whose values are equal are pooled (a violation is ``v_prev <= v_next``, not ``<``), and the
Jacobian's blocks are the runs of the solution whose adjacent values differ by at most ``TOL`` = 1e-9, the
authors' ``_partition`` tolerance. At a kink (two blocks with equal values: integer-spaced scores at ε = 1,
ties) the projection has no derivative; this picks the one-sided Jacobian of the pooled block, so that e.g.
torchsort's README Spearman example gets a non-zero gradient.

Two ways to run the same kernels (:mod:`diffrank.operators.aot`; ``python -m diffrank.operators.aot --build``, or
``python -m diffrank.operators.fast_soft_sort_cpu --build`` for this file alone, builds the first):

- **compiled ahead** (numba's ``pycc``) into a plain extension module in ``$DIFFRANK_CACHE_DIR/aot``, loaded without
  numba: a fresh process's first call costs milliseconds where numba's cached JIT spends about a second in
  ``import numba`` and in loading its typing registries (measured: 0.05 s vs 1.9 s, 2-core machine under load).
  The build takes about 8 s of CPU; ``DIFFRANK_FSS_AOT=build`` builds on first use, ``DIFFRANK_FSS_AOT=0`` ignores
  the module.
- otherwise **numba's JIT** with ``cache=True``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from diffrank._shared import PAV_TOL as TOL
from diffrank.operators.aot import Kernels


def project_fwd(z, scale, order, w, worder, wrev, kl, mu, bid):  # pragma: no cover - compiled
    """Projection of every row: ``mu[b, order[b, i]] = s[b, i] - v[b, i]`` with ``s[b, i] = scale·z[b, order[b, i]]``;
    ``bid[b, i]`` = the Jacobian block (0, 1, ...) of sorted position i.

    ``z`` (1 or B, n) and ``order`` (same shape, int64) sorting each row of scale·z descending (``scale`` folds the
    caller's 1/ε into the kernel: no scaled copy); ``w`` (1 or B, n) and
    ``worder`` (same shape) sorting it descending (the sorted w is ``w[b, worder[b, i]]``; with ``wrev``, ascending:
    read from the end, which spares the caller a reversed copy); a single row is shared
    by the B rows of ``mu`` (B, n) and ``bid`` (B, n, int64), which are written. ``kl`` the regularization. (Both
    are read through their orders: no sorted copies, and a row that is already sorted needs no work.)
    """
    B, n = mu.shape
    last = n - 1
    shared_z = z.shape[0] == 1
    shared_w = w.shape[0] == 1
    bstart = np.empty(n + 1, np.int64)
    acc1 = np.empty(n, np.float64)  # l2: Σ (s - w) of the block; kl: LSE(s_B)
    acc2 = np.empty(n, np.float64)  # l2: |B|; kl: LSE(w_B)
    for b in range(B):
        zb = 0 if shared_z else b
        wb = 0 if shared_w else b
        nb = 0
        for i in range(n):
            if kl:
                a1 = scale * z[zb, order[zb, i]]
                a2 = float(w[wb, worder[wb, last - i if wrev else i]])
            else:
                a1 = scale * z[zb, order[zb, i]] - float(w[wb, worder[wb, last - i if wrev else i]])
                a2 = 1.0
            st = i
            while nb > 0:
                p = nb - 1
                # pool while the previous block's value is <= this one's: equal values pool too (the convention)
                if kl:
                    if acc1[p] - acc2[p] > a1 - a2:
                        break
                    hi = max(acc1[p], a1)
                    a1 = hi + math.log(math.exp(acc1[p] - hi) + math.exp(a1 - hi))
                    hi = max(acc2[p], a2)
                    a2 = hi + math.log(math.exp(acc2[p] - hi) + math.exp(a2 - hi))
                else:
                    if acc1[p] * a2 > a1 * acc2[p]:
                        break
                    a1 += acc1[p]
                    a2 += acc2[p]
                st = bstart[p]
                nb -= 1
            bstart[nb] = st
            acc1[nb] = a1
            acc2[nb] = a2
            nb += 1
        bstart[nb] = n
        # the Jacobian's blocks: runs of PAV blocks whose adjacent values differ by <= TOL (the authors' partition)
        nf = 0
        j = 0
        while j < nb:
            prev = acc1[j] - acc2[j] if kl else acc1[j] / acc2[j]
            k = j + 1
            while k < nb:
                val = acc1[k] - acc2[k] if kl else acc1[k] / acc2[k]
                if abs(val - prev) > TOL:
                    break
                prev = val
                k += 1
            a, e = bstart[j], bstart[k]
            if e - a == 1:  # a singleton's value is w exactly (integer ranks stay integers)
                mu[b, order[zb, a]] = w[wb, worder[wb, last - a if wrev else a]]
                bid[b, a] = nf
            else:
                # μ = s - mean / LSE(s_B) + mean / LSE(w_B), each taken relative to the block's first entry: s - v
                # cancels catastrophically once |s| is large next to w (|s| >= 1e10 gave ranks [0, 0, 0, 4, 0, 0])
                s0 = scale * z[zb, order[zb, a]]
                w0 = float(w[wb, worder[wb, last - a if wrev else a]])
                if kl:
                    ms = 0.0
                    mw = 0.0
                    for m in range(a, e):
                        ms = max(ms, scale * z[zb, order[zb, m]] - s0)
                        mw = max(mw, w[wb, worder[wb, last - m if wrev else m]] - w0)
                    ts = 0.0
                    tw = 0.0
                    for m in range(a, e):
                        ts += math.exp(scale * z[zb, order[zb, m]] - s0 - ms)
                        tw += math.exp(w[wb, worder[wb, last - m if wrev else m]] - w0 - mw)
                    cs = ms + math.log(ts)
                    cw = mw + math.log(tw)
                else:
                    cs = 0.0
                    cw = 0.0
                    for m in range(a, e):
                        cs += scale * z[zb, order[zb, m]] - s0
                        cw += w[wb, worder[wb, last - m if wrev else m]] - w0
                    cs /= e - a
                    cw /= e - a
                for m in range(a, e):
                    wm = w[wb, worder[wb, last - m if wrev else m]]
                    mu[b, order[zb, m]] = ((scale * z[zb, order[zb, m]] - s0) - cs) - ((wm - w0) - cw) + wm
                    bid[b, m] = nf
            nf += 1
            j = k


def project_bwd(g, z, scale, order, w, worder, wrev, bid, kl, need_z, need_w, gz, gw):  # pragma: no cover - compiled
    """VJP of :func:`project_fwd` for a cotangent ``g`` (B, n) in z's order: if ``need_z``, ``gz`` (B, n, z's
    order) and, if ``need_w``, ``gw`` (B, n, w's order); the caller sums a shared input's rows.

    Per block B with T = Σ_{i ∈ B} g_i: gz_i = scale·(g_i - p_i T) and gw_i = q_i T, p = q = 1/|B| (l2) or
    p = softmax(s_B), q = softmax(w_B) (kl); ``z`` (1 or B, n, like ``order``) is read only for kl (s = z[order]).
    """
    B, n = g.shape
    last = n - 1
    shared_z = order.shape[0] == 1
    shared_w = w.shape[0] == 1
    for b in range(B):
        zb = 0 if shared_z else b
        wb = 0 if shared_w else b
        a = 0
        while a < n:
            e = a + 1
            while e < n and bid[b, e] == bid[b, a]:
                e += 1
            tot = 0.0
            for m in range(a, e):
                tot += g[b, order[zb, m]]
            if e - a == 1:  # p = q = 1
                if need_z:
                    gz[b, order[zb, a]] = 0.0
                if need_w:
                    gw[b, worder[wb, last - a if wrev else a]] = tot
            elif not kl:
                c = tot / (e - a)
                for m in range(a, e):
                    if need_z:
                        gz[b, order[zb, m]] = scale * (g[b, order[zb, m]] - c)
                    if need_w:
                        gw[b, worder[wb, last - m if wrev else m]] = c
            else:
                hs = -math.inf
                hw = -math.inf
                for m in range(a, e):
                    hs = max(hs, scale * z[zb, order[zb, m]])
                    hw = max(hw, w[wb, worder[wb, last - m if wrev else m]])
                ts = 0.0
                tw = 0.0
                for m in range(a, e):
                    ts += math.exp(scale * z[zb, order[zb, m]] - hs)
                    tw += math.exp(w[wb, worder[wb, last - m if wrev else m]] - hw)
                for m in range(a, e):
                    if need_z:
                        pm = math.exp(scale * z[zb, order[zb, m]] - hs) / ts
                        gz[b, order[zb, m]] = scale * (g[b, order[zb, m]] - pm * tot)
                    if need_w:
                        wj = worder[wb, last - m if wrev else m]
                        gw[b, wj] = math.exp(w[wb, wj] - hw) / tw * tot
            a = e


def _signatures() -> dict[str, dict[str, str]]:
    """The pycc signatures of the two kernels by float dtype code (``"f4"`` / ``"f8"``): C-contiguous 2-D arrays."""
    out = {"project_fwd": {}, "project_bwd": {}}
    for code in ("f4", "f8"):
        f, i = f"{code}[:, ::1]", "i8[:, ::1]"
        out["project_fwd"][code] = f"void({f}, f8, {i}, {f}, {i}, b1, b1, {f}, {i})"
        out["project_bwd"][code] = f"void({f}, {f}, f8, {i}, {f}, {i}, b1, {i}, b1, b1, b1, {f}, {f})"
    return out


_DTYPE_CODES = {torch.float32: "f4", torch.float64: "f8"}

#: the kernels, ahead of time or by numba's JIT (:class:`diffrank.operators.aot.Kernels`; switch DIFFRANK_FSS_AOT)
KERNELS = Kernels("_diffrank_fss", __file__, globals(), _signatures(),
                  helpers=(), env="DIFFRANK_FSS_AOT")


def build_aot() -> Path:
    """Compile both kernels ahead of time (float32 and float64) into :func:`diffrank.operators.aot.cache_dir`;
    returns the module's path (:meth:`diffrank.operators.aot.Kernels.build`, which lists what it raises)."""
    return KERNELS.build()


def kernel(name: str, dtype) -> object:
    """The compiled kernel ``name`` (``"project_fwd"`` / ``"project_bwd"``) for ``dtype`` (torch.float32 / float64).

    Ahead-of-time when :func:`build_aot` has run on this machine, else numba's JIT (``cache=True``); resolved once
    per process.

    Raises:
        KeyError: another dtype.
    """
    return KERNELS(name, _DTYPE_CODES[dtype])


if __name__ == "__main__":  # this file's module alone (python -m diffrank.operators.aot --build builds them all)
    from diffrank.operators.aot import main

    main(modules=("diffrank.operators.fast_soft_sort_cpu",))
