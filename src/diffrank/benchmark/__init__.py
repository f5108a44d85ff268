"""Benchmark every operator against its reference implementation; prints one table per suite.

    python -m diffrank.benchmark                  # every suite, default sizes (make bench)
    python -m diffrank.benchmark --suite basic --quick
    python -m diffrank.benchmark --device cuda    # on a GPU
    python -m diffrank.benchmark --suite grid --device cuda --table39 --csv out.csv --png out.png
    python -m diffrank.benchmark --suite grid --quick  # CPU smoke run of the grid

(also ``diffrank-bench`` with the same options.)

The ``grid`` suite (:mod:`diffrank.benchmark.grid`; docs/gpu.md) runs every operator of
``configs/operator/`` x backend against its peer library over n x k x B (``--n``, ``--ks``, ``--batches``; default
grid in ``grid.GRID``), with a roofline column and, with ``--table39``, the thesis' Table 3.9 sizes; it is run
only when asked for (``--suite grid``), the other suites are the default. So is ``lapsum_figures``
(:mod:`diffrank.benchmark.lapsum_figures`): the LapSum paper's runtime / memory / approximation
figures, CSVs and critical-difference diagrams into ``--figures-dir`` (docs/lapsum_figures.md).

Suites are the modules ``diffrank.benchmark.<suite>`` (one per family of operators; the shared
timing and memory measurement is :mod:`diffrank.benchmark.harness`) and expose
``run(args) -> list[tuple[title, rows]]``.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys

SUITES = ["basic", "networks", "others", "streaming", "torchsort_parity", "lapsum_parity", "grid", "lapsum_figures"]
DEFAULT_SUITES = ["basic", "networks", "others", "streaming", "torchsort_parity", "lapsum_parity"]


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (sizes, batches, k).

    Raises:
        argparse.ArgumentTypeError: anything else (argparse prints it with the flag and exits with status 2).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer >= 1, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, got {value}")
    return value


def _float(text: str, minimum: float, strict: bool) -> float:
    """``text`` as a finite float above ``minimum`` (``strict``) or at least it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, got '{text}'") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise argparse.ArgumentTypeError(f"a finite number {'>' if strict else '>='} {minimum:g}, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, GB).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    return _float(text, 0.0, strict=True)


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (a budget in seconds; 0: every step skipped).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    return _float(text, 0.0, strict=False)


def device_type(text: str) -> str:
    """An argparse type: ``cpu``, ``cuda`` or ``cuda:<index>`` (what the suites run on).

    Raises:
        argparse.ArgumentTypeError: any other device name (torch would only refuse it inside a suite).
    """
    if re.fullmatch(r"cpu|cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"cpu, cuda or cuda:<index>, got '{text}'")


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`: the common flags, the grid suite's and the lapsum_figures suite's."""
    p = argparse.ArgumentParser(prog="python -m diffrank.benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="append", choices=SUITES, help="suite(s) to run (default: all)")
    p.add_argument("--device", type=device_type, default="cpu", help="cpu, cuda or cuda:<index>")
    p.add_argument("--batch", type=positive_int, default=64, help="batch size B (default 64)")
    p.add_argument("--k", type=positive_int, default=5, help="top-k size (default 5)")
    p.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    p.add_argument("--max-seconds", type=positive_float, default=60.0, help="time budget per cell")
    g = p.add_argument_group("grid suite")
    g.add_argument("--n", type=positive_int, nargs="+", help="set sizes (default: grid.GRID['n'])")
    g.add_argument("--ks", type=positive_int, nargs="+", help="top-k sizes (default: grid.GRID['k'])")
    g.add_argument("--batches", type=positive_int, nargs="+", help="batch sizes B (default: grid.GRID['B'])")
    g.add_argument("--operators", nargs="+", help="operator configs (default: every configs/operator/*.yaml)")
    g.add_argument("--backends", nargs="+", default=["torch", "triton"], help="for operators with a backend")
    g.add_argument("--no-peers", action="store_true", help="skip difftopk / diffsort / torchsort")
    g.add_argument("--table39", action="store_true", help="also the thesis Table 3.9 sizes")
    g.add_argument("--table39-only", action="store_true", help="only the thesis Table 3.9 sizes")
    g.add_argument("--table39-batches", type=positive_int, nargs="+", help="B for --table39 (default 1 128)")
    g.add_argument("--csv", help="write the grid's raw records to this CSV")
    g.add_argument("--png", help="write a log-log plot of time vs n to this PNG")
    g = p.add_argument_group("lapsum_figures suite (the LapSum paper's Figs. 5, 7, 10, 11, 14; --n applies too)")
    g.add_argument("--figures-dir", default="docs/figures", help="where its CSVs and PNGs go")
    g.add_argument("--cap-seconds", type=positive_float, default=10.0,
                   help="a method stops above this predicted s/call")
    g.add_argument("--cap-gb", type=positive_float, default=3.0, help="a method stops above this predicted peak memory")
    return p


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and print the tables of the chosen suites.

    Raises:
        SystemExit: status 2 for a bad flag (a size, batch or k below 1, a time that is not a positive number, a
            device other than cpu / cuda); ``--device cuda`` without a visible CUDA device; ``error: …`` when a
            suite cannot write its ``--csv`` / ``--png`` / ``--figures-dir`` files.
    """
    args = _parser().parse_args(argv)
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and argv is None:
        # glibc then maps every block >= 64 KiB separately and unmaps it on free, so the resident set
        # follows live tensors and the CPU peak-memory column means something (see harness.py); the process
        # restarts with the command line it was given (python -m ..., a script, or the diffrank-bench entry point)
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    from diffrank.benchmark.harness import print_table

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    for suite in args.suite or DEFAULT_SUITES:
        try:
            mod = importlib.import_module(f"diffrank.benchmark.{suite}")
        except ModuleNotFoundError as e:
            print(f"[suite {suite} not available: {e}]")
            continue
        try:
            tables = mod.run(args)
        except OSError as e:  # --csv / --png / --figures-dir not writable, or a full disk
            raise SystemExit(f"error: suite {suite} cannot write its files: {e}") from None
        for title, rows in tables:
            setting = f"device={_device_name(args.device)}, threads={torch.get_num_threads()}"
            if suite not in ("grid", "lapsum_figures", "torchsort_parity", "lapsum_parity"):
                setting = f"B={args.batch}, k={args.k}, " + setting
            print_table(f"{title} ({setting})", rows)


def _device_name(device: str) -> str:
    import torch

    return f"{device} ({torch.cuda.get_device_name()})" if device.startswith("cuda") else device
