"""The memory check of the operators that form rows of P (diffrank.operators.memory): a call whose (B, m, n)
buffers cannot fit is refused before anything is allocated, with a message naming the O(n log n) methods; the
methods it names form no such buffer; small calls read nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import diffrank.functional as F
from diffrank.operators import available, load, memory
from diffrank.operators.base import PERMUTATION
from diffrank.operators.memory import ENV, DenseMemoryError, low_memory_methods, parse_bytes
from helpers import ROOT


def test_a_dense_soft_rank_of_30000_items_is_refused_under_the_limit(monkeypatch):
    """A soft rank built from P at n = 30 000 under a 2 GB limit (F.soft_rank(torch.randn(1, 30000),
    method="neuralsort") was killed by the OOM killer, rc 137, with no message, before NeuralSort streamed it) is
    refused before allocating, naming sizes, limit and methods."""
    monkeypatch.setenv(ENV, "2G")
    with pytest.raises(DenseMemoryError) as e:
        F.soft_rank(torch.randn(1, 30000), method="relaxed_bubble_sort")
    msg = str(e.value)
    assert "RelaxedBubbleSort.soft_rank" in msg and "(1, 30000, 30000)" in msg and "3.4 GiB" in msg
    assert "2.0 GiB limit set by DIFFRANK_MAX_DENSE_BYTES=2G" in msg
    assert "fast_soft_sort, lapsum" in msg and "O(n log n)" in msg
    assert isinstance(e.value, MemoryError)
    # the O(n log n) method it names runs at that size
    assert F.soft_rank(torch.randn(1, 30000), method="lapsum").shape == (1, 30000)


def test_every_dense_path_is_refused_and_the_cheap_ones_are_not(monkeypatch):
    """Every capability that forms rows of P is refused at n = 30 000 under a 1 GiB limit (Sinkhorn even for the top
    k rows: its plan is n x n); a top-k of k = 5 rows of a k-row operator fits; the methods the messages name form
    no (B, m, n) buffer for that capability (the classes' low_memory flags are checked here)."""
    monkeypatch.setenv(ENV, "1G")
    x = torch.randn(1, 30000)
    assert load("sinkhorn")._dense_rows(PERMUTATION, 30000, 5) == 30000
    for name, method, args in (("sinkhorn", "forward", (5,)), ("softsort", "forward", ()),
                               ("neuralsort", "topk_membership", ([20000],)),
                               ("diffsort_bitonic", "topk_membership", ([20000],)),
                               ("relaxed_bubble_sort", "soft_rank", ())):
        op = load(name)
        with pytest.raises(DenseMemoryError, match=f"{type(op).__name__}.{method} on 1 set"):
            (op if method == "forward" else getattr(op, method))(x, *args)
    assert load("softsort")(x, 5).shape == (1, 5, 30000)  # 5 rows of 30 000: 1.1 MB
    # their soft sort / soft rank stream P's rows in chunks (tests/operators/test_streaming_dense.py)
    assert load("softsort")._dense_rows("soft_sort", 30000, None) is None
    assert load("neuralsort")._dense_rows("soft_rank", 30000, None) is None
    ops = {name: load(name) for name in available()}
    low_memory = low_memory_methods()
    assert low_memory == {"soft_sort": ("fast_soft_sort", "lapsum"), "soft_rank": ("fast_soft_sort", "lapsum"),
                          "topk_membership": ("dftopk", "lapsum", "soft_topk", "sparse_soft_topk")}
    for capability, names in low_memory.items():
        for name in names:
            assert capability in ops[name].capabilities, (capability, name)
            assert ops[name]._dense_rows(capability, 30000, [5]) is None, (capability, name)


def test_small_calls_read_nothing_and_the_limit_parses(monkeypatch):
    """Below 256 MiB of buffers no limit is read (no cost at the sizes of a training step), whatever the variable
    says; the variable takes bytes with binary suffixes or 'inf', and names itself when malformed."""
    def fail(_device):
        raise AssertionError("read the available memory for a small call")

    monkeypatch.setattr(memory, "available_bytes", fail)
    monkeypatch.setenv(ENV, "1K")
    assert F.soft_rank(torch.randn(64, 100), method="neuralsort").shape == (64, 100)
    assert parse_bytes("8G") == 8 * 2**30 and parse_bytes("512MiB") == 512 * 2**20 and parse_bytes("100") == 100
    assert parse_bytes("inf") == float("inf")
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(ValueError, match="DIFFRANK_MAX_DENSE_BYTES='lots'"):
        F.soft_rank(torch.randn(1, 30000), method="relaxed_bubble_sort")


def test_without_the_variable_the_limit_is_the_memory_left(monkeypatch):
    """No variable: the memory left on the device is the limit (here a machine with 2 GiB available)."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(memory, "_mem_available", lambda: 2 * 2**30)
    monkeypatch.setattr(memory, "_cgroup_left", lambda: None)
    monkeypatch.setattr(memory, "_address_space_left", lambda: None)
    with pytest.raises(DenseMemoryError, match=r"more than the 2.0 GiB memory left on cpu"):
        F.soft_rank(torch.randn(1, 30000), method="relaxed_bubble_sort")
    monkeypatch.setattr(memory, "_mem_available", lambda: None)  # nothing readable: no check
    assert memory.available_bytes(torch.device("cpu")) is None


def test_on_cuda_the_limit_is_the_free_memory_plus_the_unused_cache(monkeypatch):
    """The CUDA branch (no GPU needed: torch.cuda's readers stubbed): free bytes plus reserved-but-unallocated."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 2 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2**30)
    cuda = torch.device("cuda", 0)
    assert memory.available_bytes(cuda) == 4 * 2**30
    with pytest.raises(DenseMemoryError, match=r"more than the 4.0 GiB memory left on cuda:0.*fast_soft_sort, lapsum"):
        memory.check_dense("NeuralSort", "soft_rank", 1, 30000, 30000, torch.float32, cuda)
    memory.check_dense("NeuralSort", "soft_rank", 1, 10000, 10000, torch.float32, cuda)  # 1.1 GiB: fits


@pytest.mark.slow  # ~6 s: a fresh interpreter imports torch
def test_under_a_ulimit_the_call_is_refused_not_killed():
    """The same command in a process whose address space is limited to 2 GiB beyond what it maps (ulimit -v):
    refused with the message. Before, the same call raised torch's bare "can't allocate" (or, under a cgroup limit,
    was OOM-killed)."""
    code = textwrap.dedent("""
        import os, resource, torch
        import diffrank.functional as F
        from diffrank.operators.memory import DenseMemoryError
        os.environ.pop("DIFFRANK_MAX_DENSE_BYTES", None)
        vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + 2 * 2**30, resource.RLIM_INFINITY))
        try:
            F.soft_rank(torch.randn(1, 30000), method="relaxed_bubble_sort")
        except DenseMemoryError as e:
            print("REFUSED", e)
    """)
    env = {"PYTHONPATH": f"{ROOT / 'src'}", "DIFFRANK_CONFIG_DIR": str(ROOT / "configs"), "OMP_NUM_THREADS": "1",
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "REFUSED RelaxedBubbleSort.soft_rank" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "memory left on cpu" in out.stdout and "fast_soft_sort, lapsum" in out.stdout


def _cgroup_files(folder, **values):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (folder / name.replace("_", ".", 1)).write_text(f"{value}\n")


def test_the_cgroup_limit_is_that_of_the_process_cgroup_and_its_parents(tmp_path):
    """A process in a cgroup-v1 memory cgroup below the root (``echo $$ > /sys/fs/cgroup/memory/t/cgroup.procs``
    with a 2 GiB limit there) was not protected: the root's limit (none) was read. The path /proc/self/cgroup gives
    is followed, and the least limit minus usage over that cgroup and its parents counts (v1 and v2; a hybrid
    system's v2 tree under unified/; a container whose mount root is its own cgroup)."""
    GiB, none = 2**30, 9223372036854771712  # v1's "no limit"
    proc = tmp_path / "cgroup"
    v1 = tmp_path / "v1"
    proc.write_text("9:name=systemd:/\n4:memory:/t/job\n1:cpu:/\n0::/\n")
    _cgroup_files(v1 / "memory", memory_limit_in_bytes=none, memory_usage_in_bytes=30 * GiB)
    _cgroup_files(v1 / "memory" / "t", memory_limit_in_bytes=2 * GiB, memory_usage_in_bytes=GiB // 2)
    _cgroup_files(v1 / "memory" / "t" / "job", memory_limit_in_bytes=none, memory_usage_in_bytes=GiB // 4)
    assert memory._cgroup_left(proc, v1) == 2 * GiB - GiB // 2  # the parent's limit caps the process
    _cgroup_files(v1 / "memory" / "t" / "job", memory_limit_in_bytes=GiB, memory_usage_in_bytes=GiB // 4)
    assert memory._cgroup_left(proc, v1) == GiB - GiB // 4  # the process's own, smaller, limit
    proc.write_text("4:memory:/docker/abc/t\n")  # inside a container: the mount's root is the container's cgroup
    _cgroup_files(v1 / "memory", memory_limit_in_bytes=3 * GiB, memory_usage_in_bytes=GiB)
    assert memory._cgroup_left(proc, v1) == 2 * GiB
    v2 = tmp_path / "v2"
    _cgroup_files(v2, cgroup_controllers="memory")
    _cgroup_files(v2 / "user.slice", memory_max=4 * GiB, memory_current=GiB)
    _cgroup_files(v2 / "user.slice" / "run", memory_max="max", memory_current=GiB)
    proc.write_text("0::/user.slice/run\n")
    assert memory._cgroup_left(proc, v2) == 3 * GiB
    hybrid = tmp_path / "hybrid"
    _cgroup_files(hybrid / "unified" / "user.slice", memory_max=GiB, memory_current=0)
    _cgroup_files(hybrid / "memory")
    assert memory._cgroup_left(proc, hybrid) == GiB
    proc.write_text("0::/\n4:memory:/\n")  # no limit anywhere
    assert memory._cgroup_left(proc, tmp_path / "empty") is None
    assert memory._cgroup_left(tmp_path / "missing", v1) is None
