"""The facts a record keeps besides the metrics and the config: git state, package versions, and the compute
environment that decides the bits (CPU, instruction set, threads, the determinism switches)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("torch", "lightning", "hydra-core", "torchmetrics", "timm", "numpy", "diffrank")


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """``{"git_sha": str | None, "git_dirty": bool | None}`` of the repository holding ``cwd``."""
    cwd = str(cwd or Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                    capture_output=True, text=True, timeout=10, check=True).stdout.strip())
        return {"git_sha": sha, "git_dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide a result."""
    out: dict[str, str | None] = {}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    out["python"] = platform.python_version()
    return out


# Environment variables that change which kernels run, or how many threads split a reduction.
COMPUTE_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR",
               "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "DIFFRANK_NATIVE_ISA", "CUBLAS_WORKSPACE_CONFIG",
               "CUDA_VISIBLE_DEVICES",
               "NVIDIA_TF32_OVERRIDE", "TORCH_CUDNN_V8_API_DISABLED")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _build_versions() -> dict[str, str | None]:
    """oneDNN, MKL and OpenMP versions and the BLAS that this PyTorch build was compiled with."""
    show = torch.__config__.show()
    found = {
        "onednn": re.search(r"(?:MKL-DNN|oneDNN) v([0-9][\w.]*)", show),
        "mkl": re.search(r"Math Kernel Library Version ([0-9][\w.]*)", show),
        "openmp": re.search(r"OpenMP (\d+)", show),
        "blas": re.search(r"BLAS_INFO=(\w+)", show),
    }
    return {k: m.group(1) if m else None for k, m in found.items()}


def compute_environment() -> dict[str, Any]:
    """What decides the bits of a run besides the code and the config.

    CPU model, the instruction set PyTorch's CPU kernels dispatch to (``cpu_capability``: DEFAULT, AVX2,
    AVX512, …), intra-op and inter-op thread counts and the environment variables that set them,
    the torch / CUDA / cuDNN / oneDNN / MKL versions, the CUDA devices, and the determinism switches
    (``torch.use_deterministic_algorithms``, cuDNN's deterministic / benchmark, TF32, matmul precision).
    Runs that differ in any of these may differ in the last bits, and training amplifies that.
    """
    cuda = torch.cuda.is_available()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        affinity = os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "env": {k: os.environ.get(k) for k in COMPUTE_ENV if k in os.environ},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **_build_versions(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
        "cuda_devices": [{"name": torch.cuda.get_device_name(i),
                          "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
                         for i in range(torch.cuda.device_count())] if cuda else [],
        "deterministic": {
            "algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        },
    }


def device_description(env: dict[str, Any] | None = None) -> str:
    """One line: the CUDA device, or the CPU model, its dispatched instruction set and the thread count."""
    env = env or compute_environment()
    if env["cuda_devices"]:
        d = env["cuda_devices"][0]
        return f"{d['name']} (CUDA {env['cuda']}, cuDNN {env['cudnn']})"
    n = env["num_threads"]
    return f"cpu ({env['cpu_model']}, {env['cpu_capability']}, {n} thread{'' if n == 1 else 's'})"
