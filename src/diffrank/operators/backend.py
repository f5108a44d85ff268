"""Which implementation an operator runs: ``operator.backend: auto | torch | triton``.

``auto`` runs the Triton kernels (``src/diffrank/kernels/``, installed as ``diffrank.kernels``) on CUDA inputs and the
PyTorch path elsewhere, and falls back to the PyTorch path for a configuration whose kernels fail to compile
or launch (:func:`guarded_call`, warning once); ``triton`` forces the kernels (on the CPU only under
``TRITON_INTERPRET=1``, which the tests use) and raises on a failure; ``torch`` never uses them. Operators
call :func:`check_backend` in ``__init__`` and :func:`use_triton` per call;
:class:`~diffrank.operators.base.RankingOperator` runs its hooks through :func:`guarded_call`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import traceback
import warnings
from collections.abc import Callable

import torch
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


# configurations whose kernels compiled and ran forward (and backward, when the value is True) under "auto"
_VERIFIED: dict[tuple, bool] = {}
# configurations whose kernels raised under "auto": they run the PyTorch path from then on
_FALLBACK: dict[tuple, str] = {}


def guarded_call(op, hook: Callable[..., Tensor], x: Tensor, *args) -> Tensor:
    """``hook(x, *args)`` of an operator, with the PyTorch path as a fallback when its Triton kernels fail.

    With ``op.backend == "auto"`` on a CUDA input, the first call of each configuration (operator settings
    without β, method, n, dtype, device, the other arguments) first runs the hook on a detached copy of ``x``
    forward and backward, so that every kernel of the configuration compiles and launches once. If that (or
    a later call) raises, the configuration is recorded, a ``RuntimeWarning`` names the kernel, the
    configuration and the error (once per configuration), and the hook runs with ``op.backend = "torch"``
    for this and every later call of the configuration. ``backend="triton"`` and ``"torch"`` call the hook
    directly: a kernel failure raises under ``"triton"``, and ``"torch"`` never reaches a kernel.

    Args:
        op: the operator (an object with a ``backend`` attribute; ``extra_repr`` names its settings).
        hook: its bound hook, e.g. ``op._permutation``.
        x: ``(B, n)`` validated scores in their compute dtype.
        *args: the hook's other arguments (``k``, ``ks``).

    Returns:
        What the hook returns (the kernels' result, or the PyTorch path's after a failure).

    Raises:
        Whatever the hook raises outside ``"auto"`` on CUDA; ``torch.OutOfMemoryError`` always (the PyTorch
        path would not fit either), and the operators' own ``ValueError`` / ``TypeError`` (bad input, a β out
        of range), which the PyTorch path would raise too.
    """
    if getattr(op, "backend", None) != "auto" or not use_triton("auto", x):
        return hook(x, *args)
    key = _config_key(op, hook, x, args)
    if key in _FALLBACK:
        return _with_torch(op, hook, x, args)
    backward = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    try:
        if not _VERIFIED.get(key, False) and (key not in _VERIFIED or backward):
            _probe(hook, x, args, backward)
            _VERIFIED[key] = backward
        return hook(x, *args)
    except (torch.OutOfMemoryError, ValueError, TypeError):
        raise  # out of memory on either path; the operator's own input and range errors are not kernel failures
    except Exception as e:  # noqa: BLE001 - any kernel failure: the PyTorch path computes the same result
        _FALLBACK[key] = f"{type(e).__name__}: {e}"
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        warnings.warn(f"backend='auto': the Triton kernel {_kernel_name(e)} failed for {_describe(key)} "
                      f"({type(e).__name__}: {first[:300]}); this configuration runs the PyTorch path from now on "
                      "(backend='triton' raises instead)", RuntimeWarning, stacklevel=3)
        return _with_torch(op, hook, x, args)


def _probe(hook: Callable[..., Tensor], x: Tensor, args: tuple, backward: bool) -> None:
    """Run the hook once on a detached copy of ``x`` (and its backward, with ``backward``): compiles the kernels."""
    with torch.enable_grad() if backward else torch.no_grad():
        xp = x.detach().requires_grad_(backward)
        out = hook(xp, *args)
        if backward and out.requires_grad:
            torch.autograd.grad(out, xp, torch.ones_like(out))


def _with_torch(op, hook: Callable[..., Tensor], x: Tensor, args: tuple) -> Tensor:
    """The hook with ``op.backend`` set to ``"torch"`` for the call."""
    op.backend = "torch"
    try:
        return hook(x, *args)
    finally:
        op.backend = "auto"


def _config_key(op, hook: Callable[..., Tensor], x: Tensor, args: tuple) -> tuple:
    """What selects the compiled kernels of a call: the operator's settings but β, the hook, n, dtype, device
    and the other arguments (tensors by shape and dtype)."""
    settings = re.sub(r"beta=[^,]*(, )?", "", op.extra_repr())
    rest = tuple((tuple(a.shape), a.dtype) if isinstance(a, Tensor) else repr(a) for a in args)
    return type(op).__name__, settings, getattr(hook, "__name__", str(hook)), x.shape[1], x.dtype, str(x.device), rest


def _describe(key: tuple) -> str:
    name, settings, hook, n, dtype, device, rest = key
    args = ", ".join(str(a) for a in rest)
    return f"{name}({settings}).{hook} n={n} {str(dtype).replace('torch.', '')} on {device}" + \
        (f" args ({args})" if args else "")


def _kernel_name(error: BaseException) -> str:
    """The innermost ``@triton.jit`` function in the error's traceback (``"?"`` when none is found)."""
    name = "?"
    for frame, _ in traceback.walk_tb(error.__traceback__):
        fn = getattr(frame.f_locals.get("self"), "fn", None)
        if "triton" in frame.f_code.co_filename and callable(fn) and hasattr(fn, "__name__"):
            name = fn.__name__
    return name
