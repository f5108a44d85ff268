"""Compile every Triton kernel launch for real GPU targets without a GPU, and report its resource budget.

``python -m devtools.kernels.aot`` compiles each :class:`~devtools.kernels.launches.Launch` of
:func:`~devtools.kernels.launches.auto_launches` with ``triton.compile(ASTSource(...), target=GPUTarget("cuda",
arch, 32))`` for sm_80 (A100) and sm_90 (H100), reads the shared memory from the compiled metadata and the
registers and spills from the ptxas that ships in the triton wheel (``ptxas -v`` on the PTX, with the flags
Triton itself passes), and prints a markdown table; exit status 1 when a launch fails its check:

- the compiler (Triton, LLVM or ptxas) rejects it;
- its shared memory exceeds the target's per-block limit (:data:`SHARED_LIMIT`), where the launch would raise;
- not one program fits on an SM (registers x threads or shared memory), where the launch would raise.

Spills and low occupancy are reported, not failed: a spill costs time, not correctness (see ``docs/gpu.md``).
Occupancy is the number of the launch's programs resident per SM, from registers (allocated per warp in units of
256), shared memory (plus the 1 KiB per block the runtime reserves) and the 64-warp / 32-block limits; it is
also given as warps per SM.

Run it with ``TRITON_INTERPRET`` unset: under the interpreter ``@triton.jit`` builds interpreted functions, which
cannot be compiled. Compiled programs are cached by Triton (``~/.triton/cache``), so a second run only re-runs
ptxas.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

#: the targets compiled: compute capability -> the name in words
ARCHS = {80: "sm_80 (A100)", 90: "sm_90 (H100)"}
#: largest dynamic shared memory per block (opt-in), bytes: 163 KiB on sm_80, 227 KiB on sm_90
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
#: shared memory per SM, bytes (the per-block limit plus the 1 KiB the runtime reserves per block)
SHARED_PER_SM = {80: 164 * 1024, 90: 228 * 1024}
REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32


@dataclass
class Budget:
    """What one launch costs on one target.

    Attributes:
        kernel: the kernel's function name; config: its constexprs, dtypes and warps
            (:meth:`~devtools.kernels.launches.Launch.config`); example: the sizes it stands for; role: forward
            or backward; arch: compute capability (80, 90).
        registers: registers per thread (ptxas); shared: shared memory per program, bytes (Triton's metadata);
        spill_stores, spill_loads: bytes per thread (ptxas); stack: stack frame bytes per thread (ptxas).
        num_warps: warps per program; blocks_per_sm: resident programs per SM (0: the launch would fail).
        error: why the launch fails its check, or ``""``; seconds: compile time.
    """

    kernel: str
    config: str
    example: str
    role: str
    arch: int
    registers: int = 0
    shared: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    num_warps: int = 4
    blocks_per_sm: int = 0
    error: str = ""
    seconds: float = 0.0

    @property
    def warps_per_sm(self) -> int:
        """Resident warps per SM (of 64)."""
        return self.blocks_per_sm * self.num_warps


def blocks_per_sm(registers: int, num_warps: int, shared: int, arch: int) -> int:
    """Resident programs per SM for a launch of ``num_warps`` warps (the CUDA occupancy rules for sm_80 / sm_90).

    Args:
        registers: registers per thread (ptxas ``Used N registers``).
        num_warps: warps per program.
        shared: shared memory per program, bytes.
        arch: 80 or 90.

    Returns:
        The number of programs an SM holds at once; 0 when one does not fit (the launch raises).
    """
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_registers = (REGISTERS_PER_SM // per_warp) // num_warps
    by_shared = SHARED_PER_SM[arch] // (shared + 1024)
    return min(by_registers, by_shared, MAX_WARPS_PER_SM // num_warps, MAX_BLOCKS_PER_SM)


def ptxas_usage(ptx: str, arch: int) -> dict[str, int]:
    """Registers, spills and stack of a PTX module from the triton wheel's ``ptxas -v``.

    Args:
        ptx: the PTX text (``compiled.asm["ptx"]``).
        arch: 80 or 90 (ptxas targets ``sm_80`` / ``sm_90a``, as Triton does).

    Returns:
        ``registers``, ``spill_stores``, ``spill_loads`` (bytes per thread), ``stack`` (bytes per thread),
        ``smem`` (static shared bytes).

    Raises:
        RuntimeError: ptxas fails (its stderr in the message).
    """
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(arch).path, "-v", "--regAllocOptLevel=2", f"--gpu-name={sm_arch_from_capability(arch)}", path,
               "-o", os.path.join(tmp, "k.cubin")]
        res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"ptxas failed ({res.returncode}): {res.stderr.strip()}")
    return _parse_ptxas(res.stderr + res.stdout)


def _parse_ptxas(log: str) -> dict[str, int]:
    """The numbers of a ``ptxas -v`` log (one kernel per module, as Triton emits)."""

    def grab(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    return {"registers": grab(r"Used (\d+) registers"), "spill_stores": grab(r"(\d+) bytes spill stores"),
            "spill_loads": grab(r"(\d+) bytes spill loads"), "stack": grab(r"(\d+) bytes stack frame"),
            "smem": grab(r"(\d+) bytes smem")}


@contextlib.contextmanager
def _ptxas_log():
    """Triton prints the log of its own ``ptxas -v`` run (``TRITON_DUMP_PTXAS_LOG``) within the block."""
    from triton import knobs

    old = knobs.nvidia.dump_ptxas_log
    knobs.nvidia.dump_ptxas_log = True
    try:
        yield
    finally:
        knobs.nvidia.dump_ptxas_log = old


def _usage(ptx: str, arch: int, log: str) -> dict[str, int]:
    """:func:`ptxas_usage` from Triton's ptxas log when it ran, else from a file cache keyed by the PTX, else by
    running ptxas (a program Triton found in its own cache was not assembled again, so it printed no log)."""
    from triton import knobs

    key = hashlib.sha256(f"{arch}\n{ptx}".encode()).hexdigest()
    path = os.path.join(knobs.cache.dir, "diffrank_ptxas", f"{key}.json")
    if "Used" in log:
        usage = _parse_ptxas(log)
    elif os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    else:
        usage = ptxas_usage(ptx, arch)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(usage, f)
    return usage


def compile_launch(launch, arch: int) -> Budget:
    """Compile one launch for ``GPUTarget("cuda", arch, 32)`` and check it against the target's limits.

    Args:
        launch: a :class:`~devtools.kernels.launches.Launch` (its kernel a ``@triton.jit`` function, not an
            interpreted one).
        arch: compute capability, 80 or 90.

    Returns:
        The :class:`Budget`; ``error`` says why the launch would fail (compiler error, shared memory above
        :data:`SHARED_LIMIT`, no program fits on an SM), else ``""``. Never raises for a kernel's fault.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    b = Budget(launch.name, launch.config(), launch.example, launch.role, arch, num_warps=launch.num_warps)
    start = time.perf_counter()
    try:
        src = ASTSource(fn=launch.kernel, signature=launch.signature, constexprs=launch.constexprs,
                        attrs=launch.attrs)
        log = io.StringIO()
        # Triton runs ptxas -v itself and prints its log when asked: read it instead of running ptxas again
        with contextlib.redirect_stdout(log), _ptxas_log():
            compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                      options={"num_warps": launch.num_warps})
        usage = _usage(compiled.asm["ptx"], arch, log.getvalue())
    except Exception as e:  # noqa: BLE001 - any compiler failure is the finding
        b.error = f"compile: {type(e).__name__}: {_first_lines(str(e))}"
        b.seconds = time.perf_counter() - start
        return b
    b.seconds = time.perf_counter() - start
    b.registers, b.stack = usage["registers"], usage["stack"]
    b.spill_stores, b.spill_loads = usage["spill_stores"], usage["spill_loads"]
    b.shared = max(int(compiled.metadata.shared), usage["smem"])
    b.blocks_per_sm = blocks_per_sm(b.registers, b.num_warps, b.shared, arch)
    if b.shared > SHARED_LIMIT[arch]:
        b.error = f"shared memory {b.shared} B > {SHARED_LIMIT[arch]} B per block on sm_{arch}"
    elif b.blocks_per_sm == 0:
        b.error = f"no program fits on an SM ({b.registers} registers x {32 * b.num_warps} threads)"
    return b


def _first_lines(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[:lines] if line.strip())[:300]


def representative(launches: Sequence) -> list:
    """The subset the default test suite compiles: for each kernel and each value of its non-size constexprs
    and dtypes, the launch with the largest blocks (the most registers and shared memory), plus every kernel's
    smallest block with integer arguments specialised to 1.

    Args:
        launches: :class:`~devtools.kernels.launches.Launch` es.

    Returns:
        A sub-list, in the input order.
    """
    size = lambda launch: math.prod(v for k, v in launch.constexprs.items()  # noqa: E731
                                    if k.startswith(("BLOCK", "BN", "BM", "TBLOCK")) and isinstance(v, int))
    variant = lambda launch: (launch.name, tuple(sorted(t for t in set(launch.signature.values()) if t[0] == "*")),  # noqa: E731,E501
                              tuple((k, str(v)) for k, v in launch.constexprs.items()
                                    if not k.startswith(("BLOCK", "BN", "BM", "TBLOCK")) and k not in launch.ones))
    largest: dict = {}
    smallest: dict = {}
    for i, launch in enumerate(launches):
        v = variant(launch)
        if v not in largest or size(launch) > size(launches[largest[v]]):
            largest[v] = i
        if launch.ones and (launch.name not in smallest or size(launch) < size(launches[smallest[launch.name]])):
            smallest[launch.name] = i
    keep = set(largest.values()) | set(smallest.values())
    return [launch for i, launch in enumerate(launches) if i in keep]


_LAUNCHES: list = []


def _work(job: tuple[int, int]) -> Budget:
    """Pool worker: compile launch ``job[0]`` of the inherited listing for arch ``job[1]``."""
    return compile_launch(_LAUNCHES[job[0]], job[1])


def check(launches: Sequence, archs: Sequence[int] = tuple(ARCHS), jobs: int = 1) -> list[Budget]:
    """Compile every launch for every arch (``jobs`` processes) and return the budgets, launch-major.

    Args:
        launches: :class:`~devtools.kernels.launches.Launch` es whose kernels are compiled ``@triton.jit``
            functions (``TRITON_INTERPRET`` unset when they were defined).
        archs: compute capabilities.
        jobs: worker processes (forked; 1 = in this process).

    Returns:
        One :class:`Budget` per (launch, arch); a failed one has ``error`` set.

    Raises:
        RuntimeError: if a kernel is an interpreted function (``TRITON_INTERPRET=1``).
    """
    from triton.runtime.jit import JITFunction

    for launch in launches:
        if not isinstance(launch.kernel, JITFunction):
            raise RuntimeError(f"{launch.name} is not a compiled @triton.jit function (TRITON_INTERPRET=1?); "
                               "run the ahead-of-time checks without the interpreter")
    _LAUNCHES[:] = list(launches)
    work = [(i, arch) for i in range(len(launches)) for arch in archs]
    if jobs <= 1:
        return [_work(w) for w in work]
    import multiprocessing

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_work, work, chunksize=4))


def markdown(budgets: Sequence[Budget], notes: dict[str, str] | None = None) -> str:
    """The budget table (kernel x configuration x arch) as markdown.

    Args:
        budgets: from :func:`check`. Launches that share kernel, config and arch (the size examples of one
            configuration) are merged: the worst registers, shared memory, spills and occupancy of the group.
        notes: kernel name -> a remark for its rows that spill (default :data:`NOTES`).

    Returns:
        A markdown table, one row per (kernel, configuration, arch).
    """
    groups: dict[tuple, list[Budget]] = {}
    for b in budgets:
        groups.setdefault((b.kernel, b.config, b.role, b.arch), []).append(b)
    rows = ["| kernel | pass | configuration | arch | regs/thread | shared (B) | spill st/ld (B) | programs/SM "
            "(warps) | sizes | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (kernel, config, role, arch), bs in groups.items():
        ok = [b for b in bs if not b.error.startswith("compile")]
        err = "; ".join(sorted({b.error for b in bs if b.error})).replace("|", "/")
        if ok:
            worst = min(ok, key=lambda b: b.blocks_per_sm)
            regs = max(b.registers for b in ok)
            shared = max(b.shared for b in ok)
            spill = f"{max(b.spill_stores for b in ok)} / {max(b.spill_loads for b in ok)}"
            occ = f"{worst.blocks_per_sm} ({worst.warps_per_sm})"
        else:
            regs = shared = spill = occ = "-"
        spilled = ok and max(b.spill_stores + b.spill_loads for b in ok) > 0
        note = " ".join(x for x in ((NOTES if notes is None else notes).get(kernel, "") if spilled else "",
                                    f"FAILS: {err}" if err else "") if x)
        sizes = ", ".join(b.example for b in bs)
        rows.append(f"| `{kernel}` | {role} | {config} | sm_{arch} | {regs} | {shared} | {spill} | {occ} | {sizes} "
                    f"| {note} |")
    return "\n".join(rows)


#: why a launch that spills is accepted, by kernel (a spill without a note here fails the tests)
NOTES = {
    "_lapsum_scan": "spills 4 B per thread (one register) at BLOCK=512 on sm_80: at most one 4-byte local store and "
                    "load per block of 512 items, beside its 2 x 512 global loads; accepted",
    "_sinkhorn_run": "spills 4-8 B per thread (one or two registers) at 32 x 32 on sm_90: at most two local accesses "
                     "per iteration beside the 32 x 32 tile's exp / log work; accepted",
    "_sinkhorn_bwd_run": "spills 16 B per thread at 16 x 16 float64 on sm_90 (four registers); accepted as above",
    "_values_bwd": "spills 4 B per thread (one register) at BLOCK=4096, sigmoid optimal, on sm_80; accepted",
    "_rows_bwd": "spills 16-20 B per thread at BLOCK_M=2 BLOCK_N=1024 on sm_80 (ptxas keeps 64 registers at 8 warps, "
                 "128 at 4): a few local accesses per layer beside the tile's 2 x 2 048 loads; accepted",
}


def summary(budgets: Sequence[Budget], notes: dict[str, str] | None = None) -> str:
    """One row per (kernel, pass, arch): the worst of its configurations, as markdown.

    Args:
        budgets: from :func:`check`.
        notes: kernel name -> remark (default :data:`NOTES`).

    Returns:
        A markdown table: configurations compiled, most registers (and where), most shared memory, most
        spill bytes, fewest programs per SM (and where), failures.
    """
    notes = NOTES if notes is None else notes
    groups: dict[tuple, list[Budget]] = {}
    for b in budgets:
        groups.setdefault((b.kernel, b.role, b.arch), []).append(b)
    rows = ["| kernel | pass | arch | configs | max regs/thread (at) | max shared (B) | max spill st/ld (B) | "
            "min programs/SM (warps) (at) | note |", "|---|---|---|---|---|---|---|---|---|"]
    for (kernel, role, arch), bs in groups.items():
        ok = [b for b in bs if not b.error.startswith("compile")] or bs
        regs = max(ok, key=lambda b: b.registers)
        occ = min(ok, key=lambda b: (b.warps_per_sm, b.blocks_per_sm))
        spill = f"{max(b.spill_stores for b in ok)} / {max(b.spill_loads for b in ok)}"
        failed = sum(1 for b in bs if b.error)
        note = " ".join(x for x in (notes.get(kernel, "") if spill != "0 / 0" else "",
                                    f"FAILS in {failed}" if failed else "") if x)
        rows.append(f"| `{kernel}` | {role} | sm_{arch} | {len({b.config for b in bs})} | {regs.registers} "
                    f"({regs.config}) | {max(b.shared for b in ok)} | {spill} | {occ.blocks_per_sm} "
                    f"({occ.warps_per_sm}) ({occ.config}) | {note} |")
    return "\n".join(rows)


def _load(spec: str):
    """``module:function`` -> the launches it returns."""
    module, _, fn = spec.partition(":")
    return getattr(importlib.import_module(module), fn or "auto_launches")()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: compile the launches for sm_80 and sm_90, print the budget table, exit 1 on a failure.

    Args:
        argv: ``[--subset] [--arch 80 90] [--jobs N] [--launches module:function] [--out table.md]
            [--summary summary.md] [--json budgets.json] [--from-json budgets.json]``.

    Returns:
        0 when every launch passes, 1 otherwise (2: run under ``TRITON_INTERPRET=1``).
    """
    p = argparse.ArgumentParser(prog="python -m devtools.kernels.aot", description=__doc__.splitlines()[0])
    p.add_argument("--subset", action="store_true", help="the representative subset (the default test suite's)")
    p.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), choices=list(ARCHS))
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--launches", default="devtools.kernels.launches:auto_launches",
                   help="module:function returning the launches (default: every launch of backend=auto)")
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--json", help="write every budget as JSON here")
    p.add_argument("--summary", help="also write the one-row-per-kernel summary (markdown) here")
    p.add_argument("--from-json", help="render the tables of an earlier --json instead of compiling")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            budgets = [Budget(**b) for b in json.load(f)]
        _write(args, budgets)
        return 1 if any(b.error for b in budgets) else 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled", file=sys.stderr)
        return 2
    launches = _load(args.launches)
    if args.subset:
        launches = representative(launches)
    start = time.perf_counter()
    budgets = check(launches, args.arch, args.jobs)
    wall = time.perf_counter() - start
    print(_write(args, budgets))
    failed = [b for b in budgets if b.error]
    print(f"\n{len(launches)} launches x {len(args.arch)} targets compiled in {wall:.0f} s ({args.jobs} jobs); "
          f"{len(failed)} failed", file=sys.stderr)
    for b in failed:
        print(f"FAILED {b.kernel} [{b.config}] {b.example} sm_{b.arch}: {b.error}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(b) for b in budgets], f, indent=1)
    return 1 if failed else 0


def _write(args, budgets: Sequence[Budget]) -> str:
    """Write the tables the command line asked for; returns the full table."""
    table = markdown(budgets)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(summary(budgets) + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
