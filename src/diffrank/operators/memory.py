"""The memory check of the operators that form rows of the relaxed permutation matrix: refuse, before allocating,
a call whose ``(B, m, n)`` buffers cannot fit, and name the methods that need none.

A relaxed permutation matrix P (Sinkhorn, the sorting networks, the relaxed bubble sort, the top-k of NeuralSort and
SoftSort, and every ``permutation`` call; NeuralSort's and SoftSort's soft sort / soft rank stream P's rows in chunks
instead, :mod:`diffrank.operators.streaming`) has ``m × n`` entries per set (``m = n``, or ``k`` rows for a top-k): at
n = 30 000 one float32 P is 3.6 GB, and its hook holds several such buffers at once. Without a check the allocation
fails with torch's bare ``can't allocate … bytes``, or, where the kernel overcommits memory, the process is killed
by the OOM killer with no message (``F.soft_rank(torch.randn(1, 30000), method="neuralsort")`` under a 2 GB limit,
before it streamed).

**The limit.** ``DIFFRANK_MAX_DENSE_BYTES`` (bytes, optionally with a binary suffix ``K``, ``M``, ``G``, ``T``,
e.g. ``8G`` or ``512MiB``; ``inf`` turns the check off) when set; otherwise the memory the device has left:

- CPU: the least of ``MemAvailable`` (``/proc/meminfo``), the memory cgroup's limit minus its usage (cgroup v2
  ``memory.max`` − ``memory.current``, v1 ``memory.limit_in_bytes`` − ``memory.usage_in_bytes``; of the process's
  own cgroup, the path ``/proc/self/cgroup`` gives, and of every cgroup above it: the least) and the address
  space left under ``ulimit -v`` (``RLIMIT_AS`` − ``VmSize``); none readable (not Linux): no check;
- CUDA: ``torch.cuda.mem_get_info``'s free bytes plus what PyTorch's caching allocator holds unused;
- other devices: no check.

A call is refused when :data:`DENSE_BUFFERS` = 3 of its buffers exceed the limit: a lower bound of what the hooks
hold at their peak (measured as the growth of the peak resident memory at n = 4 000, B = 1, float32, in units of
one ``n × n`` buffer: NeuralSort 3.1, SoftSort 3.1 (4.1 with a backward), Sinkhorn 4.2 without a backward, far
more with one, whose iterations autograd keeps), so a refused call certainly does not fit, while one that passes
may still be close. Calls whose buffers are below :data:`CHECK_FROM_BYTES` in total are not
checked at all (nothing is read: no cost at the sizes of a training step), whatever the limit. Under
``torch.compile`` no check runs (it would add shape guards).
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path

import torch

ENV = "DIFFRANK_MAX_DENSE_BYTES"
DENSE_BUFFERS = 3
CHECK_FROM_BYTES = 256 * 2**20

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class DenseMemoryError(MemoryError):
    """A call whose ``(B, m, n)`` buffers do not fit the limit (:mod:`diffrank.operators.memory`); the message names
    the sizes, the limit and where it comes from, and the methods that need no such buffer."""


@functools.lru_cache(maxsize=16)
def parse_bytes(text: str) -> float:
    """``DIFFRANK_MAX_DENSE_BYTES``'s value in bytes: ``"1073741824"``, ``"8G"``, ``"512MiB"``, ``"1.5GB"`` (binary
    units either way) or ``"inf"``.

    Raises:
        ValueError: anything else (the message names the variable).
    """
    s = text.strip()
    if s.lower() in ("inf", "none", "off"):
        return math.inf
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?", s, flags=re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{ENV}={text!r}: expected a positive number of bytes, optionally with K, M, G or T "
                         "(binary: 8G = 8 GiB), or 'inf' to turn the memory check off")
    return float(m.group(1)) * _UNITS[m.group(2).upper()]


def low_memory_methods() -> dict[str, tuple[str, ...]]:
    """Capability → the operator configs whose hook of it forms no ``(B, m, n)`` buffer (O(n log n) time, O(n)
    memory per set), sorted: the configs whose class sets ``low_memory = True`` (fast soft sort: Blondel et al. 2020,
    §5, PAV; LapSum: Struski et al. 2025, §3, sort + prefix sums; sparse soft top-k: Sander et al. 2023, PAV; DFTopK:
    one top-(k+1) and a sigmoid per item; SOFT top-k: Xie et al. 2020, Eq. 4, transport onto two anchors, O(n) per
    Sinkhorn iteration), for each capability of the class but the permutation. Read from the configs when a call is
    refused; tests/operators/test_memory.py checks that the methods named form no such buffer."""
    from diffrank.registry import list_options, load_yaml, locate

    out: dict[str, list[str]] = {}
    for name in list_options("operator"):
        cls = locate(load_yaml("operator", name)["_target_"])
        if getattr(cls, "low_memory", False):
            for capability in sorted(set(cls.capabilities) - {"permutation"}):
                out.setdefault(capability, []).append(name)
    return {capability: tuple(names) for capability, names in out.items()}


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no cgroup limit) and unreadable values: none


PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_NO_LIMIT = 2**60  # cgroup v1 writes ~2^63 (rounded to a page) for "no limit"


def _cgroup_chain(root: Path, rel: str) -> list[Path]:
    """The folders of the cgroup ``rel`` (the path ``/proc/self/cgroup`` gives) under the hierarchy mounted at
    ``root``, from the process's own cgroup up to ``root``; only those that exist (inside a container the mount's
    root may be the container's own cgroup, so the deeper folders of ``rel`` are not there)."""
    parts = [p for p in rel.strip().split("/") if p and p != "."]
    chain = [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [c for c in chain if c.is_dir()]


def _cgroup_left(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int | None:
    """The least memory limit minus usage (bytes) over the calling process's memory cgroup and its ancestors
    (a limit on a parent caps its children), cgroup v2 and v1 alike, or None without a limit.

    cgroup v2 (the line ``0::<path>``): ``memory.max`` − ``memory.current`` of ``<root>/<path>`` and each folder
    above it (``<root>/unified`` on a hybrid system); cgroup v1 (the line naming the ``memory`` controller):
    ``memory.limit_in_bytes`` − ``memory.usage_in_bytes`` under ``<root>/memory`` likewise. ``"max"`` (v2) and
    ~2^63 (v1) mean no limit at that level.

    Args:
        proc_cgroup: the file listing the process's cgroups (``/proc/self/cgroup``; a test passes a fake one).
        root: where the cgroup hierarchies are mounted (``/sys/fs/cgroup``).
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    left: list[int] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, rel = fields
        if controllers == "":  # cgroup v2: "0::/path"
            mount = root if (root / "cgroup.controllers").is_file() or not (root / "unified").is_dir() \
                else root / "unified"
            names, no_limit = ("memory.max", "memory.current"), None
        elif "memory" in controllers.split(","):
            mount, names, no_limit = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes"), _V1_NO_LIMIT
        else:
            continue
        for folder in _cgroup_chain(mount, rel):
            limit, used = _read_int(folder / names[0]), _read_int(folder / names[1])
            if limit is not None and used is not None and (no_limit is None or limit < no_limit):
                left.append(limit - used)
    return min(left) if left else None


def _address_space_left() -> int | None:
    """``RLIMIT_AS`` minus the current virtual size (``ulimit -v``), or None without that limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return soft - int(line.split()[1]) * 1024
    except (ImportError, OSError, ValueError):
        return None
    return None


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def available_bytes(device: torch.device) -> int | None:
    """The memory ``device`` has left for new buffers (module docstring, "The limit"), or None where it cannot be
    read (then nothing is refused).

    Args:
        device: where the buffers would live.

    Returns:
        Bytes (may be <= 0 when a limit is already exceeded), or None.
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return None
    known = [v for v in (_mem_available(), _cgroup_left(), _address_space_left()) if v is not None]
    return min(known) if known else None


def _fmt(nbytes: float) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = 2 ** (10 * ("KMGT".index(unit[0]) + 1))
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"


def check_dense(owner: str, method: str, batch: int, rows: int, n: int, dtype: torch.dtype,
                device: torch.device) -> None:
    """Refuse a call whose :data:`DENSE_BUFFERS` ``(batch, rows, n)`` buffers of ``dtype`` exceed the limit
    (module docstring), before anything is allocated.

    Args:
        owner: the operator's class name, for the message.
        method: ``"forward"`` (the permutation), ``"topk_membership"``, ``"soft_sort"`` or ``"soft_rank"``.
        batch, rows, n: the buffer's shape (B, m, n): m = n, or k rows.
        dtype: the compute dtype (float32 for half-precision scores).
        device: the scores' device.

    Raises:
        DenseMemoryError: the buffers do not fit; the message names their size, the limit and its source, the
            O(n log n) methods of ``method`` and how to change the limit.
        ValueError: a malformed ``DIFFRANK_MAX_DENSE_BYTES``.
    """
    need = DENSE_BUFFERS * batch * rows * n * dtype.itemsize
    if need < CHECK_FROM_BYTES:  # the sizes of a training step: nothing read
        return
    env = os.environ.get(ENV)
    limit = parse_bytes(env) if env else None
    if limit is not None:
        source = f"limit set by {ENV}={env}"
    else:
        left = available_bytes(device)
        if left is None:
            return
        limit, source = max(left, 0), f"memory left on {device} (free memory, cgroup and ulimit -v limits)"
    if need <= limit:
        return
    low_memory = low_memory_methods()
    cheap = low_memory.get(method)
    instead = (f"the methods that form no n x n matrix for {method}, O(n log n) time and O(n) memory per set: "
               f"{', '.join(cheap)}" if cheap else
               "P itself has that many entries: ask for its top k rows only (k=...), or for topk_membership / "
               f"soft_sort / soft_rank of {', '.join(low_memory['soft_rank'])}")
    raise DenseMemoryError(
        f"{owner}.{method} on {batch} set(s) of n = {n} items forms (B, m, n) = ({batch}, {rows}, {n}) {dtype} "
        f"buffers of {_fmt(need / DENSE_BUFFERS)} each (at least {DENSE_BUFFERS} at once: {_fmt(need)}), more "
        f"than the {_fmt(limit)} {source}. Use {instead}; or split the batch; or set {ENV}=<bytes> (e.g. 64G, "
        "or inf to turn this check off)")
