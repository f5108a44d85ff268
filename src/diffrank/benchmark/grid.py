"""Every operator x backend (and its peer library) over a grid of n, k, B, with a roofline column and Table 3.9.

Operators are built from ``configs/operator/*.yaml`` (``diffrank.operators.available``), so a new operator is
picked up without editing this file. An operator whose yaml (or constructor) has a ``backend`` argument runs
once per backend in ``--backends`` (``torch``, ``triton``; Triton needs CUDA, or ``TRITON_INTERPRET=1``); one
whose constructor does not take it yet runs once, as ``default``.

Objective per operator (what a loss needs, the same for the peer):
- ``permutation``: the top-k rows of P, ``op(x, k=k)`` -> ``(B, k, n)``;
- else ``topk_membership``: ``op.topk_membership(x, [k])`` -> ``(B, 1, n)``;
- else ``soft_rank``: ``op.soft_rank(x)`` -> ``(B, n)`` (k does not apply: one row per n, B).
Peers (skipped when not installed, or past the sizes they can build): difftopk ``NeuralSort`` / ``SoftSort`` /
``DiffTopkNet``, diffsort ``DiffSortNet`` (full P, sliced to the top k rows), torchsort ``soft_rank``, and the
official LapSum extension (:mod:`diffrank.benchmark.lapsum_reference`, CPU or CUDA, when built).

Columns: forward time, forward+backward time (``harness.measure``: CUDA events, >= 3 warm-up calls, median
of >= 20 on CUDA; the wall-clock timer on the CPU), peak extra memory of forward+backward, and the roofline:
``bytes`` is a stated *lower bound* on the memory traffic of forward+backward (read scores 4·B·n, write the
output 4·B·out, read its gradient 4·B·out, write the scores' gradient 4·B·n; float32), ``GB/s`` = bytes /
time and ``% peak`` against the device's bandwidth (:func:`peak_bandwidth`). A value near 100 % means the
operator cannot get faster without moving less data; the dense O(B·n²) operators sit far below it.

Table 3.9 (``--table39``): full P forward+backward of the operators the thesis timed (odd-even and bitonic
networks, NeuralSort, fast soft rank, Sinkhorn) at its n ∈ {4, 16, 32, 128, 1024}, the time per set (time / B)
beside the thesis' native-CUDA GTX 1070 and PyTorch CPU figures (``src/diffrank/reference/
sorting_thesis_table3_9_runtime.csv``; the thesis does not state its batch size).
"""

from __future__ import annotations

import csv
import importlib.util
import inspect
import math
from pathlib import Path

import torch

from diffrank.benchmark.harness import Measurement, fmt_bytes, fmt_time, fwd_bwd, measure

# The grid: overridable with --n / --ks / --batches; --quick takes QUICK (a CPU smoke run).
GRID = {"n": [16, 100, 1000, 10000, 100000], "k": [1, 5], "B": [128, 1024]}
QUICK = {"n": [16, 100], "k": [1, 5], "B": [8]}
TABLE39_N = [4, 16, 32, 128, 1024]
TABLE39_B = [1, 128]
TABLE39_OPS = {"diffsort_odd_even": ("dsn", "odd_even"), "diffsort_bitonic": ("dsn", "bitonic"),
               "neuralsort": ("neuralsort", ""), "fast_soft_sort": ("fastsort", ""), "sinkhorn": ("sinkhorn", "")}
# peak memory bandwidth (bytes/s) by device name; matched in order, first hit wins (vendor data sheets)
PEAK_BANDWIDTH = [("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
                  ("A100-SXM4-80GB", 2.039e12), ("A100", 1.555e12), ("GTX 1070", 2.56e11)]
# a cell is skipped when the time of the same row at the previous n, scaled by (n / n_prev)^2, exceeds this
# many seconds per call (quadratic: the worst the dense operators do per layer)
PREDICT_EXPONENT = 2.0
CSV_FIELDS = ["table", "operator", "impl", "device", "n", "k", "B", "fwd_s", "fwd_bwd_s", "peak_bytes",
              "bytes_lower_bound", "achieved_Bps", "peak_Bps", "peak_source", "roofline_frac", "per_sample_s",
              "thesis_gpu_s", "thesis_cpu_s", "thesis_memory_bytes", "repeats", "note"]


# -- device bandwidth ------------------------------------------------------------------------------------
def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Measured bandwidth (bytes/s) of ``dst.copy_(src)`` on ``device``: 2·nbytes moved per copy.

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        nbytes: size of each buffer (1 GiB on CUDA; pass less on the CPU).

    Returns:
        The median over the timed copies (``harness.measure``), in bytes/s; ``nan`` if the buffers do not fit.
    """
    try:
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
        dst = torch.empty_like(src)
    except (RuntimeError, torch.OutOfMemoryError):
        return float("nan")
    m = measure(lambda: dst.copy_(src), device, repeats=5, warmup=1)
    return 2 * nbytes / m.seconds if m.seconds == m.seconds else float("nan")


def peak_bandwidth(device: str, measure_copy: bool = True) -> tuple[float, str]:
    """The device's peak memory bandwidth (bytes/s) and where it comes from.

    On CUDA the data-sheet value of :data:`PEAK_BANDWIDTH` when the device name matches (H100 SXM 3.35 TB/s,
    H100 PCIe 2.0 TB/s, H200 4.8 TB/s), else the measured ``copy_`` bandwidth; on the CPU always measured.

    Returns:
        ``(bytes_per_second, source)`` with source ``"table: <name>"`` or ``"measured copy_"``.
    """
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        for key, bw in PEAK_BANDWIDTH:
            if key in name:
                return bw, f"table: {name}"
    if not measure_copy:
        return float("nan"), "unknown"
    return copy_bandwidth(device, (1 << 30) if device.startswith("cuda") else (64 << 20)), "measured copy_"


# -- operators, backends, peers -------------------------------------------------------------------------
def _has_backend(name: str) -> bool:
    """Whether the operator's yaml or constructor has a ``backend`` argument."""
    from diffrank.registry import load_yaml, locate

    cfg = load_yaml("operator", name)
    if "backend" in cfg:
        return True
    try:
        return "backend" in inspect.signature(locate(cfg["_target_"])).parameters
    except (ImportError, TypeError, ValueError):  # an odd target: the yaml alone decides
        return False


def build_impls(name: str, backends: list[str], device: str) -> list[tuple[str, object, str]]:
    """``(impl, operator or None, note)`` per backend of one operator; None with the reason when unavailable.

    ``triton`` needs the triton package and CUDA (or ``TRITON_INTERPRET=1``); an operator without a backend
    argument yields one ``default`` row.
    """
    from diffrank.operators import load

    if not _has_backend(name):
        return [("default", load(name).to(device), "")]
    out = []
    for b in backends:
        if b == "triton" and importlib.util.find_spec("triton") is None:
            out.append((b, None, "skip: triton not installed"))
            continue
        if b == "triton" and not device.startswith("cuda"):
            import os

            if os.environ.get("TRITON_INTERPRET") != "1":
                out.append((b, None, "skip: triton needs CUDA (or TRITON_INTERPRET=1)"))
                continue
        try:
            out.append((b, load(name, backend=b).to(device), ""))
        except (TypeError, ValueError) as e:  # the backend argument does not exist (yet) for this operator
            out.append((b, None, f"skip: {type(e).__name__}: {e}"[:90]))
    return out


def objective(op, k: int | None):
    """``(fn(x) -> output, out_per_set)``: what the grid times for this operator (module docstring)."""
    caps = getattr(op, "capabilities", frozenset())
    if "permutation" in caps:
        return (lambda s: op(s, k=k)), k
    if "topk_membership" in caps:
        return (lambda s: op.topk_membership(s, [k])), 1
    return op.soft_rank, None


def _difftopk_sort_peer(name: str, n: int, k: int | None, B: int, mem_limit: float):
    """``(label, fn or None, note)`` of difftopk's dense NeuralSort / SoftSort (B, n, n) for ``name``."""
    from diffrank.operators import load

    if importlib.util.find_spec("difftopk") is None:
        return "difftopk", None, "skip: difftopk not installed"
    if 4 * B * n * n * 4 > mem_limit:
        return "difftopk", None, f"skip: dense (B, n, n) ~{4 * B * n * n * 4 / 1e9:.0f} GB"
    import difftopk

    tau = 1.0 / load(name).beta
    if name == "neuralsort":
        mod = difftopk.NeuralSort(tau=tau)
        return "difftopk", (lambda s: mod(s)[:, :, -k:]), ""
    mod = difftopk.SoftSort(tau=tau)
    return "difftopk", (lambda s: mod(s)[:, :k]), ""


def _difftopk_network_peer(name: str, n: int, k: int | None, B: int, device: str, mem_limit: float):
    """``(label, fn or None, note)`` of difftopk's bitonic / splitter-selection network for ``name``."""
    from diffrank.operators import load

    if importlib.util.find_spec("difftopk") is None:
        return "difftopk", None, "skip: difftopk not installed"
    kind = "bitonic" if name == "difftopk_bitonic" else "splitter_selection"
    sparse = importlib.util.find_spec("torch_sparse") is not None
    if kind == "splitter_selection" and not sparse:
        return "difftopk", None, "skip: its splitter network needs torch-sparse"
    layers = math.ceil(math.log2(max(n, 2))) * (math.ceil(math.log2(max(n, 2))) + 1) // 2
    c = n // 2 + 1
    need = layers * (B * n * c * 16 + 4 * c * n * 8)
    if not sparse and (need > mem_limit or n > 1024):
        return "difftopk", None, f"skip: dense network ~{need / 1e9:.0f} GB"
    import contextlib
    import io

    import difftopk

    op = load(name)
    with contextlib.redirect_stdout(io.StringIO()):
        net = difftopk.DiffTopkNet(kind, n, k, sparse=sparse, device=device, steepness=op.beta,
                                   art_lambda=getattr(op, "art_lambda", 0.5),
                                   distribution=getattr(op, "sigmoid", "logistic_phi"))
    return "difftopk", (lambda s: net(s)[1]), ""


def peer(name: str, n: int, k: int | None, B: int, device: str, mem_limit: float):
    """``(label, fn or None, note)``: the peer library's implementation of the same objective, if any."""
    from diffrank.operators import load

    if name in ("neuralsort", "softsort"):
        return _difftopk_sort_peer(name, n, k, B, mem_limit)
    if name in ("difftopk_bitonic", "difftopk_splitter"):
        return _difftopk_network_peer(name, n, k, B, device, mem_limit)
    if name in ("diffsort_odd_even", "diffsort_bitonic"):
        if importlib.util.find_spec("diffsort") is None:
            return "diffsort", None, "skip: diffsort not installed"
        if n > 128:
            return "diffsort", None, "skip: O(L·B·n³) dense layers beyond n = 128"
        import diffsort

        op = load(name)
        net = diffsort.DiffSortNet(name.split("_", 1)[1], n, device=device, steepness=op.beta,
                                   distribution=getattr(op, "sigmoid", "cauchy"))
        # (B, item, ascending position) -> ours: rows = descending ranks (docs/conventions.md)
        return "diffsort", (lambda s: net(s)[1].flip(2).transpose(1, 2)[:, :k]), ""
    if name == "lapsum":
        from diffrank.benchmark.lapsum_reference import official_topk

        f = official_topk(device=device)
        if f is None:
            return "lapsum-official", None, ("skip: the official extension is not built (python -m "
                                             "diffrank.benchmark.lapsum_reference --build [--cuda])")
        beta = load(name).beta
        return "lapsum-official", (lambda s: f(s, k, beta).unsqueeze(1)), ""
    if name == "fast_soft_sort":
        if importlib.util.find_spec("torchsort") is None:
            return "torchsort", None, "skip: torchsort not installed"
        import torchsort

        return "torchsort", (lambda s: torchsort.soft_rank(-s, regularization="l2", regularization_strength=1.0)), ""
    return "", None, ""


# -- one cell ---------------------------------------------------------------------------------------------
def _mem_limit(device: str) -> float:
    if device.startswith("cuda"):
        return 0.8 * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return 8e9


def bytes_lower_bound(B: int, n: int, out_per_set: int | None) -> int:
    """Lower bound on forward+backward memory traffic (float32): read s, write out, read dL/dout, write dL/ds."""
    out = n * (out_per_set or 1)
    return 4 * B * (2 * n + 2 * out)


def cell(fn, x: torch.Tensor, device: str, max_seconds: float) -> tuple[Measurement, Measurement]:
    """Forward (no grad) and forward+backward measurements of ``fn`` on ``x``.

    On CUDA one untimed forward+backward comes first: it compiles the Triton kernels of the configuration (and
    runs ``backend="auto"``'s probe), which would otherwise be the first timed call, and ``measure`` times a
    call that alone exceeds its share of ``max_seconds`` only once."""
    if device.startswith("cuda"):
        try:
            fwd_bwd(fn, x)()
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001, S110 - the timed calls below record the error in the cell
            pass
    with torch.no_grad():
        f = measure(lambda: fn(x), device, max_seconds=max_seconds)
    if f.error:
        return f, Measurement(float("nan"), float("nan"), error=f.error)
    return f, measure(fwd_bwd(fn, x), device, max_seconds=max_seconds)


def record(table: str, name: str, impl: str, device: str, n: int, k, B: int, f: Measurement, fb: Measurement,
           out_per_set, bw: tuple[float, str], note: str = "", thesis: dict | None = None) -> dict:
    """One CSV row (raw numbers; ``nan`` where not measured)."""
    lb = bytes_lower_bound(B, n, out_per_set)
    achieved = lb / fb.seconds if fb.seconds == fb.seconds and fb.seconds > 0 else float("nan")
    err = fb.error or f.error
    thesis = thesis or {}
    return {"table": table, "operator": name, "impl": impl, "device": device, "n": n, "k": k if k else "-", "B": B,
            "fwd_s": f.seconds, "fwd_bwd_s": fb.seconds, "peak_bytes": fb.peak_bytes, "bytes_lower_bound": lb,
            "achieved_Bps": achieved, "peak_Bps": bw[0], "peak_source": bw[1],
            "roofline_frac": achieved / bw[0] if bw[0] == bw[0] else float("nan"),
            "per_sample_s": fb.seconds / B, "thesis_gpu_s": thesis.get("gpu_time_s", float("nan")),
            "thesis_cpu_s": thesis.get("cpu_time_s", float("nan")),
            "thesis_memory_bytes": thesis.get("memory_bytes", float("nan")),
            "repeats": fb.extra.get("repeats", 0), "note": (note or (err or ""))[:90]}


class CsvSink:
    """Appends each record to ``path`` as soon as it is measured (a killed run keeps its finished rows) and
    prints a one-line progress note; ``path=None`` only prints."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "w", newline="") as f:
                csv.DictWriter(f, fieldnames=CSV_FIELDS).writeheader()

    def __call__(self, rec: dict) -> dict:
        if self.path:
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=CSV_FIELDS).writerow({key: rec.get(key, "") for key in CSV_FIELDS})
        print(f"  {rec['table']} {rec['operator']} [{rec['impl']}] n={rec['n']} k={rec['k']} B={rec['B']}: "
              f"{fmt_time(rec['fwd_bwd_s'])} {rec['note']}", flush=True)
        return rec


def _skip(why: str) -> Measurement:
    return Measurement(float("nan"), float("nan"), error=f"skip: {why}")


def _predicted_too_slow(last: dict, key, n: int, budget: float) -> str | None:
    prev = last.get(key)
    if prev is None:
        return None
    n0, t0 = prev
    if t0 != t0:  # failed (e.g. out of memory) at a smaller n: larger n fails too
        return f"failed at n = {n0}"
    t = t0 * (n / n0) ** PREDICT_EXPONENT
    return f"~{fmt_time(t)} predicted (> {budget:.0f} s)" if t > budget else None


def run_grid(args, bw: tuple[float, str], sink=lambda rec: rec) -> list[dict]:
    """The operator x impl x (n, k, B) grid (module docstring); returns CSV records, each passed to ``sink``."""
    from diffrank.operators import available

    grid = QUICK if args.quick else GRID
    ns, ks, bs = args.n or grid["n"], args.ks or grid["k"], args.batches or grid["B"]
    names = args.operators or available()
    dev, budget, mem_limit = args.device, args.max_seconds, _mem_limit(args.device)
    recs: list[dict] = []
    for name in names:
        impls = build_impls(name, args.backends, dev)
        ranks_only = all(objective(op, 1)[1] is None for _, op, _ in impls if op is not None)
        for B in bs:
            for k in ks[:1] if ranks_only else ks:  # soft rank has no k: one row per (n, B)
                last: dict = {}
                for n in ns:
                    gen = torch.Generator(device="cpu").manual_seed(n)
                    x = torch.randn(B, n, generator=gen).to(dev)
                    kk = min(k, n)
                    for impl, op, why in impls:
                        if op is None:
                            recs.append(sink(record("grid", name, impl, dev, n, kk, B, _skip(why), _skip(why), 0,
                                                    bw, note=why)))
                            continue
                        fn, out = objective(op, kk)
                        kcol = kk if out is not None else None
                        slow = _predicted_too_slow(last, impl, n, budget)
                        if slow:
                            f = fb = _skip(slow)
                        else:
                            f, fb = cell(fn, x, dev, budget)
                            last[impl] = (n, fb.seconds)
                        recs.append(sink(record("grid", name, impl, dev, n, kcol, B, f, fb, out, bw)))
                    plabel, pfn, pwhy = peer(name, n, kk, B, dev, mem_limit) if not args.no_peers else ("", None, "")
                    if plabel:
                        slow = _predicted_too_slow(last, plabel, n, budget)
                        if pfn is None or slow:
                            m = _skip(slow or pwhy.removeprefix("skip: "))
                            recs.append(sink(record("grid", name, plabel, dev, n, kk, B, m, m, kk, bw,
                                                    note=m.error)))
                        else:
                            f, fb = cell(pfn, x, dev, budget)
                            last[plabel] = (n, fb.seconds)
                            recs.append(sink(record("grid", name, plabel, dev, n, kk, B, f, fb, kk, bw)))
                    del x
    return recs


def thesis_table39() -> dict[tuple[str, str, int], dict[str, float]]:
    """``{(operator, network, n): {metric: value}}`` from the thesis' Table 3.9 CSV (seconds, bytes)."""
    import diffrank

    path = Path(diffrank.__file__).parent / "reference" / "sorting_thesis_table3_9_runtime.csv"
    out: dict = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out.setdefault((row["operator"], row["network"], int(row["n"])), {})[row["metric"]] = float(row["value"])
    return out


def run_table39(args, bw: tuple[float, str], sink=lambda rec: rec, deadline: float | None = None,
                spent: str = "skip: budget spent", recs: list[dict] | None = None) -> list[dict]:
    """Full P (soft rank for fast_soft_sort) forward+backward at the thesis' sizes, per set beside the thesis.

    Args:
        args: the suite's options (``device``, ``quick``, ``max_seconds`` per cell, ``operators``,
            ``table39_batches``).
        bw: the device's peak bandwidth (:func:`peak_bandwidth`).
        sink: called with each record as it is measured.
        deadline: a ``time.monotonic()`` value; the cells after it are not measured, their note ``spent``.
        spent: the note of a cell skipped for the deadline.
        recs: the list the records are appended to (returned; a new one when None).
    """
    import time

    from diffrank.operators import load

    thesis = thesis_table39()
    ns = [n for n in TABLE39_N if n <= 32] if args.quick else TABLE39_N
    bs = [1, 4] if args.quick else (args.table39_batches or TABLE39_B)
    dev, budget = args.device, args.max_seconds
    recs = [] if recs is None else recs
    for name, (t_op, t_net) in TABLE39_OPS.items():
        if args.operators and name not in args.operators:
            continue
        op = load(name).to(dev)
        impl = "auto" if _has_backend(name) else "default"  # auto: Triton on CUDA where a kernel exists
        fn = op.soft_rank if name == "fast_soft_sort" else (lambda s, op=op: op(s))
        for B in bs:
            last: dict = {}
            for n in ns:
                x = torch.randn(B, n, generator=torch.Generator().manual_seed(n)).to(dev)
                slow = _predicted_too_slow(last, name, n, budget)
                if deadline is not None and time.monotonic() >= deadline:
                    f = fb = Measurement(float("nan"), float("nan"), error=spent)
                elif slow:
                    f = fb = _skip(slow)
                else:
                    f, fb = cell(fn, x, dev, budget)
                    last[name] = (n, fb.seconds)
                recs.append(sink(record("table3.9", name, impl, dev, n, None, B, f, fb,
                                        None if name == "fast_soft_sort" else n, bw,
                                        thesis=thesis.get((t_op, t_net, n)))))
    return recs


# -- output -----------------------------------------------------------------------------------------------
def _pct(v: float) -> str:
    return "-" if v != v else f"{100 * v:.1f} %"


def _gbps(v: float) -> str:
    return "-" if v != v else f"{v / 1e9:.1f}"


def table_rows(recs: list[dict]) -> list[dict]:
    """Rows for ``harness.print_table`` (formatted strings)."""
    rows = []
    for r in recs:
        if r["note"].startswith("skip"):
            row = {"operator": r["operator"], "impl": r["impl"], "n": r["n"], "k": r["k"], "B": r["B"],
                   "fwd": "-", "fwd+bwd": "-", "peak": "-", "per set": "-", "GB/s (≥)": "-", "% peak": "-"}
            if r["table"] == "table3.9":
                row.update({"thesis GPU": "-", "thesis CPU": "-", "thesis mem": "-"})
            row["note"] = r["note"]
            rows.append(row)
            continue
        row = {"operator": r["operator"], "impl": r["impl"], "n": r["n"], "k": r["k"], "B": r["B"],
               "fwd": fmt_time(r["fwd_s"]), "fwd+bwd": fmt_time(r["fwd_bwd_s"]), "peak": fmt_bytes(r["peak_bytes"]),
               "per set": fmt_time(r["per_sample_s"]), "GB/s (≥)": _gbps(r["achieved_Bps"]),
               "% peak": _pct(r["roofline_frac"])}
        if r["table"] == "table3.9":
            row.update({"thesis GPU": fmt_time(r["thesis_gpu_s"]) if r["thesis_gpu_s"] == r["thesis_gpu_s"] else "-",
                        "thesis CPU": fmt_time(r["thesis_cpu_s"]) if r["thesis_cpu_s"] == r["thesis_cpu_s"] else "-",
                        "thesis mem": fmt_bytes(r["thesis_memory_bytes"])})
        row["note"] = r["note"]
        rows.append(row)
    return rows


def plot_loglog(path: str | Path, recs: list[dict], title: str) -> None:
    """Log-log forward+backward time vs n, one line per operator/impl; one panel per (B, k) of the grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [r for r in recs if r["table"] == "grid" and r["fwd_bwd_s"] == r["fwd_bwd_s"]]
    panels = sorted({(r["B"], str(r["k"])) for r in grid if r["k"] != "-"}) or [(None, "-")]
    cols = len({p[1] for p in panels}) or 1
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.5 * rows), squeeze=False)
    operators = sorted({r["operator"] for r in grid})
    cmap = plt.get_cmap("tab20")
    color = {name: cmap(i % 20) for i, name in enumerate(operators)}
    # one colour per operator; the line style says whose implementation (ours solid / dash-dot, peer dashed)
    style = {"torch": ("-", "o"), "default": ("-", "o"), "auto": ("-", "o"), "triton": ("-.", "^")}
    for ax, (B, k) in zip(axes.flat, panels):
        lines: dict = {}
        for r in grid:
            if r["B"] == B and (str(r["k"]) == k or r["k"] == "-"):
                lines.setdefault((r["operator"], r["impl"]), []).append((r["n"], r["fwd_bwd_s"]))
        for (name, impl), pts in sorted(lines.items()):
            pts.sort()
            ls, marker = style.get(impl, ("--", "s"))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=ls, marker=marker, color=color[name],
                    label=f"{name} [{impl}]")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (items per set)")
        ax.set_ylabel("forward+backward time per call (s)")
        ax.set_title(f"B = {B}, k = {k}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> list[tuple[str, list[dict]]]:
    """The grid (and Table 3.9 with ``--table39``); writes ``--csv`` / ``--png`` when given."""
    bw = peak_bandwidth(args.device)
    setting = f"peak {bw[0] / 1e9:.0f} GB/s ({bw[1]})"
    sink = CsvSink(args.csv)
    recs = [] if args.table39_only else run_grid(args, bw, sink)
    if args.table39 or args.table39_only:
        recs += run_table39(args, bw, sink)
    args.records = getattr(args, "records", []) + recs
    if args.png and any(r["table"] == "grid" for r in recs):
        plot_loglog(args.png, recs, f"diffrank operators, {args.device}"
                    + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""))
    out = []
    grid = [r for r in recs if r["table"] == "grid"]
    if grid:
        out.append((f"operator grid, forward / forward+backward, bytes ≥ 4·B·(2n + 2·out); {setting}",
                    table_rows(grid)))
    t39 = [r for r in recs if r["table"] == "table3.9"]
    if t39:
        out.append(("thesis Table 3.9 sizes: full P forward+backward, time per set = time / B (thesis: GTX 1070 "
                    f"native CUDA; PyTorch CPU; batch size not stated); {setting}", table_rows(t39)))
    return out
