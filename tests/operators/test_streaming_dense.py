"""NeuralSort's and SoftSort's soft rank and soft sort streamed over chunks of P's rows
(diffrank.operators.streaming): equal to the forms built from the dense P (values, gradients, ∂/∂β, second
derivatives, forward mode, vmap), for n not divisible by the chunk, batches, ties; never refused by the memory check
while the permutation still is; saving O(B · n) for the backward instead of P."""

from __future__ import annotations

import pytest
import torch

import diffrank.functional as F
from diffrank.operators import NeuralSort, SoftSort, memory, streaming
from diffrank.operators.base import RankingOperator
from diffrank.operators.memory import ENV, DenseMemoryError

CASES = [("neuralsort", {}), ("softsort", {}), ("softsort", {"power": 2.0})]
IDS = ["neuralsort", "softsort", "softsort-power2"]


def _op(name: str, beta=0.7, **kw) -> RankingOperator:
    return NeuralSort(beta, backend="torch") if name == "neuralsort" else SoftSort(beta, backend="torch", **kw)


def _dense(op: RankingOperator, method: str, x: torch.Tensor) -> torch.Tensor:
    """The base class's form built from the full P (Σ_r r P[r, j], or P s)."""
    return getattr(RankingOperator, f"_{method}")(op, x)


def _rows(monkeypatch, rows: int, B: int, n: int, dtype: torch.dtype) -> None:
    """Force chunks of ``rows`` rows for (B, n) scores of ``dtype``."""
    monkeypatch.setattr(streaming, "CHUNK_BYTES", rows * B * n * dtype.itemsize)


def _scores(B: int, n: int, dtype: torch.dtype, seed: int = 0, ties: bool = False) -> torch.Tensor:
    x = torch.randn(B, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if ties and n > 3:
        x[:, 1] = x[:, 0]  # exact ties (and a triple)
        x[:, 3] = x[:, 0]
    return x.to(dtype)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["soft_rank", "soft_sort"])
@pytest.mark.parametrize("n,ties", [(1, False), (5, False), (37, False), (37, True)])
def test_streamed_equals_the_dense_form_values_gradients_and_beta(monkeypatch, name, kw, dtype, method, n, ties):
    """Chunks of 5 rows (37 = 7 · 5 + 2: a short last chunk), B = 3: the same values and gradients (scores and a
    learnable β) as the form built from the dense P, to 1e-12 in float64 and to float32 rounding in float32 (1e-4 of
    the largest magnitude: ∂/∂β sums terms of either sign, and each form's own float32 error against float64 is
    ~2e-5 of it)."""
    B = 3
    _rows(monkeypatch, 5, B, n, dtype)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    x = _scores(B, n, dtype, seed=n, ties=ties)
    beta = torch.tensor(0.7, dtype=dtype, requires_grad=True)
    op = _op(name, beta, **kw)
    results = []
    for f in (lambda s: getattr(op, f"_{method}")(s), lambda s: _dense(op, method, s)):
        s = x.clone().requires_grad_()
        y = f(s)
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
        results.append((y.detach(), *torch.autograd.grad((y * w).sum(), (s, beta))))
    (y, gs, gb), (y_ref, gs_ref, gb_ref) = results
    scale = {"atol": tol["atol"] * max(1.0, float(y_ref.abs().max())), "rtol": tol["rtol"]}
    torch.testing.assert_close(y, y_ref, **scale)
    torch.testing.assert_close(gs, gs_ref, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(gs_ref.abs().max())))
    torch.testing.assert_close(gb, gb_ref, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(gb_ref.abs().max())))
    if method == "soft_rank":  # rows of P sum to 1: the ranks sum to n (n + 1) / 2
        torch.testing.assert_close(y.sum(-1), torch.full((B,), n * (n + 1) / 2, dtype=dtype), **scale)


def test_one_chunk_is_the_dense_form_bit_for_bit():
    """Below the chunk budget the streamed rows are the dense rows, summed in the same order."""
    x = _scores(4, 50, torch.float32)
    for name, kw in CASES:
        op = _op(name, 1.3, **kw)
        for method in ("soft_rank", "soft_sort"):
            torch.testing.assert_close(getattr(op, method)(x), _dense(op, method, x), rtol=0, atol=0)


@pytest.mark.parametrize("name,kw,method", [("neuralsort", {}, "soft_rank"), ("neuralsort", {}, "soft_sort"),
                                             ("softsort", {}, "soft_rank"), ("softsort", {"power": 2.0}, "soft_sort"),
                                             ("softsort", {"power": 0.5}, "soft_rank")])
def test_gradcheck_and_gradgradcheck_over_several_chunks(monkeypatch, name, kw, method):
    """float64, n = 5 in chunks of 2 rows (3 chunks, the last one short), scores and a learnable β: first and exact
    second derivatives (the recorded backward runs the same chunks with its graph); also for power < 1, whose
    dense form has none (NaN)."""
    B, n = 1, 5
    _rows(monkeypatch, 2, B, n, torch.float64)
    x = (torch.arange(n, dtype=torch.float64) * 0.9 + 0.3 * torch.randn(B, n, dtype=torch.float64,
         generator=torch.Generator().manual_seed(3))).requires_grad_()
    beta = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)

    def f(s, b):
        return getattr(_op(name, b, **kw), method)(s)

    assert torch.autograd.gradcheck(f, (x, beta))
    if method == "soft_rank" or kw:  # the second derivatives of the sort's direct term are those of the rank's
        assert torch.autograd.gradgradcheck(f, (x, beta))


def test_power_below_one_has_finite_gradients_where_the_dense_form_has_nan():
    """SoftSort with p < 1: the entry s̃_r = s_j (item j's own rank) has distance identically 0, so its derivative
    is 0; the dense P's autograd evaluates d^(p-1) there and returns NaN."""
    x = _scores(2, 8, torch.float64).requires_grad_()
    op = _op("softsort", 0.8, power=0.5)
    (g,) = torch.autograd.grad(op.soft_rank(x).pow(2).sum(), x)
    assert torch.isfinite(g).all()
    (g_dense,) = torch.autograd.grad(_dense(op, "soft_rank", x).pow(2).sum(), x)
    assert torch.isnan(g_dense).any()


@pytest.mark.parametrize("name,kw", CASES[:2], ids=IDS[:2])
def test_forward_mode_hessian_and_vmap_over_several_chunks(monkeypatch, name, kw):
    """torch.func.hessian (forward over reverse: the chunked jvp rule) and vmap (folded into the batch) equal the
    dense form's."""
    B, n = 1, 7
    _rows(monkeypatch, 3, B, n, torch.float64)
    op = _op(name, 0.9, **kw)
    x = _scores(B, n, torch.float64, seed=5)
    w = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def loss(f):
        return lambda v: (f(v.unsqueeze(0)).squeeze(0) * w).sin().sum()

    torch.testing.assert_close(torch.func.hessian(loss(op.soft_rank))(x[0]),
                               torch.func.hessian(loss(lambda s: _dense(op, "soft_rank", s)))(x[0]))
    xs = _scores(4, n, torch.float64, seed=6)  # vmapped over 4 samples of one set each
    torch.testing.assert_close(torch.func.vmap(op.soft_sort)(xs.unsqueeze(1)),
                               torch.stack([_dense(op, "soft_sort", s.unsqueeze(0)) for s in xs]))


def test_soft_rank_beyond_the_dense_limit_runs_while_the_permutation_is_refused(monkeypatch):
    """Under a 1 MiB limit (and calls checked from 1 MiB rather than 256 MiB, to keep n small), n = 600 in float64:
    P (3 buffers of 2.7 MiB) is refused; soft rank (forward and backward) and soft sort stream, and the ranks sum to
    n (n + 1) / 2."""
    monkeypatch.setenv(ENV, "1M")
    monkeypatch.setattr(memory, "CHECK_FROM_BYTES", 2**20)
    n = 600
    x = torch.randn(1, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for method, fn in (("neuralsort", "soft_rank"), ("softsort", "soft_sort")):
        with pytest.raises(DenseMemoryError, match="forward on 1 set"):
            F.permutation_matrix(x, method=method)
        assert getattr(F, fn)(x, method=method).shape == (1, n)
    s = x.clone().requires_grad_()
    r = F.soft_rank(s, method="softsort")
    r.sum().backward()  # Σ ranks is the constant n (n + 1) / 2: its gradient is 0
    torch.testing.assert_close(r.sum(), torch.tensor(n * (n + 1) / 2, dtype=torch.float64))
    assert s.grad.abs().max() < 1e-6 * n


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_the_backward_saves_o_of_n_not_p(monkeypatch, name):
    """Bytes that autograd saves for the backward of soft_rank (saved_tensors_hooks): O(B · n) streamed, at least
    one B · n · n P dense."""
    B, n = 2, 400
    x = _scores(B, n, torch.float32).requires_grad_()
    op = _op(name, 0.5)

    def saved(f):
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            f(x)
        return total

    assert saved(op.soft_rank) <= 16 * B * n * 8  # a few (B, n) tensors (scores, sort / topk indices, row sums)
    assert saved(lambda s: _dense(op, "soft_rank", s)) >= B * n * n * 4


def test_the_chunk_follows_the_byte_budget():
    """The most rows whose (B, c, n) buffer fits the budget, at least one, at most n."""
    assert streaming.chunk_rows(1, 100_000, 4, 64 * 2**20) == 167
    assert streaming.chunk_rows(16, 2000, 4, 64 * 2**20) == 524
    assert streaming.chunk_rows(1, 10, 8, 64 * 2**20) == 10
    assert streaming.chunk_rows(64, 10**6, 8, 2**20) == 1
    with pytest.raises(ValueError, match="chunk_bytes"):
        streaming.streamed_rows(torch.zeros(1, 3), torch.zeros(1, 3), 1.0, "neuralsort", "rank", chunk_bytes=0)
    with pytest.raises(ValueError, match="kind"):
        streaming.streamed_rows(torch.zeros(1, 3), torch.zeros(1, 3), 1.0, "sinkhorn", "rank")


def test_the_stochastic_subclass_keeps_its_own_rows():
    """NeuralSortStochastic's rows are those of perturbed scores: its soft rank is built from them, not streamed
    from the unperturbed scores, and is checked as dense."""
    from diffrank.operators.neuralsort_stochastic import NeuralSortStochastic

    op = NeuralSortStochastic(beta=1.0, noise=True, generator=torch.Generator().manual_seed(0))
    assert op._dense_rows("soft_rank", 30000, None) == 30000
    x = _scores(2, 6, torch.float64)
    assert not torch.allclose(op.soft_rank(x), NeuralSort(1.0).soft_rank(x))


def test_the_streaming_benchmark_table_compares_with_the_dense_form():
    """``python -m diffrank.benchmark --suite streaming`` (in ``make bench``): one row per operator and size, the dense
    P as the reference."""
    import argparse

    from diffrank.benchmark import DEFAULT_SUITES
    from diffrank.benchmark import streaming as suite

    assert "streaming" in DEFAULT_SUITES
    [(title, rows)] = suite.run(argparse.Namespace(quick=True, max_seconds=0.05, device="cpu"))
    assert "dense P" in title and [r["operator"] for r in rows] == ["neuralsort soft_rank streamed",
                                                                    "softsort soft_rank streamed"]
    assert all(r["reference"] == "dense P" and r["ref time"] != "-" and "fail" not in r["ref time"] for r in rows)
