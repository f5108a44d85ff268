"""No silent wrong answer: every operator × dtype × β × score scale × n × batch size, drawn by hypothesis.

For every operator of ``configs/operator/`` (its config's defaults, plus the solver variants of
:data:`VARIANTS`) and each of its capabilities, a case is a dtype (float16, bfloat16,
float32, float64), β = 10^u with u in [-3, 9] (12 decades: the β a user can type; an operator outside its
range must raise), scores = scale · z with scale = 10^v, v in [-12, 30],
z distinct values spread over [-1, 1], n in [1, 1000] (top-k membership; full P, soft sort and soft rank up to
n = 48; Sinkhorn up to n = 64, whose every call solves the n × n plan), and B in {0, 1, 3}. The call must either
raise ``ValueError`` naming the limit it hit, or return

1. finite values of the input dtype with finite gradients (unless the exact gradient exceeds the dtype's
   largest value), that are what they claim to be: rows of P sum to 1
   with entries in [0, 1]; top-k membership lies in [0, 1] and sums to k over the items; soft ranks lie in
   [1, n] and sum to n(n + 1)/2; soft-sorted values lie in [min s, max s];
2. values within :data:`REL_TOL` (relative to the largest magnitude) of the same operator's float64 result on
   the same rounded inputs, whenever the inputs have no ties and the computation is well conditioned
   (unit roundoff of the compute dtype × β × max|s| × n below 1e-4; outside that a float32 result may
   legitimately differ, and property 1 still holds);
3. the hard result (within 1e-2, relative to max|s| for values) where β × (smallest gap) is at least 20 × the
   operator's ``hard_beta`` per 0.5 of gap, n <= 8, for the operators whose β multiplies score differences.

``derandomize=True`` makes the drawn cases the same on every run (CI is reproducible).
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffrank.operators import available
from diffrank.operators.base import PERMUTATION, SOFT_RANK, SOFT_SORT, TOPK_MEMBERSHIP
from diffrank.operators.fast_soft_sort import FastSoftSort
from diffrank.operators.lapsum import LapSum
from helpers import load_deterministic as load  # stochastic operators without noise (helpers)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# output tolerance vs the float64 result: a few units of the output dtype's roundoff, and float32 compute slack
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4, torch.float64: 1e-9}
INVARIANT_TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4, torch.float64: 1e-9}
MAX_N = {PERMUTATION: 48, SOFT_SORT: 48, SOFT_RANK: 48, TOPK_MEMBERSHIP: 1000}
MAX_N_OPERATOR = {"sinkhorn": 64, "gumbel_sinkhorn": 64}
# iterative solvers stop at a marginal tolerance, not at the roundoff
SOLVER_TOL = {"sinkhorn": 1e-2, "gumbel_sinkhorn": 1e-2, "soft_topk": 1e-5}
SCALE_INVARIANT = {"sinkhorn", "gumbel_sinkhorn"}  # standardises the scores first: β acts on the standardised scores
LIMIT_WORDS = ("range", "limit", "overflow", "exceed", "finite", "too large", "too small")
EXAMPLES = 100
# settings beyond a config's defaults that take another code path, fuzzed as operators of their own:
# name -> [(label, constructor options, examples)]. Sparse soft top-k's p = 2 PAV (block means instead of the
# cubic) and its Dykstra iteration (batched torch, p = 2; half the examples, ~25 ms each)
VARIANTS = {"sparse_soft_topk": [("p2", {"p": 2}, EXAMPLES), ("dykstra", {"p": 2, "solver": "dykstra"}, 50)]}
# warnings a variant gives by design: an unconverged Dykstra run warns (test_sparse_soft_topk checks that); the
# matrix holds its result to the same invariants
EXPECTED_WARNINGS = {"dykstra": r"ignore:sparse soft top-k \(Dykstra\)"}
# (operator, dtype) -> cases, raised, compared with float64, worst relative error, checked against the hard result
MATRIX: dict = defaultdict(lambda: {"cases": 0, "raised": 0, "compared": 0, "worst": 0.0, "hard": 0})


def _scores(n: int, B: int, scale: float, seed: int) -> torch.Tensor:
    """(B, n) float64: a random permutation of n evenly spread values in [-1, 1] with jitter, times scale."""
    g = torch.Generator().manual_seed(seed)
    base = torch.linspace(-1.0, 1.0, n, dtype=torch.float64) if n > 1 else torch.zeros(1, dtype=torch.float64)
    step = 2.0 / max(n - 1, 1)
    rows = [base[torch.randperm(n, generator=g)] + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 0.25 * step
            for _ in range(B)]
    z = torch.stack(rows) if rows else torch.zeros(0, n, dtype=torch.float64)
    return z * scale


def _call(op, capability: str, scores: torch.Tensor, ks: list[int]) -> torch.Tensor:
    if capability == PERMUTATION:
        return op(scores)
    if capability == TOPK_MEMBERSHIP:
        return op.topk_membership(scores, ks)
    return op.soft_sort(scores) if capability == SOFT_SORT else op.soft_rank(scores)


def _hard(capability: str, s: torch.Tensor, ks: list[int]) -> torch.Tensor:
    B, n = s.shape
    order = s.argsort(dim=1, descending=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(n).expand(B, n).contiguous())
    if capability == PERMUTATION:
        return torch.zeros(B, n, n, dtype=s.dtype).scatter_(2, order.unsqueeze(-1), 1.0)
    if capability == TOPK_MEMBERSHIP:
        return torch.stack([(rank < k).to(s.dtype) for k in ks], dim=1)
    return s.sort(dim=1, descending=True).values if capability == SOFT_SORT else (rank + 1).to(s.dtype)


def _check_invariants(op, capability: str, out: torch.Tensor, s: torch.Tensor, ks: list[int], tol: float) -> None:
    o = out.double()
    n = s.shape[1]
    # a row-stochastic P (NeuralSort, SoftSort) has column sums near 1 only: membership may exceed 1 and
    # expected ranks leave [1, n] by as much; their sums over the items are exact all the same
    bounded = PERMUTATION not in op.capabilities or op.doubly_stochastic
    if capability == PERMUTATION:
        assert (o >= -tol).all() and (o <= 1 + tol).all(), "P has entries outside [0, 1]"
        torch.testing.assert_close(o.sum(-1), torch.ones_like(o[..., 0]), atol=tol * 4, rtol=0)
    elif capability == TOPK_MEMBERSHIP:
        assert (o >= -tol).all() and (not bounded or (o <= 1 + tol).all()), "membership outside [0, 1]"
        if op.sums_to_k:  # DFTopK's per-item sigmoids sum to k only in the hard limit (checked there)
            want = torch.tensor(ks, dtype=o.dtype).expand(o.shape[0], -1)
            torch.testing.assert_close(o.sum(-1), want, atol=tol * n ** 0.5 * 4, rtol=tol * 4)
    elif capability == SOFT_RANK:
        assert not bounded or ((o >= 1 - tol * n).all() and (o <= n + tol * n).all()), "soft ranks outside [1, n]"
        want = torch.full_like(o[:, 0], n * (n + 1) / 2)
        torch.testing.assert_close(o.sum(-1), want, atol=0, rtol=tol * 4)
    elif not isinstance(op, LapSum):  # LapSum sorts by its inverse CDF at i - 1/2 (Struski et al. 2025,
        # §3.2), which may leave [min s, max s]; it is held to float64 and the hard limit only
        lo, hi = s.double().min(1, keepdim=True).values, s.double().max(1, keepdim=True).values
        span = tol * s.double().abs().amax(1, keepdim=True).clamp_min(1e-300)
        assert (o >= lo - span).all() and (o <= hi + span).all(), "soft-sorted values outside [min s, max s]"


def _case(name: str, capability: str, dtype: torch.dtype, log_beta: float, log_scale: float, n: int, B: int,
          seed: int, variant: str = "", options: dict | None = None) -> None:
    beta, scale = 10.0 ** log_beta, 10.0 ** log_scale
    try:
        op = load(name, beta=beta, **(options or {}))
    except ValueError as e:
        assert any(w in str(e) for w in LIMIT_WORDS), f"unclear error: {e}"
        return
    name = f"{name}[{variant}]" if variant else name  # the matrix row and the messages name the variant
    row = MATRIX[(name, str(dtype).removeprefix("torch."))]
    row["cases"] += 1
    ks = sorted({1, min(3, n)})
    s64 = _scores(n, B, scale, seed)
    s = s64.to(dtype)
    if not torch.isfinite(s).all():  # 1e30 in float16: the input itself is out of range
        with pytest.raises(ValueError, match="non-finite"):
            _call(op, capability, s, ks)
        row["raised"] += 1
        return
    x = s.clone().requires_grad_(True)
    try:
        out = _call(op, capability, x, ks)
    except ValueError as e:
        assert any(w in str(e) for w in LIMIT_WORDS), f"{name}.{capability}: unclear error: {e}"
        row["raised"] += 1
        return
    assert out.dtype == dtype
    assert torch.isfinite(out).all(), f"{name}.{capability}: non-finite output"
    tol = max(INVARIANT_TOL[dtype], SOLVER_TOL.get(name, 0.0))
    _check_invariants(op, capability, out, s, ks, tol)
    if B and out.requires_grad:
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        (out.double() * w).sum().backward()
        assert x.grad is not None
        if not torch.isfinite(x.grad).all():  # allowed only where the exact gradient exceeds the dtype's range
            x32 = s.float().requires_grad_(True)
            (_call(op, capability, x32, ks).double() * w).sum().backward()
            assert float(x32.grad.abs().max()) > torch.finfo(dtype).max, f"{name}.{capability}: non-finite gradient"
    if B == 0:
        return
    magnitude = float(s.double().abs().max())
    ties = any(len(torch.unique(row)) < n for row in s)
    ref = _call(op, capability, s.double(), ks)
    unit = 2.0 ** -24 if dtype != torch.float64 else 2.0 ** -53
    well_conditioned = unit * beta * (1.0 if name in SCALE_INVARIANT else magnitude) * n < 1e-4
    if dtype != torch.float64 and not ties and well_conditioned:
        size = max(float(ref.abs().max()), torch.finfo(dtype).tiny)  # below it the dtype is subnormal
        err = float((out.detach().double() - ref).abs().max()) / size
        row["compared"] += 1
        row["worst"] = max(row["worst"], err)
        assert err <= REL_TOL[dtype] + SOLVER_TOL.get(name, 0.0), (
            f"{name}.{capability} {dtype}: relative error {err:.3g} vs float64 "
            f"(β={beta:.3g}, scale={scale:.3g}, n={n})")
    if dtype in (torch.float32, torch.float64) and not ties and 2 <= n <= 8:
        gaps = s.double().sort(1).values.diff(dim=1)
        gap = float(gaps.min())
        strength = beta if name in SCALE_INVARIANT else beta * gap / 0.5
        if getattr(op, "sigmoid", None) == "logistic_phi" and gap > 0.5:
            # ART compares φ(x) = x / (|x|^λ + ε), which grows as |x|^(1-λ) (Petersen et al. 2021, §4)
            strength = beta * (gap / 0.5) ** (1 - op.art_lambda)
        if isinstance(op, FastSoftSort) and capability == SOFT_SORT:
            # the projection of ρ/ε onto the permutahedron of s is the sorted s once 1/ε exceeds the largest
            # gap of s (Blondel et al. 2020, §5), not the smallest
            strength = beta / float(gaps.max()) * op.hard_beta
        if strength >= 20 * op.hard_beta:
            want = _hard(capability, s.double(), ks)
            size = magnitude if capability == SOFT_SORT else 1.0
            err = float((out.detach().double() - want).abs().max()) / size
            row["hard"] += 1
            assert err <= 1e-2, (
                f"{name}.{capability} {dtype}: {err:.3g} from the hard result at β·gap = {beta * gap:.3g}")


# noiseless (as fuzzed, helpers.load_deterministic), Gumbel-Sinkhorn runs SinkhornSort's code on the same cost:
# "sinkhorn" is fuzzed in full, this config's wiring with a quarter of the examples (the Sinkhorn cases are the
# matrix's slowest)
EXAMPLES_OPERATOR = {"gumbel_sinkhorn": EXAMPLES // 4}


def _variants(name: str) -> list[tuple[str, dict, int]]:
    """The config's defaults (label "") and the variants of :data:`VARIANTS`: (label, options, examples)."""
    return [("", {}, EXAMPLES_OPERATOR.get(name, EXAMPLES)), *VARIANTS.get(name, [])]


def _params():
    return [pytest.param(name, cap, label, options, examples, id=f"{name}[{label}]-{cap}" if label else f"{name}-{cap}",
                         marks=[pytest.mark.filterwarnings(EXPECTED_WARNINGS[label])] if label in EXPECTED_WARNINGS
                         else [])
            for name in available() for label, options, examples in _variants(name)
            for cap in sorted(load(name, **options).capabilities)]


@pytest.mark.parametrize(("name", "capability", "variant", "options", "examples"), _params())
def test_no_silent_wrong_answer(name, capability, variant, options, examples):
    # hypothesis' settings take the number of examples, which depends on the variant: applied per test
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data):
        cap_n = min(MAX_N[capability], MAX_N_OPERATOR.get(name, 1000))
        dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        log_beta = data.draw(st.floats(-3, 9), label="log10 beta")
        log_scale = data.draw(st.floats(-12, 30), label="log10 scale")
        n = data.draw(st.one_of(st.integers(1, 8), st.integers(1, cap_n)), label="n")
        B = data.draw(st.sampled_from([0, 1, 3]), label="B")
        seed = data.draw(st.integers(0, 2 ** 16), label="seed")
        _case(name, capability, dtype, log_beta, log_scale, n, B, seed, variant, options)

    run()


@pytest.mark.parametrize(("name", "options"), [pytest.param(name, options, id=f"{name}[{label}]" if label else name)
                                                for name in available() for label, options, _ in _variants(name)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_batch(name, options, dtype):
    """B = 0 returns empty results of the right shape (no raw RuntimeError from a reduction)."""
    op = load(name, **options)
    s = torch.zeros(0, 6, dtype=dtype)
    for cap in op.capabilities:
        out = _call(op, cap, s, [1, 3])
        assert out.shape[0] == 0 and out.dtype == dtype



@pytest.fixture(scope="module", autouse=True)
def _print_matrix():
    """Print the fuzz matrix (operator × dtype) when the module ends: ``pytest -s tests/operators/test_fuzz.py``."""
    yield
    if MATRIX:
        print("\noperator | dtype | cases | raised | vs float64 | worst rel. error | vs hard")
        for (name, dtype), r in sorted(MATRIX.items()):
            print(f"{name} | {dtype} | {r['cases']} | {r['raised']} | {r['compared']} | {r['worst']:.2g} | {r['hard']}")
