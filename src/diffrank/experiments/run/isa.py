"""The same bits on every x86-64 CPU: the training entry points cap the instruction set that PyTorch's CPU
libraries dispatch to, before torch is imported.

PyTorch picks its CPU kernels by the CPU's instruction set at run time: ATen's vectorised kernels (and their SLEEF
math) run 512-bit on an AVX-512 CPU and 256-bit on an AVX2 CPU, oneDNN's convolutions likewise, and MKL's GEMM
takes a code path per CPU. Each sums in a different order, so the same run gives other last bits on another CPU,
and training amplifies them (the default run: 99.08 % top-1 at epoch 7 natively on an AVX-512 CPU, 98.60 % at
epoch 6 on an AVX2 CPU). :func:`pin_cpu_isa` sets, unless already set:

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's dispatch (``torch.backends.cpu.get_cpu_capability()``);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's highest instruction set (``DNNL_MAX_CPU_ISA`` is its older name);
- ``MKL_CBWR=AVX2``: MKL's conditional numerical reproducibility, its AVX2 code path on every CPU that has it.

AVX2 is what every x86-64 CPU of the last decade has, so a run gives the same bits on all of them at a given
thread count (``OMP_NUM_THREADS``). Numba's kernels need no pin: without ``fastmath`` LLVM neither reassociates
nor contracts floating-point operations, whatever the vector width. ``DIFFRANK_NATIVE_ISA=1`` turns the pins off
(the CPU's own instruction set: faster on AVX-512, last bits that depend on the CPU); on other architectures
nothing is set. Every run records the variables in ``results.json`` (``compute.env``) and the capability ATen
used (``compute.cpu_capability``).
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping

#: the variables and values :func:`pin_cpu_isa` sets (a value already in the environment wins)
ISA_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
#: set to 1: leave the instruction set to the CPU
NATIVE_ISA_ENV = "DIFFRANK_NATIVE_ISA"


def pin_cpu_isa(environ: MutableMapping[str, str] | None = None, machine: str | None = None) -> dict[str, str]:
    """Set :data:`ISA_PINS` in ``environ`` (default ``os.environ``) where not set, on x86-64 unless
    ``DIFFRANK_NATIVE_ISA=1``. Call it before ``import torch``: ATen, oneDNN and MKL read these once.

    Args:
        environ: the environment to change (default: this process's).
        machine: ``platform.machine()`` by default (``x86_64`` / ``AMD64`` pin; anything else does not).

    Returns:
        The variables this call set (name → value); empty when pinned already, opted out or not x86-64.
    """
    environ = os.environ if environ is None else environ
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64") or environ.get(NATIVE_ISA_ENV, "") not in ("", "0"):
        return {}
    applied = {k: v for k, v in ISA_PINS.items() if k not in environ}
    environ.update(applied)
    return applied


__all__ = ["ISA_PINS", "NATIVE_ISA_ENV", "pin_cpu_isa"]
