"""The listing of every kernel launch (``devtools/kernels/launches.py``) against the kernels and the operators."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from devtools.kernels.launches import SCORE_DTYPES, auto_launches
from diffrank.operators import load
from diffrank.operators.sorting_network import ComparatorNetwork

KERNELS = Path(__file__).resolve().parents[2] / "src" / "diffrank" / "kernels"
OPERATORS = ["neuralsort", "softsort", "lapsum", "soft_topk", "sinkhorn", "diffsort_odd_even", "diffsort_bitonic",
             "difftopk_bitonic", "difftopk_splitter", "fast_soft_sort", "sparse_soft_topk"]


@pytest.fixture(scope="module")
def listed():
    return auto_launches()


def test_every_launched_kernel_is_listed(listed):
    """Every ``kernel[grid](...)`` in ``src/diffrank/kernels/*.py`` is listed: a new kernel fails until listed."""
    launched = set()
    for path in KERNELS.glob("*.py"):
        launched |= set(re.findall(r"\b(_\w+)\[\(", path.read_text()))
    assert launched and launched == {launch.name for launch in listed}


def test_every_dtype_and_both_passes_are_listed(listed):
    names = {launch.name for launch in listed}
    # the networks: float32 only; sparse top-k's PAV: float64 only (the operator solves in float64)
    for name in names - {"_values_fwd", "_values_bwd", "_rows_fwd", "_rows_bwd", "_sparse_pav"}:
        for dt in SCORE_DTYPES:
            ptr = {torch.float32: "*fp32", torch.float64: "*fp64"}[dt]
            assert any(ptr in launch.signature.values() for launch in listed if launch.name == name), (name, dt)
    assert {launch.role for launch in listed} == {"forward", "backward"}
    assert len({launch.key() for launch in listed}) == len(listed)


@pytest.mark.parametrize("value", [1, 2, 16, 37, 4096, 2 ** 31])
def test_integer_specialisation_follows_triton(value):
    """Signature and divisibility hint of an integer argument as Triton's own launcher specialises it."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    from devtools.kernels.launches import _launch
    from diffrank.kernels import softsort

    f32 = torch.float32
    launch = _launch(softsort._softsort_fwd, dict(s_ptr=f32, t_ptr=f32, p_ptr=f32, beta_ptr=f32, n=value, k=3),
                     dict(BLOCK=16, ACC=None), 4, "", "forward")
    kind, hint = native_specialize_impl(make_backend(GPUTarget("cuda", 90, 32)), value, False, True, True)
    i = softsort._softsort_fwd.arg_names.index("n")
    assert launch.signature["n"] == kind
    assert launch.constexprs.get("n") == (1 if kind == "constexpr" else None)
    assert ((i,) in launch.attrs) == (hint == "D")
    pointer = native_specialize_impl(make_backend(GPUTarget("cuda", 90, 32)), torch.empty(4), False, True, True)
    assert launch.signature["s_ptr"] == pointer[0] and ((0,) in launch.attrs) == (pointer[1] == "D")


def _record(monkeypatch) -> list[tuple[str, str]]:
    """Record (kernel, configuration) of every interpreted launch, as :meth:`Launch.config` spells it."""
    from triton.runtime.interpreter import InterpretedFunction

    from devtools.kernels.launches import _launch

    seen: list[tuple[str, str]] = []
    run = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        names = self.arg_names
        spec = {name: (a.dtype if isinstance(a, torch.Tensor) else a) for name, a in zip(names, args)}
        constexprs = {k: v for k, v in kwargs.items() if k in names}
        launch = _launch(self, spec, constexprs, kwargs.get("num_warps", 4), "", "")
        seen.append((launch.name, launch.config()))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording)
    return seen


def _exercise(op, x: torch.Tensor) -> None:
    """Every method the operator has, forward and backward."""
    caps = op.capabilities
    calls = []
    if "permutation" in caps:
        calls += [lambda s: op(s), lambda s: op(s, k=min(2, s.shape[1]))]
    if "topk_membership" in caps:
        calls += [lambda s: op.topk_membership(s, [1, s.shape[1]] if s.shape[1] > 1 else [1])]
    if "soft_sort" in caps:
        calls += [op.soft_sort, op.soft_rank]
    for call in calls:
        s = x.clone().requires_grad_()
        out = call(s)
        if out.requires_grad:  # n = 1: some operators return a constant
            (out * torch.linspace(0, 1, s.shape[1], dtype=s.dtype)).sum().backward()


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="records the interpreter's launches")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sizes", [(1, 3, 20), pytest.param((130,), marks=pytest.mark.slow)])
def test_every_launch_the_operators_make_is_listed(sizes, dtype, listed, monkeypatch):
    """Run every kernel operator with ``backend="triton"`` over sizes that cross the block rules (in the slow
    suite n = 130, the next block of most kernels, and every sigmoid of the networks), and find each launch's
    configuration in the listing."""
    seen = _record(monkeypatch)
    ops = [load(name, backend="triton") for name in OPERATORS]
    if 130 in sizes:
        ops += [ComparatorNetwork(sigmoid=s, network="bitonic", backend="triton")
                for s in ("logistic", "logistic_phi", "gaussian", "reciprocal", "cauchy", "optimal")]
    g = torch.Generator().manual_seed(0)
    for n in sizes:
        x = torch.randn(2, n, generator=g, dtype=dtype)
        for op in ops:
            if n > 20 and isinstance(op, ComparatorNetwork) and op.network == "odd_even":
                continue  # n layers in the interpreter: slow, and the block rules are the bitonic network's
            _exercise(op, x)
    configs = {(launch.name, launch.config()) for launch in listed}
    assert len({name for name, _ in seen}) >= (15 if dtype == torch.float32 else 11)  # networks: float32 only
    missing = sorted(set(seen) - configs)
    assert not missing, f"launched but not listed: {missing}"
