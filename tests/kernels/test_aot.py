"""Ahead-of-time compilation of the kernel launches for sm_80 and sm_90 without a GPU (``devtools/kernels/aot.py``).

The compiler runs in a subprocess without ``TRITON_INTERPRET`` (this suite's conftest sets it, and under it
``@triton.jit`` builds interpreted functions). Triton caches what it compiled (``~/.triton/cache``) and the
checker caches ptxas' numbers beside it, so a second run of an unchanged kernel costs seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from devtools.kernels.aot import ARCHS, NOTES, SHARED_LIMIT, blocks_per_sm, representative
from devtools.kernels.launches import auto_launches


def _aot(*args: str, tmp_path, pythonpath: str | None = None, timeout: int = 900) -> tuple[int, str, list[dict]]:
    """Run ``python -m devtools.kernels.aot`` without the interpreter; (exit status, stderr, budgets)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    out = tmp_path / "budgets.json"
    res = subprocess.run([sys.executable, "-m", "devtools.kernels.aot", *args, "--json", str(out)], env=env,
                         capture_output=True, text=True, timeout=timeout)
    return res.returncode, res.stderr, json.loads(out.read_text()) if out.exists() else []


def _check_budgets(budgets: list[dict], launches) -> None:
    """Every launch compiled for both targets, within the limits; a spill only where :data:`NOTES` says why it is
    accepted; at least one 4-warp block's worth of warps resident per SM."""
    assert {(b["kernel"], b["arch"]) for b in budgets} == {(launch.name, a) for launch in launches for a in ARCHS}
    assert len(budgets) == len(launches) * len(ARCHS)
    for b in budgets:
        assert not b["error"], b
        assert 0 < b["registers"] <= 255 and 0 <= b["shared"] <= SHARED_LIMIT[b["arch"]]
        assert b["blocks_per_sm"] * b["num_warps"] >= 4, b
        assert b["spill_stores"] + b["spill_loads"] == 0 or b["kernel"] in NOTES, b


def test_the_representative_subset_compiles_for_sm80_and_sm90(tmp_path):
    launches = representative(auto_launches())
    rc, err, budgets = _aot("--subset", tmp_path=tmp_path)
    assert rc == 0, err[-3000:]
    _check_budgets(budgets, launches)


@pytest.mark.slow
def test_every_launch_compiles_for_sm80_and_sm90(tmp_path):
    rc, err, budgets = _aot(tmp_path=tmp_path, timeout=5400)
    assert rc == 0, err[-3000:]
    _check_budgets(budgets, auto_launches())


def test_the_subset_holds_every_kernel_dtype_and_variant():
    launches = auto_launches()
    subset = representative(launches)
    assert len(subset) < len(launches) / 5
    variant = lambda launch: (launch.name, launch.config().split(" w")[0].split(" ")[-1],  # noqa: E731
                              tuple((k, str(v)) for k, v in launch.constexprs.items()
                                    if k in ("MODE", "SIGMOID", "CHECK", "HISTORY", "HAS_GOUT", "ACC")))
    assert {variant(launch) for launch in subset} == {variant(launch) for launch in launches}
    assert {launch.name for launch in subset if launch.ones} == {launch.name for launch in launches}


PLANTED = '''
import torch
import triton
import triton.language as tl

from devtools.kernels.launches import _launch


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _big_dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m = tl.arange(0, M)
    n = tl.arange(0, N)
    k = tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b))


def launches():
    f32, f16 = torch.float32, torch.float16
    return [
        _launch(_copy, dict(x_ptr=f32, y_ptr=f32, n=37), dict(BLOCK=1024), 4, "n=37", "forward"),  # fine
        _launch(_copy, dict(x_ptr=f32, y_ptr=f32, n=37), dict(BLOCK=48), 4, "n=37", "forward"),  # not a power of 2
        # operands of 16 x 4096 and 4096 x 16 halves: 256 KiB of shared memory, above both targets' limit
        _launch(_big_dot, dict(a_ptr=f16, b_ptr=f16, c_ptr=f32), dict(M=16, N=16, K=4096), 4, "16x4096x16",
                "forward"),
    ]
'''


def test_a_planted_broken_kernel_fails_the_check(tmp_path):
    """A block the compiler rejects and a kernel above the shared-memory limit fail, on both targets; a sound
    kernel beside them passes."""
    (tmp_path / "planted_kernels.py").write_text(textwrap.dedent(PLANTED))
    rc, err, budgets = _aot("--launches", "planted_kernels:launches", "--jobs", "1", tmp_path=tmp_path,
                            pythonpath=str(tmp_path))
    assert rc == 1, err[-3000:]
    by = {(b["kernel"], b["config"].split(" ")[0], b["arch"]): b for b in budgets}
    for arch in ARCHS:
        assert not by[("_copy", "BLOCK=1024", arch)]["error"] and by[("_copy", "BLOCK=1024", arch)]["registers"] > 0
        assert "CompilationError" in by[("_copy", "BLOCK=48", arch)]["error"]
        assert f"> {SHARED_LIMIT[arch]} B per block" in by[("_big_dot", "M=16", arch)]["error"]
    assert err.count("FAILED") == 4


def test_occupancy_rules():
    assert blocks_per_sm(32, 4, 0, 90) == 16  # 64 warps per SM
    assert blocks_per_sm(255, 4, 0, 90) == 2  # 8 192 registers per warp: 8 warps
    assert blocks_per_sm(128, 16, 0, 80) == 1  # 512 threads x 128 = all 65 536 registers
    assert blocks_per_sm(129, 16, 0, 80) == 0  # one register more per thread: no block fits
    assert blocks_per_sm(32, 4, 100 * 1024, 80) == 1 and blocks_per_sm(32, 4, 100 * 1024, 90) == 2
    assert blocks_per_sm(16, 1, 0, 90) == 32  # the 32-block limit


def test_the_command_refuses_the_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-m", "devtools.kernels.aot", "--subset"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "TRITON_INTERPRET" in res.stderr
