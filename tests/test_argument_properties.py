"""Every argument a user can get wrong, drawn by hypothesis: the public functions of ``diffrank.functional`` and the
compat adapters (torchsort, LapSum) either return finite values that agree with a float64 reference, or raise an
error that names the argument at fault.

A case draws each argument from the forms users pass: the scores as every dtype (floating, integer, bool, complex),
with a NaN or inf, as a list or a 0-d tensor; ``dim`` in and out of range, as a float or a string; ``k`` as an int,
a float, a 0-d or 1-d tensor, a list; β / ε / α as floats, 0-d and 1-d tensors of another dtype, on the meta device,
requiring grad, NaN, inf, zero, negative, NumPy scalars and arrays; ``q`` in and out of [0, 1]. Each form is

- ``VALID``: the call must return (the documented input);
- ``INVALID``: the call must raise, and the message must name the argument;
- ``EITHER``: both are fine (a NumPy scalar β, an integer tensor k), as long as a returned value is right.

A returned value must be finite and agree (relative to its largest magnitude, a few units of the output dtype's
roundoff) with the same call on the canonical form of every argument (the scores as float64 of the same rounded
values, β as a Python float, k as a number). A raised ``TypeError`` / ``ValueError`` / ``IndexError`` /
``NotImplementedError`` must name, as a word, one of the arguments that was not ``VALID`` (the user's name for it:
``regularization_strength`` for torchsort's ε, ``alpha`` for LapSum's); any other exception fails.

β stays in [0.5, 3] and the scores in [-1, 1] with distinct values, n <= 6, so every valid call is well
conditioned and half precision agrees with float64 to its roundoff. ``derandomize=True``: the same cases on every
run. The drawn counts are printed at the end of the module (``pytest -s``).
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diffrank.functional as F
from diffrank.compat import lapsum as L
from diffrank.compat import torchsort as ts

VALID, EITHER, INVALID = "valid", "either", "invalid"
EXAMPLES = 150
TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}
ERRORS = (TypeError, ValueError, IndexError, NotImplementedError)
# methods of diffrank.functional drawn per capability: deterministic, and converged to roundoff (no Sinkhorn)
SORT_METHODS = ["neuralsort", "softsort", "lapsum", "fast_soft_sort", "diffsort_odd_even", "relaxed_bubble_sort"]
TOPK_METHODS = ["neuralsort", "softsort", "lapsum", "diffsort_odd_even", "soft_topk", "dftopk", "sparse_soft_topk"]
PERM_METHODS = ["neuralsort", "softsort", "diffsort_odd_even", "relaxed_bubble_sort"]
REAL_K = {"lapsum"}  # methods that take a real k in (0, n]
FOUND: Counter = Counter()  # (function, outcome) -> cases


@dataclass(frozen=True)
class Arg:
    """One drawn form of an argument: ``make()`` builds it afresh (a tensor requiring grad must not be shared),
    ``status`` says what the call must do with it, ``canonical`` is the form the reference call gets."""

    label: str
    make: Callable[[], Any]
    status: str
    canonical: Any = None


def _const(label: str, value: Any, status: str, canonical: Any = None) -> Arg:
    return Arg(label, lambda: value, status, value if canonical is None else canonical)


# ------------------------------------------------------------------------------------------------------- scores
def _values(n: int, B: int, seed: int) -> torch.Tensor:
    """(B, n) float64: distinct values spread over [-1, 1], a random order per row."""
    g = torch.Generator().manual_seed(seed)
    base = torch.linspace(-1.0, 1.0, n, dtype=torch.float64)
    return torch.stack([base[torch.randperm(n, generator=g)] for _ in range(B)])


@st.composite
def scores(draw, api: str, free: bool) -> Arg:
    """The scores: ``api`` is ``"F"`` (any shape), ``"ts"`` (torchsort: 2-D, integers promoted) or ``"L"``;
    ``free``: any form, else a documented one (float32 / float64)."""
    n, B = draw(st.integers(1, 6)), draw(st.integers(1, 2))
    v = _values(n, B, draw(st.integers(0, 2**16)))
    kinds = ["float64", "float32", "float16", "bfloat16", "int64", "bool", "complex64", "nan", "inf", "list", "0-d",
             "3-d"]
    kind = draw(st.sampled_from(kinds if free else kinds[:2]))
    floating = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
    if kind in floating:
        x = v.to(floating[kind])
        half = kind in ("float16", "bfloat16")
        status = EITHER if half and api != "F" else VALID  # the peers' adapters: half precision is not documented
        return Arg(kind, lambda: x.clone(), status, x.double())
    if kind == "int64":
        x = (v * 3).round().long()  # ties are fine: the reference has the same ones
        return Arg(kind, lambda: x.clone(), EITHER, x.double())
    if kind == "bool":
        x = v > 0
        return Arg(kind, lambda: x.clone(), EITHER, x.double())
    if kind == "complex64":
        x = torch.complex(v.float(), v.flip(-1).float())
        return Arg(kind, lambda: x.clone(), INVALID)
    if kind in ("nan", "inf"):
        x = v.clone()
        x[0, -1] = float(kind)
        return Arg(kind, lambda: x.clone(), INVALID)
    if kind == "list":
        return Arg(kind, lambda: v.tolist(), INVALID)
    if kind == "0-d":
        return Arg(kind, lambda: torch.tensor(0.5, dtype=torch.float64), INVALID)
    x = torch.stack([v, -v], dim=-1)  # "3-d": (B, n, 2); ts wants 2-D
    return Arg(kind, lambda: x.clone(), INVALID if api == "ts" else VALID, x)


# --------------------------------------------------------------------------------------------------------- dim
def dims(free: bool, default: int) -> st.SearchStrategy[Arg]:
    """``dim``: its status depends on x's number of dimensions, so ``canonical`` holds the int; not ``free``: the
    function's default."""
    if not free:
        return st.just(_const(str(default), default, "?", default))
    return st.sampled_from([_const(str(d), d, "?", d) for d in (-4, -3, -2, -1, 0, 1, 2, 3)]
                           + [_const("np.int64(1)", np.int64(1), "?", 1), _const("1.0", 1.0, INVALID),
                              _const("'1'", "1", INVALID)])


def _dim_status(arg: Arg, x: Arg) -> str:
    if arg.status != "?":
        return arg.status
    ndim = x.make().dim() if x.status != INVALID and x.label not in ("list",) else 2
    return VALID if -ndim <= arg.canonical < ndim else INVALID


# -------------------------------------------------------------------------------------------------- temperature
def temperatures(free: bool, sign_matters: bool = False) -> st.SearchStrategy[Arg]:
    """β (or ε, or α: the same forms). ``sign_matters`` (LapSum's α): a negative value is valid, its sign a
    direction. Not ``free``: the valid forms only."""
    neg = VALID if sign_matters else INVALID
    forms = [
        _const("0.5", 0.5, VALID), _const("3", 3, VALID), _const("-2.0", -2.0, neg), _const("0.0", 0.0, INVALID),
        _const("nan", math.nan, INVALID), _const("inf", math.inf, INVALID), _const("-inf", -math.inf, INVALID),
        _const("True", True, EITHER, 1.0), _const("'2'", "2", INVALID),
        _const("np.float64(2)", np.float64(2.0), EITHER, 2.0), _const("np.array([2.])", np.array([2.0]), EITHER, 2.0),
        Arg("tensor(2.) f64", lambda: torch.tensor(2.0, dtype=torch.float64), VALID, 2.0),
        Arg("tensor(2.) f32", lambda: torch.tensor(2.0), VALID, 2.0),
        Arg("tensor(2) int", lambda: torch.tensor(2), EITHER, 2.0),
        Arg("tensor([2.])", lambda: torch.tensor([2.0]), EITHER, 2.0),
        Arg("tensor([1., 2.])", lambda: torch.tensor([1.0, 2.0]), INVALID),
        Arg("tensor(-1.)", lambda: torch.tensor(-1.0), neg, -1.0),
        Arg("tensor(0.)", lambda: torch.tensor(0.0), INVALID),
        Arg("tensor(nan)", lambda: torch.tensor(math.nan), INVALID),
        Arg("tensor(2.) grad", lambda: torch.tensor(2.0, dtype=torch.float64, requires_grad=True), EITHER, 2.0),
        Arg("tensor(-1.) grad", lambda: torch.tensor(-1.0, dtype=torch.float64, requires_grad=True), neg, -1.0),
        Arg("tensor(nan) grad", lambda: torch.tensor(math.nan, dtype=torch.float64, requires_grad=True), INVALID),
        Arg("tensor(2.) meta", lambda: torch.tensor(2.0, device="meta"), EITHER, 2.0),
    ]
    return st.sampled_from(forms if free else [f for f in forms if f.status == VALID])


# ------------------------------------------------------------------------------------------------------------ k
def ks(free: bool) -> st.SearchStrategy[Arg]:
    """k: status by value and method (``_k_status``); ``canonical`` the number (or a tensor of per-row ks); not
    ``free``: 1 (every list has an item)."""
    if not free:
        return st.just(_const("1", 1, "?", 1))
    forms = [_const(str(k), k, "?", k) for k in (-1, 0, 1, 2, 6, 7)]
    forms += [_const("1.5", 1.5, "?", 1.5), _const("2.0", 2.0, "?", 2.0), _const("nan", math.nan, INVALID),
              _const("'2'", "2", INVALID), _const("[1, 2]", [1, 2], "?", [1, 2]),
              Arg("tensor(2)", lambda: torch.tensor(2), "?", 2),
              Arg("tensor(1.5)", lambda: torch.tensor(1.5, dtype=torch.float64), "?", 1.5),
              Arg("tensor([1., 2.])", lambda: torch.tensor([1.0, 2.0], dtype=torch.float64), "?", [1.0, 2.0]),
              Arg("tensor(2.+0j)", lambda: torch.tensor(2.0 + 0j), INVALID)]
    return st.sampled_from(forms)


def _items(x: Arg, dim: int) -> tuple[int, int]:
    """n along ``dim`` and the number of sets B (-1 unless x is 2-D: a per-set k needs one batch dim);
    (1, -1) for scores that are refused anyway."""
    v = x.make()
    if x.status == INVALID or not isinstance(v, torch.Tensor) or v.dim() == 0:
        return 1, -1
    batch = [s for i, s in enumerate(v.shape) if i != dim % v.dim()]
    return v.shape[dim], batch[0] if len(batch) == 1 else -1


def _k_status(arg: Arg, n: int, B: int, real_k: bool) -> str:
    if arg.status != "?":
        return arg.status
    k = arg.canonical
    if isinstance(k, list):  # one k per set
        if len(k) != B or not real_k or not all(0 < v <= n for v in k):
            return INVALID
        return VALID if isinstance(arg.make(), torch.Tensor) else EITHER
    if not 0 < k <= n:
        return INVALID
    if float(k).is_integer() and k >= 1:
        return VALID if isinstance(k, int) else EITHER
    return VALID if real_k else INVALID


# -------------------------------------------------------------------------------------------------------- calls
@dataclass(frozen=True)
class Case:
    """A call: ``run(args)`` with the drawn forms, ``reference(args)`` with the canonical ones."""

    function: str
    args: dict[str, Arg]
    statuses: dict[str, str]
    names: dict[str, tuple[str, ...]]  # argument -> the words that name it in a message
    call: Callable[[dict[str, Any]], torch.Tensor]


X_NAMES = ("x", "values", "scores", "input")
QUANTILES = [_const("0.3", 0.3, VALID), _const("0.0", 0.0, VALID), _const("1", 1, VALID),
             _const("-0.5", -0.5, INVALID), _const("1.5", 1.5, INVALID), _const("nan", math.nan, INVALID),
             _const("'0.5'", "0.5", INVALID),
             Arg("tensor(0.3)", lambda: torch.tensor(0.3, dtype=torch.float64), VALID, 0.3),
             Arg("tensor([0.2, 0.8]) f32", lambda: torch.tensor([0.2, 0.8]), VALID, torch.tensor([0.2, 0.8]).double()),
             Arg("tensor([0.2, 1.7])", lambda: torch.tensor([0.2, 1.7]), INVALID),
             Arg("tensor(1)", lambda: torch.tensor(1), INVALID),
             Arg("tensor([[0.2]])", lambda: torch.tensor([[0.2]]), INVALID)]


def _perturbed(draw, names: list[str]) -> dict[str, bool]:
    """Which arguments take any form (none, one or two of ``names``); the others a documented one."""
    chosen = draw(st.lists(st.sampled_from(names), max_size=2, unique=True))
    return {name: name in chosen for name in names}


def _f_case(draw, function: str) -> Case:
    capability = {"soft_rank": SORT_METHODS, "soft_sort": SORT_METHODS, "topk_membership": TOPK_METHODS,
                  "permutation_matrix": PERM_METHODS, "soft_quantile": SORT_METHODS}[function]
    method = draw(st.sampled_from(capability))
    free = _perturbed(draw, ["x", "dim", "beta"] + ["k"] * (function == "topk_membership")
                      + ["q"] * (function == "soft_quantile"))
    x, dim, beta = draw(scores("F", free["x"])), draw(dims(free["dim"], -1)), draw(temperatures(free["beta"]))
    if not free["beta"] and draw(st.booleans()):
        beta = _const("None", None, VALID)
    args = {"x": x, "dim": dim, "beta": beta}
    statuses = {"x": x.status, "dim": _dim_status(dim, x), "beta": beta.status}
    fn = getattr(F, function)
    extra: dict[str, Any] = {}
    if function in ("soft_rank", "soft_sort"):
        extra["descending"] = draw(st.booleans())
    if function == "topk_membership":
        k = draw(ks(free["k"]))
        n, B = _items(x, dim.canonical if statuses["dim"] == VALID else -1)
        args["k"], statuses["k"] = k, _k_status(k, n, B, method in REAL_K)
        if isinstance(k.make(), list):
            statuses["k"] = INVALID  # documented: a number or a tensor
    if function == "soft_quantile":
        q = draw(st.sampled_from(QUANTILES if free["q"] else QUANTILES[:1]))
        args["q"], statuses["q"] = q, q.status

    def call(a: dict[str, Any]) -> torch.Tensor:
        rest = {k: a[k] for k in ("k", "q") if k in a}
        positional = [rest.pop("k")] if "k" in rest else [rest.pop("q")] if "q" in rest else []
        return fn(a["x"], *positional, method=method, beta=a["beta"], dim=a["dim"], **extra)

    names = {"x": X_NAMES, "dim": ("dim",), "beta": ("beta", "β"), "k": ("k",), "q": ("q",)}
    return Case(f"F.{function}[{method}]", args, statuses, names, call)


def _ts_case(draw, function: str) -> Case:
    free = _perturbed(draw, ["x", "eps"])
    x, eps = draw(scores("ts", free["x"])), draw(temperatures(free["eps"]))
    regularization = draw(st.sampled_from(["l2", "kl"]))
    fn = getattr(ts, function)

    def call(a: dict[str, Any]) -> torch.Tensor:
        return fn(a["x"], regularization, a["eps"])

    return Case(f"ts.{function}[{regularization}]", {"x": x, "eps": eps}, {"x": x.status, "eps": eps.status},
                {"x": X_NAMES, "eps": ("regularization_strength", "ε")}, call)


def _l_case(draw, function: str) -> Case:
    free = _perturbed(draw, ["x", "dim", "alpha"] + ["k"] * function.endswith("topk"))
    x, dim = draw(scores("L", free["x"])), draw(dims(free["dim"], 1))
    alpha = draw(temperatures(free["alpha"], sign_matters=True))
    args = {"x": x, "dim": dim, "alpha": alpha}
    statuses = {"x": x.status, "dim": _dim_status(dim, x), "alpha": alpha.status}
    fn = getattr(L, function)
    if function in ("soft_topk", "log_soft_topk"):
        k = draw(ks(free["k"]))
        n, B = _items(x, dim.canonical if statuses["dim"] == VALID else 1)
        args["k"], statuses["k"] = k, _k_status(k, n, B, real_k=True)

        def call(a: dict[str, Any]) -> torch.Tensor:
            return fn(a["x"], a["k"], a["alpha"], dim=a["dim"])
    else:
        def call(a: dict[str, Any]) -> torch.Tensor:
            return fn(a["x"], a["alpha"], dim=a["dim"])

    names = {"x": X_NAMES, "dim": ("dim",), "alpha": ("alpha", "α"), "k": ("k",)}
    return Case(f"L.{function}", args, statuses, names, call)


FUNCTIONS = {
    **{f"F.{f}": (_f_case, f) for f in ("soft_rank", "soft_sort", "topk_membership", "permutation_matrix",
                                        "soft_quantile")},
    **{f"ts.{f}": (_ts_case, f) for f in ("soft_rank", "soft_sort")},
    **{f"L.{f}": (_l_case, f) for f in ("soft_topk", "log_soft_topk", "soft_rank", "soft_sort")},
}


def _canonical(case: Case) -> dict[str, Any]:
    out = {}
    for name, arg in case.args.items():
        value = arg.canonical
        if isinstance(value, list) and name == "k":
            value = torch.tensor(value, dtype=torch.float64)
        out[name] = value
    return out


def _names_one(message: str, case: Case, suspects: list[str]) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)", message)
               for arg in suspects for word in case.names[arg])


def _check(case: Case) -> str:
    suspects = [a for a, s in case.statuses.items() if s != VALID]
    labels = ", ".join(f"{a}={case.args[a].label} ({case.statuses[a]})" for a in case.args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # torch's "converting a tensor that requires grad" is one
            warnings.filterwarnings("ignore", "Casting complex values to real")  # refused all the same below
            out = case.call({a: arg.make() for a, arg in case.args.items()})
    except ERRORS as e:
        message = str(e)
        assert suspects, f"{case.function}({labels}) raised for valid arguments: {type(e).__name__}: {message}"
        assert _names_one(message, case, suspects), (
            f"{case.function}({labels}): the error does not name {' or '.join(suspects)}: "
            f"{type(e).__name__}: {message}")
        return "raised"
    invalid = [a for a in suspects if case.statuses[a] == INVALID]
    assert not invalid, f"{case.function}({labels}) returned instead of refusing {', '.join(invalid)}"
    assert isinstance(out, torch.Tensor), f"{case.function}({labels}) returned {type(out).__name__}"
    assert bool(torch.isfinite(out).all()), f"{case.function}({labels}) returned non-finite values {out}"
    ref = case.call(_canonical(case))
    tol = TOL.get(out.dtype, 1e-4) if out.is_floating_point() else 1e-4
    scale = max(float(ref.abs().max()), 1.0) if ref.numel() else 1.0
    assert out.shape == ref.shape, f"{case.function}({labels}): shape {tuple(out.shape)}, reference {tuple(ref.shape)}"
    err = float((out.detach().double() - ref.double()).abs().max()) if out.numel() else 0.0
    assert err <= tol * scale, f"{case.function}({labels}): {err:.3g} off the float64 reference (tol {tol * scale:.3g})"
    return "returned"


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if FOUND:
        print("\nargument properties: cases per function (returned / raised)")
        for fn in FUNCTIONS:
            print(f"  {fn:24s} {FOUND[fn, 'returned']:4d} / {FOUND[fn, 'raised']:4d}")
        print(f"  {'total':24s} {sum(v for (_, o), v in FOUND.items() if o == 'returned'):4d} / "
              f"{sum(v for (_, o), v in FOUND.items() if o == 'raised'):4d}")


@pytest.mark.parametrize("function", list(FUNCTIONS))
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_argument_form_returns_right_values_or_names_itself(function: str, data) -> None:
    builder, name = FUNCTIONS[function]
    case = builder(data.draw, name)
    FOUND[function, _check(case)] += 1
