"""Which implementation an operator runs: ``operator.backend: auto | torch | triton``.

``auto`` runs the Triton kernels (``kernels/``, installed as ``diffrank.kernels``) on CUDA inputs and the
PyTorch path elsewhere; ``triton`` forces the kernels (on the CPU only under ``TRITON_INTERPRET=1``, which
the tests use); ``torch`` never uses them. Operators call :func:`check_backend` in ``__init__`` and
:func:`use_triton` per call.
"""

from __future__ import annotations

import importlib.util
import os

from torch import Tensor

BACKENDS = ("auto", "torch", "triton")


def check_backend(backend: str) -> str:
    """Validate a backend name.

    Args:
        backend: ``"auto"``, ``"torch"`` or ``"triton"``.

    Returns:
        ``backend`` unchanged.

    Raises:
        ValueError: for any other name, or ``"triton"`` when the ``triton`` package is not installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        raise ValueError("backend='triton' needs the triton package (pip install triton); use backend='auto'")
    return backend


def use_triton(backend: str, x: Tensor) -> bool:
    """Whether this call runs the Triton kernel.

    Args:
        backend: a name accepted by :func:`check_backend`.
        x: the operator's input (its device decides ``auto``).

    Returns:
        ``True`` for ``"triton"``; for ``"auto"``, ``True`` when ``x`` is on CUDA and triton is installed.

    Raises:
        RuntimeError: ``"triton"`` on a CPU tensor without ``TRITON_INTERPRET=1`` (Triton compiles for GPUs).
    """
    if backend == "torch":
        return False
    if backend == "triton":
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("backend='triton' on a CPU tensor needs TRITON_INTERPRET=1 (the Triton "
                               "interpreter); use backend='auto' to run PyTorch on the CPU")
        return True
    return x.is_cuda and _triton_installed()


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None
