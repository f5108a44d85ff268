"""The LapSum paper's runtime / memory / approximation figures (Struski et al. 2025, Figs. 5, 7, 10, 11, 14).

``python -m diffrank.benchmark --suite lapsum_figures`` (``make bench ARGS="--suite lapsum_figures"``)
writes, into ``--figures-dir`` (default ``docs/figures``):

- ``lapsum_figures.csv``: one row per method x n x k x mode (forward, forward+backward): median time, peak extra
  memory (``harness.measure``), or why the cell was not measured (the method's stop: time cap, memory cap,
  a size it cannot build, an error);
- ``lapsum_time.png``, ``lapsum_memory.png`` (Figs. 10 / 11 layout: rows k ∈ {1, 10, n/10}, columns forward /
  forward+backward; log-log against n);
- ``lapsum_cd_time.png``, ``lapsum_cd_memory.png``: critical-difference diagrams (Demšar 2006; Friedman +
  Nemenyi post-hoc, drawn by ``scikit_posthocs.critical_difference_diagram``) over the blocks (n, k, mode); a
  method that stopped before a block ranks last in it (ties), as a method that cannot run is worst;
- ``lapsum_error.png`` and rows ``mode=error`` in the CSV (Fig. 7): mean absolute error of each soft top-k
  against the hard top-k mask, Σ|m - hard| / (2k) (the fraction of the top-k mass misplaced), at matched β;
- ``lapsum_permutation.png`` and rows ``table=permutation`` (Fig. 14): full soft permutation P, forward and
  forward+backward time and memory (config β), and the error ‖P - P_hard‖₁ / (2n) at β = 10 (``note``), for
  the operators with P;
- ``lapsum_official.csv``: our LapSum against the official C++ extension (``make lapsum-reference``; rows
  skip without it): max |Δ| of values and gradients (float64) and the time ratio official / ours.

Methods (soft top-k): every operator of ``configs/operator/`` with ``topk_membership`` at its config's
settings, plus variants (SOFT top-k with the official 200 plain Sinkhorn iterations; sparse top-k p = 2 by PAV
and by Dykstra, 500 iterations as the official default), the peer libraries (difftopk ``NeuralSort`` /
``SoftSort`` / ``DiffTopkNet`` bitonic, diffsort ``DiffSortNet`` bitonic), and the official LapSum C++
extension. Scores: B = 1 set of n standard normal scores, float64 where a method supports it (ours, the
official LapSum), float32 otherwise (the peers), as the paper does (App. D, "Error, Runtime and Memory").

Stopping rule (one line per stop in the CSV ``note``): going up in n, a method stops when its forward+backward
time at the previous n, scaled by (n / n_prev)^e (e = 2 for the O(n²) methods, 1.5 for the top-k networks, 1.2
for the O(n log n) ones; the slowest of its k cells), exceeds
``--cap-seconds`` (default 10 s per call; a cell's timing budget is min(``--max-seconds``, the cap), so a call
near the cap is timed once), when its peak memory scaled the same way exceeds ``--cap-gb``
(default 3 GB: the machine is shared), when its call fails (e.g. out of memory), or when it cannot be built at
that n. The whole suite keeps under about 30 minutes on 2 CPU cores with one thread (``--quick``: seconds).
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import math
import statistics
import time
import warnings
from pathlib import Path

import torch

from diffrank.benchmark.grid import cell
from diffrank.benchmark.harness import Measurement, fmt_bytes, fmt_time, fwd_bwd

NS = [100, 1000, 10000, 100000, 1000000]
QUICK_NS = [50, 200]
ERROR_NS = [100, 1000, 10000]
ERROR_BETAS = [1.0, 10.0, 100.0]
PERM_NS = [10, 30, 100, 300, 1000, 3000]
PERM_ERROR_BETA = 10.0
QUICK_PERM_NS = [10, 100]
CSV_FIELDS = ["table", "method", "dtype", "n", "k", "mode", "beta", "seconds", "peak_bytes", "error", "repeats",
              "note"]
# growth exponents of the stopping rule: n x n matrices (NeuralSort, SoftSort, Sinkhorn, full-P networks) 2;
# the top-k networks (k rows through L = O(log² n) layers) 1.5; the O(n log n) methods 1.2
QUADRATIC = {"neuralsort", "softsort", "sinkhorn", "relaxed_bubble_sort", "diffsort_odd_even", "diffsort_bitonic",
             "difftopk_bitonic", "difftopk_splitter"}
EXPONENT = {"difftopk_bitonic": 1.5, "difftopk_splitter": 1.5}
LAPSUM = "lapsum"
OFFICIAL = "lapsum official (C++)"


def _ks(n: int) -> list[int]:
    return sorted({1, min(10, n), max(1, n // 10)})


# -- methods ---------------------------------------------------------------------------------------------
def topk_methods(device: str) -> list[tuple[str, object, torch.dtype, float, str]]:
    """``(label, fn(x, k) -> (B, n) or None, dtype, growth exponent, why-not)`` of every soft top-k method."""
    from diffrank.operators import available, load

    out = []
    for name in available():
        op = load(name)
        if "topk_membership" not in op.capabilities:
            continue
        op = op.to(device)
        expo = EXPONENT.get(name, 2.0 if name in QUADRATIC else 1.2)
        out.append((name, _membership(op), torch.float64, expo, ""))
        if name == "soft_topk":
            v = load(name, solver="sinkhorn", max_iter=200, tolerance=None, epsilon_start=None)
            out.append(("soft_topk (200 Sinkhorn it.)", _membership(v), torch.float64, 1.2, ""))
        if name == "sparse_soft_topk":
            out.append(("sparse_soft_topk p=2 (PAV)", _membership(load(name, p=2)), torch.float64, 1.2, ""))
            out.append(("sparse_soft_topk p=2 (Dykstra 500 it.)",
                        _membership(load(name, p=2, solver="dykstra", max_iter=500)), torch.float64, 1.2, ""))
    out.extend(_peers(device))
    from diffrank.benchmark.lapsum_reference import official_topk

    f = official_topk() if device == "cpu" else None
    why = "" if f is not None else ("not built (make lapsum-reference)" if device == "cpu" else "CPU extension only")
    beta = load(LAPSUM).beta
    out.append((OFFICIAL, (lambda s, k: f(s, k, beta)) if f else None, torch.float64, 1.2, why))
    return out


def _membership(op):
    def fn(s: torch.Tensor, k: int) -> torch.Tensor:
        """The operator's top-k membership ``(B, n)``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # unconverged iterative solvers: timed as configured
            return op.topk_membership(s, [k])[:, 0]
    return fn


def _peers(device: str) -> list:
    from diffrank.operators import load

    out = []
    if importlib.util.find_spec("difftopk") is not None:
        import difftopk

        ns = difftopk.NeuralSort(tau=1.0 / load("neuralsort").beta)
        ss = difftopk.SoftSort(tau=1.0 / load("softsort").beta)
        # difftopk's NeuralSort: [batch, item, ascending position]; SoftSort: [batch, descending rank, item]
        out.append(("difftopk NeuralSort (peer)", lambda s, k: ns(s)[:, :, -k:].sum(-1), torch.float32, 2.0, ""))
        out.append(("difftopk SoftSort (peer)", lambda s, k: ss(s)[:, :k].sum(1), torch.float32, 2.0, ""))
        out.append(("difftopk DiffTopkNet bitonic (peer)", _difftopk_net(device), torch.float32, 2.0, ""))
    else:
        out.append(("difftopk (peer)", None, torch.float32, 2.0, "not installed"))
    if importlib.util.find_spec("diffsort") is not None:
        out.append(("diffsort DiffSortNet bitonic (peer)", _diffsort_net(device), torch.float32, 3.0, ""))
    else:
        out.append(("diffsort (peer)", None, torch.float32, 3.0, "not installed"))
    return out


def _difftopk_net(device: str, beta: float | None = None):
    import difftopk

    from diffrank.operators import load

    op, cache = load("difftopk_bitonic", **({} if beta is None else {"beta": beta})), {}

    def fn(s: torch.Tensor, k: int) -> torch.Tensor:
        """difftopk's dense bitonic top-k network: membership = the sum of its top k columns."""
        n = s.shape[1]
        if n > 1024:
            raise MemoryError("dense DiffTopkNet beyond n = 1024 (O(L·n²) matrices; see grid.peer)")
        if (n, k) not in cache:
            with contextlib.redirect_stdout(io.StringIO()):
                cache[(n, k)] = difftopk.DiffTopkNet("bitonic", n, k, sparse=False, device=device, steepness=op.beta,
                                                     art_lambda=op.art_lambda, distribution=op.sigmoid)
        return cache[(n, k)](s)[1].sum(-1)
    return fn


def _diffsort_net(device: str, beta: float | None = None):
    import diffsort

    from diffrank.operators import load

    op, cache = load("diffsort_bitonic", **({} if beta is None else {"beta": beta})), {}

    def fn(s: torch.Tensor, k: int) -> torch.Tensor:
        """diffsort's full P (B, item, ascending position): membership = the sum of the last k positions."""
        n = s.shape[1]
        if n > 1024:
            raise MemoryError("DiffSortNet beyond n = 1024 (O(L·B·n³) dense layers)")
        if n not in cache:
            cache[n] = diffsort.DiffSortNet("bitonic", n, device=device, steepness=op.beta, distribution=op.sigmoid)
        return cache[n](s)[1][:, :, -k:].sum(-1)
    return fn


# -- the stopping rule -----------------------------------------------------------------------------------
def _stop_reason(last: tuple | None, n: int, exponent: float, cap_s: float, cap_bytes: float) -> str | None:
    if last is None:
        return None
    n0, m = last
    if m.error:
        return f"stopped: failed at n = {n0} ({m.error[:60]})"
    scale = (n / n0) ** exponent
    if m.seconds * scale > cap_s:
        return f"stopped: ~{fmt_time(m.seconds * scale)} per call predicted > cap {cap_s:g} s"
    if m.peak_bytes == m.peak_bytes and m.peak_bytes * scale > cap_bytes:
        return f"stopped: ~{fmt_bytes(m.peak_bytes * scale)} predicted > cap {fmt_bytes(cap_bytes)}"
    return None


def _skip(why: str) -> Measurement:
    return Measurement(float("nan"), float("nan"), error=why)


def _row(table, method, dtype, n, k, mode, beta, m: Measurement, note="") -> dict:
    return {"table": table, "method": method, "dtype": str(dtype).removeprefix("torch."), "n": n, "k": k,
            "mode": mode, "beta": beta, "seconds": m.seconds, "peak_bytes": m.peak_bytes, "error": m.error or "",
            "repeats": m.extra.get("repeats", 0), "note": note}


def run_timing(args, sink) -> list[dict]:
    """Figs. 10 / 11: every soft top-k method x n x k, forward and forward+backward."""
    ns = QUICK_NS if args.quick else (args.n or NS)
    cap_s, cap_bytes = args.cap_seconds, args.cap_gb * 1e9
    budget = min(args.max_seconds, cap_s)  # a call near the cap is timed once, not 5 times
    rows = []
    for label, fn, dtype, expo, why in topk_methods(args.device):
        last = None  # (n, the slowest / largest of its k cells): one stop for every k of the method
        for n in ns:
            stop = why or _stop_reason(last, n, expo, cap_s, cap_bytes)
            worst = None
            x = torch.randn(1, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64).to(dtype)
            x = x.to(args.device)
            for k_rule in ("1", "10", "n/10"):
                k = {"1": 1, "10": min(10, n), "n/10": max(1, n // 10)}[k_rule]
                if k_rule == "n/10" and n // 10 == 10:  # k = 10 = n/10 at n = 100: one cell, kept under "10"
                    continue
                if stop:
                    f = fb = _skip(stop)
                else:
                    f, fb = cell(lambda s, fn=fn, k=k: fn(s, k), x, args.device, budget)
                    m = fb if fb.error else Measurement(max(fb.seconds, f.seconds), max(fb.peak_bytes, f.peak_bytes))
                    if m.error or worst is None:
                        worst = m if m.error or worst is None else worst
                    elif not worst.error:
                        worst = Measurement(max(worst.seconds, m.seconds), max(worst.peak_bytes, m.peak_bytes))
                for mode, m in (("forward", f), ("forward+backward", fb)):
                    rows.append(sink(_row("topk", label, dtype, n, k_rule, mode, "config", m)))
            if worst is not None:
                last = (n, worst)
    return rows


def run_error(args, sink) -> list[dict]:
    """Fig. 7: Σ|m - hard| / (2k) of every soft top-k method at matched β (float64 where supported)."""
    ns = QUICK_NS if args.quick else ERROR_NS
    rows = []
    for label, fn, dtype, _, why in topk_methods(args.device):
        for beta in ERROR_BETAS:
            for n in ns:
                x = torch.randn(4, n, generator=torch.Generator().manual_seed(7 + n), dtype=torch.float64)
                for k in _ks(n):
                    hard = torch.zeros_like(x).scatter_(1, x.topk(k, dim=1).indices, 1.0)
                    t0 = time.perf_counter()
                    err, note = float("nan"), why
                    if not why and (n <= 1000 or label.split(" ")[0] not in QUADRATIC | {"difftopk", "diffsort"}):
                        try:
                            m = _matched(label, beta, args.device)
                            out = (m(x.to(dtype).to(args.device), k) if m else fn(x.to(dtype).to(args.device), k))
                            err = float((out.double().cpu() - hard).abs().sum(1).mean() / (2 * k))
                        except Exception as e:  # noqa: BLE001 - a failing method is a cell, not a crash
                            note = f"{type(e).__name__}: {e}"[:80]
                    elif not why:
                        note = "skipped: O(n²) method beyond n = 1000"
                    mm = Measurement(time.perf_counter() - t0, float("nan"), error=note or None)
                    r = _row("topk", label, dtype, n, k, "error", beta, mm, note)
                    r["error"], r["note"] = err, note
                    rows.append(sink(r))
    return rows


def _matched(label: str, beta: float, device: str):
    """The method rebuilt at β (None: the label's own fn, for methods without a β we set, i.e. none)."""
    from diffrank.operators import load

    base = label.split(" ")[0]
    if label == OFFICIAL:
        from diffrank.benchmark.lapsum_reference import official_topk

        f = official_topk()
        return (lambda s, k: f(s, k, beta)) if f else None
    if label.endswith("(peer)"):
        import difftopk

        if "NeuralSort" in label:
            ns = difftopk.NeuralSort(tau=1.0 / beta)
            return lambda s, k: ns(s)[:, :, -k:].sum(-1)
        if "SoftSort" in label:
            ss = difftopk.SoftSort(tau=1.0 / beta)
            return lambda s, k: ss(s)[:, :k].sum(1)
        net = _difftopk_net(device, beta) if "DiffTopkNet" in label else _diffsort_net(device, beta)
        return net  # steepness β multiplies score differences, as an inverse temperature
    over = {"beta": beta}
    if label == "soft_topk (200 Sinkhorn it.)":
        over.update(solver="sinkhorn", max_iter=200, tolerance=None, epsilon_start=None)
    elif label.startswith("sparse_soft_topk p=2"):
        over.update(p=2, solver="dykstra" if "Dykstra" in label else "pav", max_iter=500)
    return _membership(load(base, **over).to(device))


def run_permutation(args, sink) -> list[dict]:
    """Fig. 14: full soft permutation P (every operator with ``permutation``), time / memory and ‖P - P_hard‖₁/(2n)."""
    from diffrank.operators import available, load

    ns = QUICK_PERM_NS if args.quick else PERM_NS
    rows = []
    for name in available():
        op = load(name)
        if "permutation" not in op.capabilities:
            continue
        op = op.to(args.device)
        matched = load(name, beta=PERM_ERROR_BETA).to(args.device)
        expo = 3.0 if name in ("relaxed_bubble_sort", "diffsort_odd_even") else 2.2
        last = None
        for n in ns:
            x = torch.randn(1, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64).to(args.device)
            stop = _stop_reason(last, n, expo, args.cap_seconds, args.cap_gb * 1e9)
            if stop:
                f = fb = _skip(stop)
            else:
                f, fb = cell(lambda s, op=op: op(s), x, args.device, min(args.max_seconds, args.cap_seconds))
                last = (n, fb if fb.error else Measurement(max(fb.seconds, f.seconds), fb.peak_bytes))
            err = float("nan")
            if not f.error:
                with torch.no_grad():
                    P = matched(x).double().cpu()
                order = x.cpu().argsort(dim=1, descending=True)
                hard = torch.zeros_like(P).scatter_(2, order.unsqueeze(-1), 1.0)
                err = float((P - hard).abs().sum((1, 2)).mean() / (2 * n))
            for mode, m in (("forward", f), ("forward+backward", fb)):
                r = _row("permutation", name, torch.float64, n, "-", mode, op.beta, m)
                r["note"] = f"err(beta={PERM_ERROR_BETA:g})={err:.3g}"
                rows.append(sink(r))
    return rows


def run_official(args, sink) -> list[dict]:
    """Our LapSum vs the official C++ extension: equality (float64) and time ratio at n = 1e3, 1e4, 1e5 (B = 1
    fwd+bwd, the two alternating: :func:`_alternating`)."""
    from diffrank.benchmark.lapsum_reference import official_topk
    from diffrank.operators import load

    f = official_topk() if args.device == "cpu" else None
    rows = []
    if f is None:
        print("[lapsum_figures] official LapSum extension not built: its rows skip (make lapsum-reference)")
        return rows
    ns = QUICK_NS if args.quick else [1000, 10000, 100000]
    for beta in (1.0, 2.0):  # α = -1/β exact in float32 (the extension takes a C++ float)
        op = load(LAPSUM, beta=beta)
        for n in ns:
            for k in _ks(n):
                x = torch.randn(4, n, generator=torch.Generator().manual_seed(n + k), dtype=torch.float64)
                xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
                a = op.topk_membership(xa, [k])[:, 0]
                b = f(xb, k, beta)
                g = torch.randn(a.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
                (a * g).sum().backward()
                (b * g).sum().backward()
                dv, dg = float((a - b).detach().abs().max()), float((xa.grad - xb.grad).abs().max())
                x1 = x[:1]
                ours, theirs = _alternating([fwd_bwd(lambda s, op=op, k=k: op.topk_membership(s, [k])[:, 0], x1),
                                             fwd_bwd(lambda s, k=k, beta=beta: f(s, k, beta), x1)],
                                            rounds=7 if n <= 10000 else 5, calls=5 if n <= 10000 else 3)
                rows.append(sink({"n": n, "k": k, "beta": beta, "max_abs_value_diff": dv, "max_abs_grad_diff": dg,
                                  "ours_fwd_bwd_s": ours, "official_fwd_bwd_s": theirs,
                                  "official_over_ours": theirs / ours}))
    return rows


def _alternating(fns: list, rounds: int, calls: int) -> list[float]:
    """Median seconds per call of each closure, timed in ``rounds`` rounds of ``calls`` calls each (after one
    untimed call), the closures taking turns within a round and the one that goes first rotating: on a shared
    machine whose load drifts within a minute, each sees the same load (docs/lapsum_figures.md)."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for i in [(r + j) % len(fns) for j in range(len(fns))]:
            fns[i]()
            for _ in range(calls):
                t0 = time.perf_counter()
                fns[i]()
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


# -- figures ---------------------------------------------------------------------------------------------
_COLORS: dict = {}


def _style(label: str) -> dict:
    """LapSum thick blue (as the paper draws it), the official extension dotted black, every other method its
    own colour of tab20 (dashed for the peer libraries)."""
    if label == LAPSUM:
        return {"color": "tab:blue", "lw": 2.8, "ls": "-", "zorder": 5}
    if label == OFFICIAL:
        return {"color": "black", "lw": 1.5, "ls": ":", "zorder": 4}
    import matplotlib.pyplot as plt

    color = _COLORS.setdefault(label, plt.get_cmap("tab20")(2 + len(_COLORS) % 18))
    return {"color": color, "lw": 1.2, "ls": "--" if "(peer)" in label else "-"}


def plot_lines(rows: list[dict], key: str, path: Path, ylabel: str) -> None:
    """Figs. 10 / 11 layout: rows k ∈ {1, 10, n/10}, columns forward / forward+backward; log-log vs n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks, modes = ["1", "10", "n/10"], ["forward", "forward+backward"]
    fig, axes = plt.subplots(len(ks), len(modes), figsize=(12, 11), sharex=True)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for i, k in enumerate(ks):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for m in methods:
                pts = [(r["n"], r[key]) for r in rows if r["method"] == m and r["k"] == k and r["mode"] == mode
                       and r[key] == r[key] and r[key] > 0]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=m, **_style(m))
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"k = {k}, {mode}")
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel(ylabel)
            if i == len(ks) - 1:
                ax.set_xlabel("n")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cd_ranks(rows: list[dict], key: str, mode: str):
    """``(average ranks, Nemenyi p-values, blocks)`` over the (n, k) blocks of ``mode`` (lower = better); a method
    without a value in a block (stopped, failed, not built) ranks last there, tied with the others without one."""
    import pandas as pd
    import scikit_posthocs as sp

    sel = [r for r in rows if r["mode"] == mode and r["table"] == "topk"]
    methods = sorted({r["method"] for r in sel if r[key] == r[key]})
    blocks = sorted({(r["n"], r["k"]) for r in sel})
    data = pd.DataFrame(index=[f"n={n},k={k}" for n, k in blocks], columns=methods, dtype=float)
    for r in sel:
        if r["method"] in methods:
            data.loc[f"n={r['n']},k={r['k']}", r["method"]] = r[key] if r[key] == r[key] else math.inf
    data = data.fillna(math.inf)
    data = data[(data != math.inf).sum(axis=1) >= 2]  # a block needs two measured methods to rank anything
    ranks = data.rank(axis=1, method="average")
    avg = ranks.mean(axis=0).sort_values()
    pvals = sp.posthoc_nemenyi_friedman(ranks.to_numpy())
    pvals.index = pvals.columns = list(ranks.columns)
    return avg, pvals, len(data)


def plot_cd(rows: list[dict], key: str, path: Path, what: str) -> dict:
    """Critical-difference diagrams (forward, forward+backward) with scikit-posthocs; returns the average ranks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import scikit_posthocs as sp

    out = {}
    fig, axes = plt.subplots(2, 1, figsize=(12, 8))
    for ax, mode in zip(axes, ("forward", "forward+backward")):
        avg, pvals, nblocks = cd_ranks(rows, key, mode)
        sp.critical_difference_diagram(avg, pvals, ax=ax, label_fmt_left="{label} ({rank:.2f})",
                                       label_fmt_right="({rank:.2f}) {label}", text_h_margin=0.3)
        ax.set_title(f"{what}, {mode}: average rank over {nblocks} (n, k) blocks (1 = best; Friedman + Nemenyi)")
        out[mode] = avg
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return out


def plot_error(rows: list[dict], path: Path) -> None:
    """Fig. 7: error against the hard mask vs n, one panel per β (k = 10 where n allows, else 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ERROR_BETAS), figsize=(15, 5), sharey=True)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for ax, beta in zip(axes, ERROR_BETAS):
        for m in methods:
            pts = [(r["n"], r["error"]) for r in rows if r["method"] == m and r["beta"] == beta
                   and int(r["k"]) == min(10, int(r["n"])) and r["error"] == r["error"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=m, **_style(m))
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.set_title(f"β = {beta:g}, k = 10")
        ax.set_xlabel("n")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("Σ|soft − hard| / (2k)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.18, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_permutation(rows: list[dict], path: Path) -> None:
    """Fig. 14: full P time and memory vs n, forward and forward+backward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9), sharex=True)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for i, (key, ylabel) in enumerate((("seconds", "time [s]"), ("peak_bytes", "peak extra memory [B]"))):
        for j, mode in enumerate(("forward", "forward+backward")):
            ax = axes[i][j]
            for m in methods:
                pts = [(r["n"], r[key]) for r in rows if r["method"] == m and r["mode"] == mode
                       and r[key] == r[key] and r[key] > 0]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=m, **_style(m))
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"soft permutation, {mode}")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_figures(out: Path, timing: list[dict], error: list[dict], perm: list[dict]) -> tuple[dict, dict]:
    """Every PNG of the suite from its rows; returns the CD average ranks (time, memory) per mode."""
    import logging

    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # the CD diagram's font fallbacks
    plot_lines(timing, "seconds", out / "lapsum_time.png", "time [s]")
    plot_lines(timing, "peak_bytes", out / "lapsum_memory.png", "peak extra memory [B]")
    ranks_t = plot_cd(timing, "seconds", out / "lapsum_cd_time.png", "time")
    ranks_m = plot_cd(timing, "peak_bytes", out / "lapsum_cd_memory.png", "peak memory")
    plot_error(error, out / "lapsum_error.png")
    plot_permutation(perm, out / "lapsum_permutation.png")
    return ranks_t, ranks_m


def load_rows(path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """``(timing, error, permutation)`` rows of a written ``lapsum_figures.csv``, numbers parsed."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["n"] = int(r["n"])
        for key in ("seconds", "peak_bytes"):
            r[key] = float(r[key]) if r[key] else math.nan
        if r["mode"] == "error":
            r["error"] = float(r["error"]) if r["error"] else math.nan
            r["beta"] = float(r["beta"])
    timing = [r for r in rows if r["table"] == "topk" and r["mode"] != "error"]
    return timing, [r for r in rows if r["mode"] == "error"], [r for r in rows if r["table"] == "permutation"]


def main(argv: list[str] | None = None) -> None:
    """``--replot DIR``: redraw the figures of DIR/lapsum_figures.csv (no measurement).

    Raises:
        SystemExit: status 2 when DIR holds no ``lapsum_figures.csv``; 1 (``error: …``) for a malformed one or a
            figure that cannot be written.
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m diffrank.benchmark.lapsum_figures")
    p.add_argument("--replot", required=True, help="folder with lapsum_figures.csv; the PNGs are written there")
    out = Path(p.parse_args(argv).replot)
    if not (out / "lapsum_figures.csv").is_file():
        p.error(f"--replot {out}: no lapsum_figures.csv there (write it with python -m diffrank.benchmark --suite "
                "lapsum_figures)")
    try:
        write_figures(out, *load_rows(out / "lapsum_figures.csv"))
    except (KeyError, ValueError) as e:  # a column missing or a cell that is not a number
        raise SystemExit(f"error: {out / 'lapsum_figures.csv'} is not a lapsum_figures table: {e!r}") from None
    except OSError as e:
        raise SystemExit(f"error: cannot write the figures into {out}: {e}") from None


# -- the suite -------------------------------------------------------------------------------------------
class _Sink:
    def __init__(self, path: Path, fields: list[str]) -> None:
        self.path, self.fields = path, fields
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writeheader()

    def __call__(self, row: dict) -> dict:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow({k: row.get(k, "") for k in self.fields})
        if "method" in row:
            val = row["error"] if row["mode"] == "error" else row["seconds"]
            shown = f"{val:.3g}" if row["mode"] == "error" and val == val else fmt_time(val)
            print(f"  {row['table']} {row['method']} n={row['n']} k={row['k']} {row['mode']}: {shown} "
                  f"{fmt_bytes(row['peak_bytes']) if row['mode'] != 'error' else ''} {row['note'] or row['error']}"
                  [:160], flush=True)
        return row


def run(args) -> list[tuple[str, list[dict]]]:
    """Run the four parts, write the CSVs and figures, return the headline tables."""
    out = Path(getattr(args, "figures_dir", None) or "docs/figures")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sink = _Sink(out / "lapsum_figures.csv", CSV_FIELDS)
    timing = run_timing(args, sink)
    official = run_official(args, _Sink(out / "lapsum_official.csv", ["n", "k", "beta", "max_abs_value_diff",
                                                                       "max_abs_grad_diff", "ours_fwd_bwd_s",
                                                                       "official_fwd_bwd_s", "official_over_ours"]))
    error = run_error(args, sink)
    perm = run_permutation(args, sink)
    ranks_t, ranks_m = write_figures(out, timing, error, perm)
    wall = time.perf_counter() - t0
    ns = sorted({r["n"] for r in timing})
    head_n = 100000 if 100000 in ns else ns[-1]
    headline = []
    for label in dict.fromkeys(r["method"] for r in timing):
        cells = {(r["k"], r["mode"]): r for r in timing if r["method"] == label and r["n"] == head_n}
        row = {"operator": label}
        for k in ("1", "10", "n/10"):
            r = cells.get((k, "forward+backward"))
            row[f"k={k} time"] = fmt_time(r["seconds"]) if r and r["seconds"] == r["seconds"] else (
                "-" if not r else r["error"][:40])
            row[f"k={k} peak"] = fmt_bytes(r["peak_bytes"]) if r else "-"
        row["CD rank time (f+b)"] = f"{ranks_t['forward+backward'].get(label, float('nan')):.2f}"
        row["CD rank memory (f+b)"] = f"{ranks_m['forward+backward'].get(label, float('nan')):.2f}"
        headline.append(row)
    title = f"soft top-k at n = {head_n}, forward+backward, B = 1 (suite wall {wall / 60:.1f} min; figures in {out})"
    tables = [(title, headline)]
    if official:
        tables.append(("our LapSum vs the official C++ extension (float64, B = 4 equality; B = 1 fwd+bwd time)",
                       [{"n": r["n"], "k": r["k"], "beta": r["beta"], "max |Δ value|": f"{r['max_abs_value_diff']:.1e}",
                         "max |Δ grad|": f"{r['max_abs_grad_diff']:.1e}", "ours": fmt_time(r["ours_fwd_bwd_s"]),
                         "official": fmt_time(r["official_fwd_bwd_s"]),
                         "official / ours": f"{r['official_over_ours']:.2f}"} for r in official]))
    return tables


if __name__ == "__main__":
    main()
