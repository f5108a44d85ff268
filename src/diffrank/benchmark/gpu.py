"""``make gpu-check``: the GPU figures of docs/gpu.md in one command, on any CUDA machine, in minutes.

    python -m diffrank.benchmark.gpu --out outputs/gpu_check            # make gpu-check
    python -m diffrank.benchmark.gpu --device cpu --quick --out DIR      # the dry run (in the default test suite)

It needs torch, Triton and this package (``pip install -e .``; the tests step and the training rate need the
``experiments`` and ``dev`` extras: hydra, lightning, pytest; the peers difftopk / diffsort are used when
installed) and nothing online. Each step gets its share of ``--budget`` seconds (default 420: at most about 7
minutes; docs/gpu.md has a measured run), writes into ``--out`` as it goes, and a step that fails, is skipped or
runs out of time says so in the tables while the next one runs:

1. environment: device, versions, ``nvcc``; ``environment.json``.
2. the peers' CUDA extensions, built in the background while step 3 runs, when ``nvcc`` is present and
   ``--peer-src`` (``DIFFRANK_PEER_SRC``) names a folder holding the checkouts ``torchsort/``
   (github.com/teddykoker/torchsort) and ``LapSum/`` (github.com/gmum/LapSum); ``peers_build.log``.
3. ``pytest -m "gpu or triton"`` (with pytest-xdist workers when installed); ``gpu_tests.log``, ``gpu_tests.xml``.
4. the headline cell, n = 1 000, k = 5, B = 1 024: every operator x backend, its peer library, and the floor a
   soft operator sits above, ``torch.sort`` / ``torch.topk`` of the same scores (forward and backward through the
   values); ``headline.csv``, ``headline.png``.
5. the thesis Table 3.9 sizes: full P forward+backward, time per set at B = 128; ``table39.csv``, ``table39.png``.
6. the sorting protocol's training rate: odd-even Cauchy n = 5 (thesis Table 3.7), batch 100, bf16-mixed, sets
   composed on the device (:mod:`diffrank.experiments.tools.throughput`, run as a subprocess: the benchmarks do
   not import the framework), and the hours that thesis Tables 3.3 / 3.7 take at that rate;
   ``sorting_rate.json``.
7. ``gpu_check.md``: the tables of docs/gpu.md's "Figures", filled in with the date, device and command, and
   printed. On a CPU (``--device cpu``) every GPU column reads "not measured".

Timings: :func:`diffrank.benchmark.harness.measure` (CUDA events, >= 3 warm-up calls, median of >= 20).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from diffrank.benchmark import device_type, grid, non_negative_float
from diffrank.benchmark.harness import fmt_bytes, fmt_time

NOT_MEASURED = "not measured"
# a cell (or step) not measured because its step's share of --budget was spent: said as such, on the CPU too
BUDGET_SPENT = "skipped: budget spent"
HEADLINE = {"n": 1000, "k": 5, "B": 1024}
HEADLINE_QUICK = {"n": 100, "k": 5, "B": 8}
TABLE39_B = 128
SORTING_ROW = "sorting/thesis_t3_7/odd_even_cauchy_n5"
TESTS_COMMAND = 'pytest -m "gpu or triton"'
# share of the budget per step (the rest is slack for start-up and the report)
SHARES = {"tests": 0.40, "headline": 0.20, "table39": 0.15, "sorting": 0.15}
# the one-sync tests whose verdict fills the training table (tests/experiments/run/test_gpu_step.py)
SYNC_TESTS = {"sorting": "test_gpu_sorting_step_synchronises_at_most_once[diffsort_odd_even]",
              "classifier": "test_gpu_classifier_step_synchronises_at_most_as_allowed"}


# -- 1. environment ---------------------------------------------------------------------------------------
def environment(device: str) -> dict:
    """Device name, versions, and whether ``nvcc`` is there (the peers' CUDA extensions need it)."""
    triton = importlib.util.find_spec("triton")
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "device": device, "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "triton": None, "nvcc": shutil.which("nvcc") or _cuda_home_nvcc(),
           "host": platform.node(), "cpu_threads": torch.get_num_threads()}
    if triton is not None:
        import triton as _triton

        env["triton"] = _triton.__version__
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env.update(device_name=torch.cuda.get_device_name(), sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), driver=_driver())
    else:
        env["device_name"] = f"CPU ({platform.processor() or platform.machine()})"
    return env


def _cuda_home_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    path = Path(home) / "bin" / "nvcc"
    return str(path) if path.exists() else None


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# -- 2. the peers' CUDA extensions ------------------------------------------------------------------------
def start_peer_builds(src: str | None, nvcc: str | None, out: Path) -> tuple[list, str]:
    """Start building torchsort (its ``isotonic_cuda``) and the official LapSum CUDA extension in the background.

    Returns:
        ``(processes, note)``: the running builds (``(name, Popen, site)``) and why none runs when empty.
    """
    if not nvcc:
        return [], "nvcc not found: the peers' CUDA extensions cannot be built here"
    root = Path(src) if src else None
    if root is None or not root.is_dir():
        return [], "no peer sources (--peer-src / DIFFRANK_PEER_SRC: checkouts torchsort/ and LapSum/)"
    log = open(out / "peers_build.log", "w")  # noqa: SIM115 - the build processes write it until they end
    procs = []
    arch = ".".join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else None
    env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 4), **({"TORCH_CUDA_ARCH_LIST": arch} if arch else {}))
    if (root / "torchsort" / "setup.py").exists():
        site = out / "peers" / "torchsort"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
               "--target", str(site), str(root / "torchsort")]
        procs.append(("torchsort", subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), site))
    if (root / "LapSum" / "lapsum").is_dir():
        env_l = dict(env, DIFFRANK_LAPSUM_OFFICIAL=str(root / "LapSum"),
                     DIFFRANK_LAPSUM_BUILD=str(out / "peers" / "lapsum_official"))
        cmd = [sys.executable, "-m", "diffrank.benchmark.lapsum_reference", "--build", "--cuda"]
        procs.append(("lapsum-official", subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env_l),
                      out / "peers" / "lapsum_official"))
    return procs, "" if procs else f"no torchsort/ or LapSum/ checkout in {root}"


def finish_peer_builds(procs: list, timeout: float) -> dict[str, str]:
    """Wait for the builds (at most ``timeout`` s in all) and make what was built importable; ``{peer: status}``."""
    status, end = {}, time.monotonic() + timeout
    for name, proc, site in procs:
        try:
            rc = proc.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            status[name] = "build timed out"
            continue
        if rc != 0:
            status[name] = f"build failed (rc {rc}, peers_build.log)"
        elif name == "torchsort":
            sys.path.insert(0, str(site))
            importlib.invalidate_caches()
            status[name] = "built"
        else:
            os.environ["DIFFRANK_LAPSUM_BUILD"] = str(site)
            status[name] = "built"
    return status


# -- 3. the GPU and Triton tests --------------------------------------------------------------------------
def run_tests(out: Path, timeout: float) -> dict:
    """``pytest -m "gpu or triton"`` in a subprocess, bounded by ``timeout`` s; the summary line and per-test
    outcomes of the sync tests."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu or triton", "-q", "-p", "no:cacheprovider", "-rfE",
           f"--junitxml={out / 'gpu_tests.xml'}"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(min(8, os.cpu_count() or 1))]  # Triton compiles on the host: workers overlap the compiles
    t0 = time.monotonic()
    with open(out / "gpu_tests.log", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    text = (out / "gpu_tests.log").read_text(errors="replace")
    # pytest's last line: "9 failed, 88 passed, 259 skipped, 10 warnings in 67.32s (0:01:07)" (framed by = without -q)
    summary = next((line.strip("= ") for line in reversed(text.splitlines())
                    if re.search(r"\d+ (passed|failed|error|skipped|deselected)\b.* in [\d.]+s", line)), "no summary")
    result = {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "command": " ".join(cmd[2:]),
              "summary": summary if rc is not None else f"timed out after {timeout:.0f} s"}
    result["sync"] = {key: _test_outcome(out / "gpu_tests.xml", name) for key, name in SYNC_TESTS.items()}
    return result


def _test_outcome(xml: Path, name: str) -> str:
    """``passed`` / ``failed`` / ``skipped`` of one test in a JUnit XML report, or ``not run``."""
    if not xml.exists():
        return "not run"
    import xml.etree.ElementTree as ET

    for case in ET.parse(xml).iter("testcase"):
        if case.get("name") == name:
            if case.find("failure") is not None or case.find("error") is not None:
                return "failed"
            return "skipped" if case.find("skipped") is not None else "passed"
    return "not run"


# -- 4. the headline cell and its floor -------------------------------------------------------------------
def _args(device: str, quick: bool, max_seconds: float, **kw) -> argparse.Namespace:
    base = dict(device=device, quick=quick, max_seconds=max_seconds, n=None, ks=None, batches=None, operators=None,
                backends=["torch", "triton"], no_peers=False, table39_batches=None)
    base.update(kw)
    return argparse.Namespace(**base)


def floors(n: int, k: int, B: int, device: str, max_seconds: float, bw: tuple[float, str], sink) -> list[dict]:
    """``torch.sort`` and ``torch.topk`` of the same scores, forward and backward through the values."""
    x = torch.randn(B, n, generator=torch.Generator().manual_seed(n)).to(device)
    recs = []
    for name, fn, kk in (("torch.sort", lambda s: torch.sort(s, dim=-1, descending=True)[0], None),
                         ("torch.topk", lambda s: torch.topk(s, k, dim=-1)[0], k)):
        f, fb = grid.cell(fn, x, device, max_seconds)
        # the tables show a floor's time and memory only (its traffic bound would be that of (B, n) values)
        recs.append(sink(grid.record("floor", name, "torch", device, n, kk, B, f, fb, None, bw)))
    return recs


def _spent(table: str, name: str, device: str, cell: dict, bw: tuple[float, str]) -> dict:
    """The record of a cell skipped because its step's budget is spent (note :data:`BUDGET_SPENT`)."""
    m = grid.Measurement(float("nan"), float("nan"), error=BUDGET_SPENT)
    return grid.record(table, name, "-", device, cell["n"], cell["k"], cell["B"], m, m, None, bw, note=BUDGET_SPENT)


def run_headline(device: str, quick: bool, budget: float, bw: tuple[float, str], out: Path,
                 recs: list[dict] | None = None) -> list[dict]:
    """Every operator x backend and its peer at the headline cell, and the floors; rows appended to the CSV and
    to ``recs`` (returned; kept by the caller when the step fails part-way). Once ``budget`` seconds are spent,
    the remaining cells are records noted :data:`BUDGET_SPENT`."""
    cell = HEADLINE_QUICK if quick else HEADLINE
    recs = [] if recs is None else recs
    sink = grid.CsvSink(out / "headline.csv")
    t0, per_cell = time.monotonic(), max(0.5, budget / 60)
    from diffrank.operators import available

    if budget <= 0:
        recs += [sink(_spent("floor", name, device, cell, bw)) for name in ("torch.sort", "torch.topk")]
    else:
        recs += floors(cell["n"], cell["k"], cell["B"], device, per_cell, bw, sink)
    for name in available():
        if time.monotonic() - t0 >= budget:
            recs.append(sink(_spent("grid", name, device, cell, bw)))
            continue
        args = _args(device, False, per_cell, n=[cell["n"]], ks=[cell["k"]], batches=[cell["B"]], operators=[name])
        recs += grid.run_grid(args, bw, sink)
    return recs


# -- 5. Table 3.9 -----------------------------------------------------------------------------------------
def run_table39(device: str, quick: bool, budget: float, bw: tuple[float, str], out: Path,
                recs: list[dict] | None = None) -> list[dict]:
    """Full P forward+backward at the thesis' n, B = :data:`TABLE39_B` (``--quick``: n <= 32, B = 4); rows
    appended to the CSV and to ``recs`` (returned); the cells after ``budget`` seconds are noted
    :data:`BUDGET_SPENT`."""
    sink = grid.CsvSink(out / "table39.csv")
    args = _args(device, quick, max(0.5, budget / 40), table39_batches=[TABLE39_B])
    return grid.run_table39(args, bw, sink, deadline=time.monotonic() + budget, spent=BUDGET_SPENT, recs=recs)


# -- 6. the sorting protocol's training rate --------------------------------------------------------------
def run_sorting_rate(device: str, data_dir: str | None, out: Path, timeout: float, steps: int) -> dict:
    """Sets/s of :data:`SORTING_ROW` (batch 100, bf16-mixed, device-resident sets) in a subprocess."""
    if timeout <= 0:
        return {"note": BUDGET_SPENT}
    if not data_dir or not (Path(data_dir) / "MNIST" / "raw").is_dir():
        return {"note": f"no MNIST at {data_dir!r} (--data-dir / DIFFRANK_DATA: the folder holding MNIST/raw)"}
    path = out / "sorting_rate.json"
    cmd = [sys.executable, "-m", "diffrank.experiments.tools.throughput", "sorting", "--data-dir", str(data_dir),
           "--batch", "100", "--steps", str(steps), "--precision", "bf16-mixed", "--device", device,
           "--json", str(path), SORTING_ROW]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"note": f"timed out after {timeout:.0f} s"}
    (out / "sorting_rate.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not path.exists():
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {"note": f"failed (rc {proc.returncode}): {last[0][:160]}"}
    rate = json.loads(path.read_text())[0]
    rate["hours"] = {table: table_hours(table, rate["sets_per_s"] / rate["batch"]) for table in ("3.3", "3.7")}
    path.write_text(json.dumps(rate, indent=1))
    return rate


def table_hours(table: str, steps_per_s: float) -> dict:
    """Rows and hours (one seed each) of thesis Table ``table``'s sorting rows at ``steps_per_s``; every row at
    the measured rate, which is the MNIST n = 5 odd-even network's (larger n, other methods and the SVHN rows'
    larger CNN take longer per step: a lower bound)."""
    import yaml

    from diffrank.registry import config_dir

    folder = config_dir() / "experiment" / "sorting" / f"thesis_t{table.replace('.', '_')}"
    default = yaml.safe_load((config_dir() / "experiment" / "sorting" / "mnist.yaml").read_text())
    steps = []
    for path in sorted(folder.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text()) or {}
        steps.append((cfg.get("trainer") or {}).get("max_steps", default["trainer"]["max_steps"]))
    return {"rows": len(steps), "steps": sum(steps), "hours": sum(steps) / steps_per_s / 3600}


# -- 7. the report ----------------------------------------------------------------------------------------
PEER_IMPLS = ("difftopk", "diffsort", "torchsort", "lapsum-official")


def _ok(rec: dict | None) -> bool:
    return rec is not None and rec["fwd_bwd_s"] == rec["fwd_bwd_s"]


def _t(rec: dict | None, measured: bool, key: str = "fwd_bwd_s", failed: str | None = None) -> str:
    """A time cell: :data:`BUDGET_SPENT` for a cell skipped for the budget and ``failed: <error>`` for a cell the
    failed step (``failed``) never reached (on the CPU too); else "not measured" off the GPU, "-" without a
    record, the skip / failure note without a time."""
    if rec is None and failed:
        return f"failed: {failed}"[:100]
    if rec is not None and rec.get("note") == BUDGET_SPENT:
        return BUDGET_SPENT
    if not measured:
        return NOT_MEASURED
    if rec is None:
        return "-"
    v = rec[key]
    return fmt_time(v) if v == v else (rec["note"] or "failed")[:60]


def _split(recs: list[dict]) -> tuple[dict, list[dict], dict]:
    """(floors by name, our grid rows, the peer row by operator)."""
    floor = {r["operator"]: r for r in recs if r["table"] == "floor"}
    ours = [r for r in recs if r["table"] == "grid" and r["impl"] not in PEER_IMPLS]
    peers = {r["operator"]: r for r in recs if r["table"] == "grid" and r["impl"] in PEER_IMPLS}
    return floor, ours, peers


def headline_table(recs: list[dict], measured: bool, failed: str | None = None) -> list[str]:
    """docs/gpu.md's headline table: one line per operator x impl, its peer and the ratios to peer and floor;
    when the step failed (``failed``: its error), the cells it did not reach say ``failed: <error>``."""
    floor, ours, peers = _split(recs)
    sort_t = floor["torch.sort"]["fwd_bwd_s"] if _ok(floor.get("torch.sort")) else float("nan")
    dash = "-" if measured else NOT_MEASURED
    lines = ["| operator | impl | fwd+bwd | peak memory | GB/s (≥) | % of peak | ÷ torch.sort | peer | peer fwd+bwd "
             "| ours ÷ peer |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in ("torch.sort", "torch.topk"):
        r = floor.get(name)
        lines.append(f"| {name} (floor) | torch | {_t(r, measured, failed=failed)} | "
                     f"{fmt_bytes(r['peak_bytes']) if measured and _ok(r) else dash} | | | | | | |")
    for r in ours:
        ok, p = measured and _ok(r), peers.get(r["operator"])
        cells = [r["operator"], r["impl"], _t(r, measured),
                 fmt_bytes(r["peak_bytes"]) if ok else dash, grid._gbps(r["achieved_Bps"]) if ok else dash,
                 grid._pct(r["roofline_frac"]) if ok else dash,
                 f"{r['fwd_bwd_s'] / sort_t:.1f}" if ok and sort_t == sort_t else dash,
                 p["impl"] if p else "", _t(p, measured) if p else "",
                 f"{r['fwd_bwd_s'] / p['fwd_bwd_s']:.2f}" if ok and _ok(p) else (dash if p else "")]
        lines.append("| " + " | ".join(cells) + " |")
    if failed:
        lines.append(f"| (operators not reached) | | {_t(None, measured, failed=failed)} | | | | | | | |")
    return lines


def best_ratios(recs: list[dict]) -> list[str]:
    """Per operator: our fastest impl, ÷ its peer (where it has one) and ÷ torch.sort (the closing note's
    figures), fastest first."""
    floor, ours, peers = _split(recs)
    best: dict = {}
    for r in ours:
        if _ok(r) and (r["operator"] not in best or r["fwd_bwd_s"] < best[r["operator"]]["fwd_bwd_s"]):
            best[r["operator"]] = r
    sort_t = floor["torch.sort"]["fwd_bwd_s"] if _ok(floor.get("torch.sort")) else float("nan")
    lines = ["| operator | our fastest | fwd+bwd | peer | peer fwd+bwd | ours ÷ peer | ours ÷ torch.sort |",
             "|---|---|---|---|---|---|---|"]
    for name, r in sorted(best.items(), key=lambda kv: kv[1]["fwd_bwd_s"]):
        p = peers.get(name)
        cells = [name, r["impl"], fmt_time(r["fwd_bwd_s"]), p["impl"] if p else "-", _t(p, True) if p else "-",
                 f"{r['fwd_bwd_s'] / p['fwd_bwd_s']:.2f}" if _ok(p) else "-",
                 f"{r['fwd_bwd_s'] / sort_t:.1f}" if sort_t == sort_t else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def table39_table(recs: list[dict], measured: bool, failed: str | None = None) -> list[str]:
    """docs/gpu.md's Table 3.9 table: time per set at B = :data:`TABLE39_B` beside the thesis' GPU figure (the
    cells a failed step did not reach: ``failed: <error>``)."""
    by = {(r["operator"], r["n"]): r for r in recs if r["table"] == "table3.9"}
    thesis = grid.thesis_table39()
    cols = [("diffsort_odd_even", "dsn", "odd_even", "odd-even"), ("diffsort_bitonic", "dsn", "bitonic", "bitonic"),
            ("neuralsort", "neuralsort", "", "NeuralSort"), ("fast_soft_sort", "fastsort", "", "fast soft rank"),
            ("sinkhorn", "sinkhorn", "", "Sinkhorn")]
    lines = ["| n | " + " | ".join(f"{c[3]} (ours) | {c[3]} (thesis GPU)" for c in cols) + " |",
             "|---" * (1 + 2 * len(cols)) + "|"]
    for n in grid.TABLE39_N:
        cells = []
        for op, t_op, t_net, _ in cols:
            t = thesis.get((t_op, t_net, n), {}).get("gpu_time_s")
            cells += [_t(by.get((op, n)), measured, "per_sample_s", failed), fmt_time(t) if t is not None else "-"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def training_table(tests: dict, rate: dict, measured: bool) -> list[str]:
    """docs/gpu.md's training table: the one-sync tests' verdicts, sets/s, and hours of thesis Tables 3.3 / 3.7."""
    def verdict(key: str) -> str:
        """The table cell of one sync test (``key``: ``sorting`` / ``classifier``) from its JUnit outcome."""
        v = tests.get("sync", {}).get(key, "not run")
        return {"passed": "at most as allowed (test passed)",
                "failed": "more than allowed (test failed: gpu_tests.log)"}.get(v, f"{NOT_MEASURED} ({v})")

    sps = rate.get("sets_per_s")
    if measured and sps:
        speed = f"{sps:.0f} ({1e3 * rate['s_per_step']:.2f} ms/step over {rate['steps']} steps)"
    elif str(rate.get("note", "")).startswith(("failed", BUDGET_SPENT)):
        speed = rate["note"]
    else:
        speed = NOT_MEASURED + (f" ({rate['note']})" if rate.get("note") else "")
    lines = ["| figure | value |", "|---|---|",
             f"| host synchronisations per sorting step (odd-even Cauchy n = 5; allowed: 1) | {verdict('sorting')} |",
             f"| host synchronisations per classifier step (top-k CE, SoftSort) | {verdict('classifier')} |",
             f"| sets/s, odd-even Cauchy n = 5, B = 100, bf16-mixed, device-resident data | {speed} |"]
    for table in ("3.3", "3.7"):
        h = rate.get("hours", {}).get(table)
        value = f"{h['hours']:.0f} h ({h['rows']} rows, {h['steps']:,} steps)" if measured and h else NOT_MEASURED
        lines.append(f"| thesis Table {table}, every row (MNIST and SVHN), one seed each, at that rate (a lower bound) "
                     f"| {value} |")
    return lines


def report(env: dict, tests: dict, peers: dict, head: list[dict], t39: list[dict], rate: dict, command: str,
           measured: bool, failed: dict[str, str] | None = None) -> str:
    """The markdown of ``gpu_check.md`` (docs/gpu.md's "Figures" section, filled in); ``failed``: ``{step: error}``
    of the steps that raised (their tables say ``failed: <error>``)."""
    failed = failed or {}
    dev = env.get("device_name", env["device"])
    cell = "n = 100, k = 5, B = 8 (--quick)" if not measured else "n = 1 000, k = 5, B = 1 024"
    out = [f"#### {env['date']}, {dev}" + (f" (driver {env['driver']})" if env.get("driver") else ""),
           "", f"torch {env['torch']} (CUDA {env['cuda']}), Triton {env['triton']}, Python {env['python']}; "
           f"nvcc: {env['nvcc'] or 'not found'}. Command: `{command}`.", "",
           f"Tests (`{tests.get('command', TESTS_COMMAND)}`): {tests.get('summary', NOT_MEASURED)}"
           + (f" in {tests['seconds']} s" if tests.get("seconds") else "") + ".", "",
           "Peers built here: " + (", ".join(f"{k}: {v}" for k, v in peers.items()) or "none") + ".", "",
           f"##### Headline cell: {cell} (forward+backward)", "",
           *headline_table(head, measured, failed.get("headline")), "",
           "Our fastest implementation of each operator against its peer and the floor:", "",
           *(best_ratios(head) if measured else ["| not measured |", "|---|"]), "",
           f"##### Table 3.9 sizes: time per set (time / B, B = {TABLE39_B}), full P forward+backward", "",
           *table39_table(t39, measured, failed.get("table39")), "", "##### Training step and run", "",
           *training_table(tests, rate, measured)]
    return "\n".join(out) + "\n"


def plot(recs: list[dict], path: Path, title: str) -> None:
    """Horizontal bars of forward+backward time per operator x impl (log scale), the floors as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in recs if r["table"] in ("grid", "table3.9") and r["fwd_bwd_s"] == r["fwd_bwd_s"]]
    if not rows:
        return
    labels = [f"{r['operator']} [{r['impl']}]" + (f" n={r['n']}" if r["table"] == "table3.9" else "") for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.25 * len(rows) + 1.5))
    ax.barh(range(len(rows)), [r["fwd_bwd_s"] for r in rows], color="tab:blue")
    for r in recs:
        if r["table"] == "floor" and r["fwd_bwd_s"] == r["fwd_bwd_s"]:
            ax.axvline(r["fwd_bwd_s"], linestyle="--", color="gray")
            ax.text(r["fwd_bwd_s"], -1, r["operator"], fontsize=7, rotation=90, va="top")
    ax.set_yticks(range(len(rows)), labels, fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("forward+backward time per call (s)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command ------------------------------------------------------------------------------------------
def _guard(step: str, fn, fallback, failed: dict[str, str] | None = None):
    """``fn()``, or ``fallback`` after printing the error (and recording it in ``failed[step]`` for the tables):
    one failing step must not cost the others' figures."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported in the tables as the step's failure
        import traceback

        print(f"[gpu-check] step {step} failed: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
        if failed is not None:
            failed[step] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        return fallback


def main(argv: list[str] | None = None) -> str:
    """Run the steps of the module docstring; returns the markdown report (also written and printed).

    Raises:
        SystemExit: status 2 for a bad flag (a device other than cpu / cuda, a negative or non-finite budget);
            ``--device cuda`` without a visible CUDA device; ``error: cannot write into <out>: …`` when a file of
            ``--out`` cannot be written.
    """
    p = argparse.ArgumentParser(prog="python -m diffrank.benchmark.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="outputs/gpu_check", help="the folder everything is written into")
    p.add_argument("--device", type=device_type, default="cuda", help="cuda (the check) or cpu (the dry run)")
    p.add_argument("--quick", action="store_true", help="small sizes, no pytest step (the CPU dry run)")
    p.add_argument("--budget", type=non_negative_float, default=420.0,
                   help="seconds for all steps together (0: every step skipped)")
    p.add_argument("--data-dir", default=os.environ.get("DIFFRANK_DATA"), help="folder holding MNIST/raw")
    p.add_argument("--peer-src", default=os.environ.get("DIFFRANK_PEER_SRC"),
                   help="folder with checkouts torchsort/ and LapSum/ to build their CUDA extensions (needs nvcc)")
    p.add_argument("--skip", nargs="*", default=[], choices=["tests", "headline", "table39", "sorting", "peers"])
    a = p.parse_args(argv)
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False); "
                         "the dry run is --device cpu --quick")
    command = "python -m diffrank.benchmark.gpu " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        return _check(a, command)
    except OSError as e:  # --out not writable, or a full disk: the steps' own errors are in their tables
        raise SystemExit(f"error: cannot write into {a.out}: {e}") from None


def _check(a: argparse.Namespace, command: str) -> str:
    """The steps of :func:`main` for its parsed options ``a``; the markdown report."""
    cuda = a.device.startswith("cuda")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(a.device)
    (out / "environment.json").write_text(json.dumps(env, indent=1))
    print(f"[gpu-check] {env['device_name']}, torch {env['torch']}, Triton {env['triton']}, nvcc {env['nvcc']}",
          flush=True)
    failed: dict[str, str] = {}
    procs, why = ([], "skipped") if "peers" in a.skip or not cuda else _guard(
        "peers", lambda: start_peer_builds(a.peer_src, env["nvcc"], out), ([], "failed to start"), failed)
    if "peers" in failed:
        why = f"failed: {failed['peers']}"
    if "tests" in a.skip or a.quick:
        tests = {"summary": NOT_MEASURED + (" (--quick)" if a.quick else " (skipped)")}
    elif a.budget <= 0:
        tests = {"summary": BUDGET_SPENT}
    else:
        print("[gpu-check] pytest -m 'gpu or triton' ...", flush=True)
        tests = _guard("tests", lambda: run_tests(out, SHARES["tests"] * a.budget), {}, failed)
        tests.setdefault("summary", f"failed: {failed.get('tests')}")
        print(f"[gpu-check] tests: {tests['summary']}", flush=True)
    peers = finish_peer_builds(procs, 120.0) if procs else ({"torchsort, lapsum-official": why} if cuda else {})
    bw = grid.peak_bandwidth(a.device, measure_copy=cuda)
    head: list[dict] = []  # filled as the step goes: a step failing part-way keeps what it measured
    if "headline" not in a.skip:
        _guard("headline", lambda: run_headline(a.device, a.quick, SHARES["headline"] * a.budget, bw, out, head),
               None, failed)
    t39: list[dict] = []
    if "table39" not in a.skip:
        _guard("table39", lambda: run_table39(a.device, a.quick, SHARES["table39"] * a.budget, bw, out, t39),
               None, failed)
    if "sorting" in a.skip or not cuda:
        rate = {"note": "skipped" if "sorting" in a.skip else "measured on CUDA only"}
    else:
        print("[gpu-check] sorting protocol rate ...", flush=True)
        rate = _guard("sorting", lambda: run_sorting_rate(a.device, a.data_dir, out, SHARES["sorting"] * a.budget,
                                                          steps=200), {}, failed)
        if "sorting" in failed:
            rate = {"note": f"failed: {failed['sorting']}"}
    name = env["device_name"]
    plot(head, out / "headline.png", f"headline cell, {name}")
    plot(t39, out / "table39.png", f"thesis Table 3.9 sizes (B = {TABLE39_B}), {name}")
    md = report(env, tests, peers, head, t39, rate, command, measured=cuda, failed=failed)
    (out / "gpu_check.md").write_text(md)
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "value"])
        w.writerows([("tests", tests.get("summary")), ("peers", json.dumps(peers)),
                     ("sets_per_s", rate.get("sets_per_s", rate.get("note")))])
    print(md, flush=True)
    return md


if __name__ == "__main__":
    main()
