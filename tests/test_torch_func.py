"""The torch transforms matrix: every method of :mod:`diffrank.functional` (every config of
``diffrank.operators.available()``) × every function it provides (``soft_rank``, ``soft_sort``,
``topk_membership``, ``permutation_matrix``) under

- ``gradgrad``: ``torch.autograd.gradgradcheck`` in float64 passes, or the double backward raises
  :class:`~diffrank.operators.base.DoubleBackwardError`, accepted only from an operator whose
  ``twice_differentiable`` is False (docs/api.md, "Second derivatives");
- ``vmap``: ``torch.func.vmap`` over a batch equals the loop over it;
- ``grad``: ``torch.func.grad`` equals autograd;
- ``compile``: ``torch.compile(backend="aot_eager")`` (dynamo and AOTAutograd tracing forward and backward, without
  inductor's code generation, to keep CPU time low), its first call compiled (the operator is built inside it),
  equals eager, values and gradients; graph breaks allowed;
- ``fullgraph``: ``torch.compile(fullgraph=True, backend="eager")`` equals eager, for the methods whose CPU path is
  PyTorch operations only (:data:`PURE_TORCH`); one inductor case (NeuralSort) under ``slow``.

Inputs are small (B = 2 sets of n = 5 items, 3 vmapped samples, scores spaced ~1/β apart for the method's config
β) so that the matrix stays cheap; the compiled cells
of all but one function per method are ``slow`` (each compiles for seconds).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from diffrank import functional as F
from diffrank.operators import available
from diffrank.operators.base import DoubleBackwardError
from helpers import load_deterministic as load  # stochastic operators without noise (helpers)

# the methods whose CPU path is PyTorch operations only: torch.compile(fullgraph=True) must trace them. Not here
# (docs/api.md, "torch.compile and torch.func"): the numba paths (fast_soft_sort, lapsum, sparse_soft_topk), SOFT
# top-k (a data-dependent stop) and the networks (layers built with numpy on first use; a custom forward-mode rule)
PURE_TORCH = {"neuralsort", "softsort", "sinkhorn", "relaxed_bubble_sort", "dftopk", "gumbel_sinkhorn",
              "neuralsort_stochastic"}

# Sinkhorn runs a fixed number of iterations here: its default stopping rule reads the marginal error on the host,
# which fullgraph cannot trace and which stops a batch where its worst row converges (a loop over samples stops each
# where it converges); the default is covered by test_sinkhorn_with_a_tolerance
OPTIONS = {"sinkhorn": {"tolerance": None, "max_iter": 60}, "gumbel_sinkhorn": {"tolerance": None, "max_iter": 60}}

FUNCTIONS = {"soft_rank": "soft_rank", "soft_sort": "soft_sort", "topk_membership": "topk_membership",
             "permutation_matrix": "permutation"}
K = 2


def _cells() -> tuple[list[tuple[str, str]], dict[str, float]]:
    cells, scale = [], {}
    for method in available():
        op = load(method)
        cells += [(method, fn) for fn, cap in FUNCTIONS.items() if cap in op.capabilities]
        # scores spaced ~1/β apart: inside every relaxation's soft regime (at a spacing of many 1/β the sparse top-k is
        # exactly 0 / 1 and its derivatives vanish, which would pass every check)
        scale[method] = 2.0 / float(op.beta)
    return cells, scale


CELLS, SCALE = _cells()
FIRST = {method: fn for method, fn in reversed(CELLS)}  # one function per method runs compile in the default suite


def _params(cells=CELLS, slow_beyond_first: bool = False) -> list:
    params = []
    for method, fn in cells:
        marks = []
        if slow_beyond_first and FIRST[method] != fn:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(method, fn, marks=marks, id=f"{method}-{fn}"))
    return params


def _f(method: str, fn: str, fixed: bool = True):
    """The function as a user calls it: a tensor ``(..., n)`` → the result (``fixed``: with :data:`OPTIONS`)."""
    kw = {"method": method, **(OPTIONS.get(method, {}) if fixed else {})}
    if fn == "topk_membership":
        return lambda s: F.topk_membership(s, K, **kw)
    return lambda s: getattr(F, fn)(s, **kw)


def _scores(method: str, *shape: int) -> torch.Tensor:
    return SCALE[method] * torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _weights(like: torch.Tensor) -> torch.Tensor:
    return torch.randn(like.shape, generator=torch.Generator().manual_seed(7), dtype=like.dtype)


def _value_and_grad(f, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_()
    y = f(x)
    (g,) = torch.autograd.grad((y * _weights(y)).sum(), x)
    return y.detach(), g


@pytest.mark.parametrize("method,fn", _params())
def test_second_derivatives_exact_or_refused(method, fn):
    x = _scores(method, 2, 5).requires_grad_()
    try:
        assert torch.autograd.gradgradcheck(_f(method, fn), (x,))
    except DoubleBackwardError:
        op = load(method, **OPTIONS.get(method, {}))
        assert op.twice_differentiable is False, f"{method} refuses a double backward but declares it exact"


@pytest.mark.parametrize("method,fn", _params())
def test_vmap_equals_the_loop(method, fn):
    f = _f(method, fn)
    xs = _scores(method, 3, 2, 5)
    torch.testing.assert_close(torch.func.vmap(f)(xs), torch.stack([f(x) for x in xs]))


@pytest.mark.parametrize("method,fn", _params())
def test_func_grad_equals_autograd(method, fn):
    f = _f(method, fn)
    x = _scores(method, 2, 5)
    w = _weights(f(x))
    got = torch.func.grad(lambda s: (f(s) * w).sum())(x)
    torch.testing.assert_close(got, _value_and_grad(f, x)[1])


@pytest.mark.parametrize("method,fn", _params(slow_beyond_first=True))
def test_compile_equals_eager(method, fn):
    torch._dynamo.reset()
    F._clear_cache()  # the first call is the compiled one: the operator is built (and its kernels compiled) in it
    f = _f(method, fn, fixed=False)  # Sinkhorn's default stopping rule (its fixed loop: the fullgraph cells)
    x = _scores(method, 2, 5)
    got = _value_and_grad(torch.compile(f, backend="aot_eager"), x)
    want = _value_and_grad(f, x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("method,fn", _params([c for c in CELLS if c[0] in PURE_TORCH],
                                              slow_beyond_first=True))
def test_fullgraph_compile_equals_eager(method, fn):
    torch._dynamo.reset()
    F._clear_cache()  # the operator is built at trace time (functional._cache_operator), inside the one graph
    f = _f(method, fn)
    x = _scores(method, 2, 5)
    torch.testing.assert_close(_value_and_grad(torch.compile(f, backend="eager", fullgraph=True), x),
                               _value_and_grad(f, x))


@pytest.mark.slow
def test_inductor_compiles_neuralsort_in_one_graph():
    torch._dynamo.reset()
    f = _f("neuralsort", "soft_rank")
    x = _scores("neuralsort", 2, 5)
    torch.testing.assert_close(_value_and_grad(torch.compile(f, fullgraph=True), x), _value_and_grad(f, x))


def test_sinkhorn_with_a_tolerance_vmaps_and_compiles():
    """The default stopping rule: under vmap its host read covers every vmapped sample, so the result equals the
    eager call on the stacked batch; under torch.compile the loop runs eagerly (one graph break) and equals eager."""
    f = lambda s: F.soft_rank(s, method="sinkhorn")  # noqa: E731
    xs = _scores("sinkhorn", 3, 2, 5)
    torch.testing.assert_close(torch.func.vmap(f)(xs), f(xs.reshape(6, 5)).reshape(3, 2, 5))
    torch._dynamo.reset()
    x = xs[0]
    torch.testing.assert_close(_value_and_grad(torch.compile(f, backend="aot_eager"), x), _value_and_grad(f, x))
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="skipped"):  # the eager loop is not one graph
        torch.compile(f, backend="eager", fullgraph=True)(x)


@pytest.mark.slow
@pytest.mark.parametrize("method,fn", _params([("fast_soft_sort", "soft_rank"), ("lapsum", "soft_rank")]))
def test_first_call_of_a_fresh_process_compiled(method, fn):
    """The numba paths, first touched inside torch.compile (in this process they may be compiled already)."""
    code = (
        "import torch, diffrank.functional as F\n"
        f"f = lambda s: F.{fn}(s, method={method!r})\n"
        "x = torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))\n"
        "got = torch.compile(f, backend='aot_eager')(x)\n"
        "torch.testing.assert_close(got, f(x))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
