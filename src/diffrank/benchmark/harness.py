"""Timing and peak-memory measurement shared by the benchmark suites.

Time: on the CPU the median wall time of ``repeats`` calls after ``warmup`` calls; on CUDA the median of at
least ``CUDA_MIN_REPEATS`` calls timed with CUDA events (one pair per call, read after one final
synchronisation), after at least ``CUDA_MIN_WARMUP`` untimed calls.
Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above the memory held before the call;
on the CPU the process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``)
above the resident set before the call — it counts every allocation the call makes, ours and
the peers' alike, so ratios are fair. :func:`diffrank.benchmark.main` sets ``MALLOC_MMAP_THRESHOLD_`` so
that freed blocks go back to the system and an earlier cell's free memory cannot hide a later peak.
"""

from __future__ import annotations

import gc
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

CUDA_MIN_REPEATS = 20
CUDA_MIN_WARMUP = 3


@dataclass
class Measurement:
    """One benchmark cell: median seconds and peak extra bytes of one call (``nan`` if it failed)."""

    seconds: float
    peak_bytes: float
    error: str | None = None
    extra: dict = field(default_factory=dict)


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(fn: Callable[[], object], device: str = "cpu", repeats: int = 3, warmup: int = 1,
            max_seconds: float = 60.0) -> Measurement:
    """Time ``fn()`` and record its peak extra memory.

    Args:
        fn: a closure that does the whole measured work (e.g. forward + backward).
        device: ``"cpu"`` or ``"cuda"``.
        repeats: timed calls (at least ``CUDA_MIN_REPEATS`` on CUDA; a single one when the first call
            already exceeds ``max_seconds / (repeats + warmup)``).
        warmup: untimed calls first (at least ``CUDA_MIN_WARMUP`` on CUDA; skipped when a call is slow).
        max_seconds: time budget of the cell.

    Returns:
        :class:`Measurement` (``extra["repeats"]``: the calls the median is over); on an exception (e.g. out of
        memory) ``seconds = nan`` and ``error`` set.
    """
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            ok = _reset_peak_rss()
            base = _status_kib("VmRSS") * 1024
        t0 = time.perf_counter()
        fn()
        sync()
        first = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() - base) if cuda else (
            _status_kib("VmHWM") * 1024 - base if ok else float("nan"))
        times = [first]
        if cuda:
            repeats, warmup = max(repeats, CUDA_MIN_REPEATS), max(warmup, CUDA_MIN_WARMUP)
        if first * (repeats + warmup) < max_seconds:
            for _ in range(warmup):
                fn()
            sync()
            times = _event_times(fn, repeats) if cuda else []
            for _ in range(0 if cuda else repeats):
                t0 = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - t0)
        return Measurement(statistics.median(times), float(max(peak, 0)), extra={"repeats": len(times)})
    except Exception as e:  # noqa: BLE001 - a failing peer (OOM, dtype) is a table cell, not a crash
        return Measurement(float("nan"), float("nan"), error=f"{type(e).__name__}: {e}"[:80])


def _event_times(fn: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` by CUDA events on the current stream (no host sync between)."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in pairs]


def fwd_bwd(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    """A closure running ``op(x)`` forward and backward through ``sum(out * g)`` with a fixed random g."""
    g_cache: dict = {}

    def run() -> None:
        """One timed forward + backward of the operator on a fresh leaf copy of the scores."""
        xx = x.detach().requires_grad_(True)
        out = op(xx)
        if "g" not in g_cache:
            g_cache["g"] = torch.randn_like(out)
        (out * g_cache["g"]).sum().backward()

    return run


def fmt_time(s: float) -> str:
    """Seconds as a short string (ns / µs / ms / s)."""
    if s != s:
        return "fail"
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_bytes(b: float) -> str:
    """Bytes as a short string (KB / MB / GB)."""
    if b != b:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def print_table(title: str, rows: list[dict]) -> None:
    """Print rows (dicts with the same keys) as a rich table; values are printed as given."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    if not rows:
        Console().print(table)
        return
    for key in rows[0]:
        table.add_column(str(key), justify="right" if key not in ("operator", "reference", "note") else "left")
    for r in rows:
        table.add_row(*[str(v) for v in r.values()])
    Console(width=200).print(table)


def compare_row(label: str, params: dict, ours: Measurement, ref: Measurement | None, ref_name: str) -> dict:
    """One table row: ours vs a reference, with time and memory ratios (reference / ours)."""
    row = {"operator": label, **params, "ours time": fmt_time(ours.seconds), "ours peak": fmt_bytes(ours.peak_bytes)}
    if ref is not None:
        row.update({
            "reference": ref_name,
            "ref time": fmt_time(ref.seconds) if not ref.error else (
                ref.error if ref.error.startswith("skip") else f"fail ({ref.error[:30]})"),
            "ref peak": fmt_bytes(ref.peak_bytes),
            "speed-up": f"{ref.seconds / ours.seconds:.1f}x" if ref.seconds == ref.seconds else "-",
            "mem ratio": (f"{ref.peak_bytes / ours.peak_bytes:.1f}x"
                          if ref.peak_bytes == ref.peak_bytes and ours.peak_bytes > 0 else "-"),
        })
    return row
