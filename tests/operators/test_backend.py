"""``operator.backend`` for every operator config that has it (the config folder is the registry)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import yaml

from diffrank.operators.backend import check_backend, use_triton
from helpers import CONFIGS, options
from helpers import load_deterministic as load  # stochastic operators without noise (helpers)

WITH_BACKEND = [n for n in options("operator")
                if "backend" in yaml.safe_load((CONFIGS / "operator" / f"{n}.yaml").read_text(encoding="utf-8"))]


def test_every_kernel_operator_has_the_key():
    assert {"neuralsort", "softsort", "sinkhorn", "lapsum", "soft_topk", "diffsort_odd_even", "diffsort_bitonic",
            "difftopk_bitonic", "difftopk_splitter"} <= set(WITH_BACKEND)


@pytest.mark.parametrize("name", WITH_BACKEND)
def test_unknown_backend_raises(name):
    with pytest.raises(ValueError, match="backend must be one of"):
        load(name, backend="bogus")


@pytest.mark.parametrize("name", WITH_BACKEND)
def test_triton_on_cpu_without_the_interpreter_raises(name, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    op = load(name, backend="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        _objective(op)(torch.randn(2, 6))


def test_the_decision():
    x = torch.zeros(2)
    assert not use_triton("torch", x) and not use_triton("auto", x)  # auto: PyTorch off CUDA
    assert check_backend("auto") == "auto"


# -- backend="auto" falls back to the PyTorch path when a kernel fails (injected on the CPU) ------------------

KERNEL_MODULES = ("neuralsort", "softsort", "lapsum", "soft_topk", "sinkhorn", "sorting_network", "fast_soft_sort",
                  "sparse_soft_topk")
# the failures are injected into the interpreter's launches (CPU tensors); a CUDA machine runs compiled kernels
INTERPRETED = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="injects into the interpreter")


def _compile_error(name: str) -> Exception:
    from triton.compiler.errors import CompilationError

    return CompilationError(None, None, f"injected: {name} does not compile")


def _out_of_resources(name: str) -> Exception:
    from triton.runtime.errors import OutOfResources

    return OutOfResources(300 * 1024, 227 * 1024, "shared memory")


@pytest.fixture
def auto_on_cpu(monkeypatch):
    """``auto`` picks the kernels on CPU tensors too (the interpreter runs them), with a fresh fallback record."""
    import importlib

    from diffrank.operators import backend

    fake = lambda b, x: b != "torch"  # noqa: E731
    monkeypatch.setattr(backend, "use_triton", fake)
    for name in KERNEL_MODULES:
        monkeypatch.setattr(importlib.import_module(f"diffrank.operators.{name}"), "use_triton", fake)
    monkeypatch.setattr(backend, "_VERIFIED", {})
    monkeypatch.setattr(backend, "_FALLBACK", {})


@pytest.fixture
def broken_kernels(monkeypatch):
    """``break_(names, error)``: launching a kernel whose name is in ``names`` (all when None) raises ``error``;
    returns the list of launches attempted (kernel names)."""
    from triton.runtime.interpreter import InterpretedFunction

    tried: list[str] = []
    run = InterpretedFunction.run

    def break_(names=None, error=_compile_error):
        def failing(self, *args, **kwargs):
            tried.append(self.fn.__name__)
            if names is None or self.fn.__name__ in names:
                raise error(self.fn.__name__)
            return run(self, *args, **kwargs)

        monkeypatch.setattr(InterpretedFunction, "run", failing)
        return tried

    return break_


def _objective(op):
    """The top-2 membership, or the soft ranks of an operator without top-k (fast soft sort)."""
    if "topk_membership" in op.capabilities:
        return lambda x: op.topk_membership(x, [2])
    return op.soft_rank


def _membership(op, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-2 memberships (soft ranks: :func:`_objective`) and ∂Σ(w ⊙ m)/∂x (fixed weights w)."""
    x = x.clone().requires_grad_()
    m = _objective(op)(x)
    w = torch.linspace(-1, 1, m.numel()).view_as(m)
    (m * w).sum().backward()
    return m.detach(), x.grad


@pytest.mark.triton
@INTERPRETED
@pytest.mark.parametrize("error", [_compile_error, _out_of_resources])
@pytest.mark.parametrize("name", WITH_BACKEND)
def test_auto_warns_once_and_runs_pytorch_when_a_kernel_fails(name, error, auto_on_cpu, broken_kernels):
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    want = _membership(load(name, backend="torch"), x)
    tried = broken_kernels(error=error)
    op = load(name, backend="auto")
    with pytest.warns(RuntimeWarning, match=r"backend='auto': the Triton kernel _\w+ failed for .*n=6") as record:
        got = _membership(op, x)
        again = _membership(op, x)
    assert tried, "no kernel was reached: the test injected nothing"
    assert len([w for w in record if "backend='auto'" in str(w.message)]) == 1
    assert op.backend == "auto"
    for g in (got, again):
        torch.testing.assert_close(g[0], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g[1], want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.triton
@INTERPRETED
def test_a_backward_kernel_that_fails_is_found_before_the_step(auto_on_cpu, broken_kernels):
    """The first call of a configuration runs forward and backward once: a backward kernel that does not compile
    falls back before the caller's forward, so the caller's backward never meets it."""
    from diffrank.operators.softsort import SoftSort

    x = torch.randn(2, 9, generator=torch.Generator().manual_seed(1))
    want = _membership(SoftSort(beta=2.0, backend="torch"), x)
    tried = broken_kernels({"_softsort_bwd_items"})
    with pytest.warns(RuntimeWarning, match="_softsort_bwd_items") as record:
        got = _membership(SoftSort(beta=2.0, backend="auto"), x)
    assert "_softsort_bwd_items" in tried and len(record) == 1
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.triton
@INTERPRETED
def test_each_configuration_is_probed_and_recorded_separately(auto_on_cpu, broken_kernels):
    from diffrank.operators.neuralsort import NeuralSort

    op = NeuralSort(beta=1.0, backend="auto")
    tried = broken_kernels({"_neuralsort_fwd"})
    with pytest.warns(RuntimeWarning) as record:
        for n in (5, 5, 7, 7):
            _membership(op, torch.randn(2, n))
    assert [str(w.message).count("n=5") + 2 * str(w.message).count("n=7") for w in record] == [1, 2]
    before = len(tried)
    _membership(op, torch.randn(2, 5))
    assert len(tried) == before  # recorded: the kernel is not tried again


@pytest.mark.triton
@INTERPRETED
def test_triton_backend_still_raises(broken_kernels):
    from triton.compiler.errors import CompilationError

    from diffrank.operators.lapsum import LapSum

    broken_kernels()
    with pytest.raises(CompilationError, match="injected"):
        LapSum(beta=1.0, backend="triton").soft_rank(torch.randn(2, 5))


@pytest.mark.parametrize("name", WITH_BACKEND)
def test_torch_backend_never_reaches_a_kernel(name, auto_on_cpu, broken_kernels):
    tried = broken_kernels()
    _membership(load(name, backend="torch"), torch.randn(2, 6))
    assert tried == []


def test_torch_backend_never_imports_triton():
    """Every operator config with a backend, forward and backward with ``backend="torch"``, in a fresh process."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from diffrank.operators import load\n"
        f"for name in {WITH_BACKEND!r}:\n"
        "    x = torch.randn(3, 6, requires_grad=True)\n"
        "    op = load(name, backend='torch')\n"
        "    f = (lambda s: op.topk_membership(s, [2])) if 'topk_membership' in op.capabilities else op.soft_rank\n"
        "    f(x).sum().backward()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' or 'kernels' in m))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.triton
@INTERPRETED
def test_auto_does_not_mistake_an_input_error_for_a_kernel_failure(auto_on_cpu, broken_kernels):
    """A β beyond float32's range is the operator's ValueError on every path: raised, no fallback warning."""
    broken_kernels(error=_compile_error)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="out of float32's range"):
            load("sinkhorn", backend="auto", beta=1e9)(torch.randn(2, 6))
