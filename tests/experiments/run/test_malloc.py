"""keep_freed_memory: after it, re-allocating a large buffer re-uses pages instead of faulting in new ones.

The heap takes a few allocations to settle: PyTorch's aligned allocations leave the freed block a little too
small for the next one at first, so the steady state is what is asserted.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# run in a child process: mallopt changes the allocator of the whole process
_CHILD = """
import resource, sys
import torch
from diffrank.experiments.run.malloc import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "on" else None
for _ in range(12):  # 64 MiB blocks; glibc's heap settles after a few (alignment padding), not counted
    torch.empty(16 << 20, dtype=torch.float32).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.empty(16 << 20, dtype=torch.float32).fill_(1.0)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True)
    applied, faults = out.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_keep_freed_memory_stops_page_faults_on_reallocation():
    applied, faults_on = _faults("on")
    if applied != "True":
        pytest.skip("C library is not glibc")
    _, faults_off = _faults("off")
    pages = (64 << 20) // 4096
    assert faults_off > 2 * pages, "glibc's default should mmap/munmap a 64 MiB block on every allocation"
    assert faults_on < pages // 4, f"{faults_on} page faults for 5 re-allocations of a kept 64 MiB block (steady state)"


@pytest.mark.parametrize(("accelerator", "expected"), [("cpu", True), ("gpu", False)])
def test_process_settings_apply_the_malloc_switch_to_cpu_runs_only(monkeypatch, accelerator, expected):
    import warnings

    from omegaconf import OmegaConf

    import diffrank.experiments.run.process as process

    calls = []
    monkeypatch.setattr(process, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = OmegaConf.create({"extras": {"keep_freed_memory": True, "ignore_warnings": False},
                            "trainer": {"accelerator": accelerator}})
    with warnings.catch_warnings():
        applied = process.apply_process_settings(cfg)
        filters = list(warnings.filters)
    assert applied == {"ignore_warnings": False, "keep_freed_memory": expected}
    assert len(calls) == int(expected)
    assert ("ignore", None, Warning, None, 0) not in filters


def test_train_itself_changes_no_process_setting(compose_train, monkeypatch):
    """train() is a library function: no warning filter, no malloc switch (only the script entry applies them)."""
    import warnings

    import diffrank.experiments.run.process as process
    import diffrank.experiments.run.train as train_mod

    calls = []
    monkeypatch.setattr(process, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = compose_train(["extras.ignore_warnings=true"])
    with warnings.catch_warnings():
        before = list(warnings.filters)
        train_mod.train(cfg)
        after = list(warnings.filters)
    assert calls == [] and after == before
