"""Relaxed bubble sort (thesis §2.3): parity with AlgoVision's program, hard limit, marginals, gradients."""

from __future__ import annotations

import pytest
import torch

from diffrank.operators import load
from diffrank.operators.relaxed_bubble_sort import MAX_N, RelaxedBubbleSort

# AlgoVision indexes with lists (deprecated by PyTorch); its own code, not ours
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")


def _algovision(n: int, beta: float, early_exit: bool, dtype: torch.dtype):
    """The thesis' bubble sort listing in AlgoVision (README form), also carrying the items as one-hot columns:
    ``perm`` (B, items, positions) is moved with the array, so ``perm[b, c, pos]`` is the relaxed P_asc.
    ``early_exit=False``: the same passes in a plain For loop (no While(swapped)). epsilon = 0: AlgoVision
    otherwise stops its loops once every set of the batch is below 1e-5."""
    av = pytest.importorskip("algovision")
    body = [
        av.Let("a", "array", ["i"]),
        av.Let("b", "array", [lambda i: i + 1]),
        av.Let("pa", "perm", [None, "i"]),
        av.Let("pb", "perm", [None, lambda i: i + 1]),
        av.If(av.GT("a", "b"), if_true=[
            av.Let("array", [lambda i: i + 1], "a"),
            av.Let("array", ["i"], "b"),
            av.Let("perm", [None, lambda i: i + 1], "pa"),
            av.Let("perm", [None, "i"], "pb"),
            av.Let("swapped", 1.0),
            av.Let("loss", lambda loss: loss + 1.0),
        ]),
    ]
    one_pass = [av.Let("swapped", 0), av.For("i", "n", *body), av.LetInt("n", lambda n: n - 1)]
    loop = av.While(av.IsTrue("swapped"), *one_pass) if early_exit else av.For("t", n - 1, *one_pass)
    zero = torch.zeros((), dtype=dtype)
    return av.Algorithm(
        av.Input("array"), av.Input("perm"),
        av.Var("a", zero), av.Var("b", zero), av.Var("pa", torch.zeros(n, dtype=dtype)),
        av.Var("pb", torch.zeros(n, dtype=dtype)), av.Var("swapped", zero + 1), av.Var("loss", zero),
        av.VarInt("n", lambda array: array.shape[1] - 1),
        loop,
        av.Output("array"), av.Output("perm"), av.Output("loss"),
        beta=beta, epsilon=0.0,
    )


@pytest.mark.parametrize("early_exit", [True, False])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equals_algovision(n, early_exit, dtype):
    beta = 8.0
    algo = _algovision(n, beta, early_exit, dtype)
    g = torch.Generator().manual_seed(n)
    s = (torch.randn(6, n, generator=g, dtype=torch.float64) * 0.4).to(dtype)  # β·gap ~ 1: far from hard
    array, perm, loss = algo(s.clone(), torch.eye(n, dtype=dtype).expand(6, n, n).clone())
    op = RelaxedBubbleSort(beta=beta, early_exit=early_exit)
    tol = dict(atol=1e-12, rtol=1e-10) if dtype == torch.float64 else dict(atol=2e-6, rtol=1e-5)
    # ours: rows = ranks, descending; AlgoVision: ascending positions
    torch.testing.assert_close(op(s), perm.transpose(1, 2).flip(1), **tol)
    torch.testing.assert_close(op.soft_sort(s), array.flip(1), **tol)
    torch.testing.assert_close(op.expected_swaps(s), loss.to(dtype), **tol)
    assert (op(s) - op(s.sort(1).values)).abs().max() > 1e-2  # the input order matters: the check can fail


def test_while_loop_is_a_mixture_not_the_plain_passes():
    s = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    p_while, p_for = RelaxedBubbleSort(beta=2.0)(s), RelaxedBubbleSort(beta=2.0, early_exit=False)(s)
    assert (p_while - p_for).abs().max() > 1e-3


@pytest.mark.parametrize("early_exit", [True, False])
@pytest.mark.parametrize("sigmoid", ["logistic", "cauchy", "optimal"])
def test_doubly_stochastic(sigmoid, early_exit):
    """Every state is a product of doubly stochastic 2x2 mixings, and the While form a convex mixture of
    states: rows and columns sum to 1, entries in [0, 1]."""
    op = RelaxedBubbleSort(beta=1.5, sigmoid=sigmoid, early_exit=early_exit)
    p = op(torch.randn(5, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    torch.testing.assert_close(p.sum(-1), torch.ones(5, 9, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(p.sum(-2), torch.ones(5, 9, dtype=torch.float64), atol=1e-12, rtol=0)
    assert p.min() >= 0 and p.max() <= 1 and p.max() < 1 - 1e-3  # soft at β = 1.5


@pytest.mark.parametrize("early_exit", [True, False])
def test_large_beta_gives_the_hard_permutation_and_inversion_count(early_exit):
    g = torch.Generator().manual_seed(2)
    s = torch.stack([torch.randperm(7, generator=g) for _ in range(5)]).double() + 0.1 * torch.rand(5, 7, generator=g)
    op = RelaxedBubbleSort(beta=200.0, early_exit=early_exit)
    hard = torch.zeros(5, 7, 7, dtype=torch.float64).scatter_(2, s.argsort(1, descending=True).unsqueeze(-1), 1.0)
    assert (op(s) - hard).abs().max() < 1e-12
    inversions = (s.unsqueeze(2) > s.unsqueeze(1)).triu(1).sum((1, 2)).double()  # i < j with s_i > s_j
    torch.testing.assert_close(op.expected_swaps(s), inversions, atol=1e-9, rtol=0)
    torch.testing.assert_close(op.expected_swaps(s.sort(1).values), torch.zeros(5, dtype=torch.float64),
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("early_exit", [True, False])
def test_n2_is_the_logistic_sorting_network(early_exit):
    """Thesis §3.3: for n = 2 the relaxed bubble sort is the differentiable sorting network with the logistic."""
    s = torch.randn(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    dsn = load("diffsort_odd_even", beta=3.0, sigmoid="logistic", backend="torch")
    torch.testing.assert_close(RelaxedBubbleSort(beta=3.0, early_exit=early_exit)(s), dsn(s), atol=1e-12, rtol=0)


def test_n1_and_top_rows():
    op = RelaxedBubbleSort(beta=2.0)
    torch.testing.assert_close(op(torch.randn(3, 1)), torch.ones(3, 1, 1))
    s = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(op(s, k=2), op(s)[:, :2], atol=0, rtol=0)
    torch.testing.assert_close(op.soft_sort(s), (op(s) @ s.unsqueeze(-1)).squeeze(-1), atol=1e-12, rtol=0)
    assert op.expected_swaps(torch.zeros(0, 4)).shape == (0,)


@pytest.mark.parametrize("early_exit", [True, False])
@pytest.mark.parametrize("sigmoid", ["logistic", "cauchy"])
def test_gradcheck_float64(sigmoid, early_exit):
    op = RelaxedBubbleSort(beta=2.0, sigmoid=sigmoid, early_exit=early_exit)
    s = torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: op(x), (s,), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradcheck(op.soft_rank, (s,), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradcheck(op.expected_swaps, (s,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="beta"):
        RelaxedBubbleSort(beta=0.0)
    with pytest.raises(ValueError, match="unknown sigmoid"):
        RelaxedBubbleSort(sigmoid="tanh")
    with pytest.raises(ValueError, match="art_lambda"):
        RelaxedBubbleSort(art_lambda=2.0)
    with pytest.raises(TypeError, match="early_exit"):
        RelaxedBubbleSort(early_exit="yes")
    op = RelaxedBubbleSort()
    with pytest.raises(ValueError, match="exceeds the limit"):
        op(torch.randn(1, MAX_N + 1))
    with pytest.raises(ValueError, match="exceeds the limit"):
        op.expected_swaps(torch.randn(1, MAX_N + 1))
    with pytest.raises(ValueError, match="non-finite"):
        op.expected_swaps(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="2-D"):
        op.expected_swaps(torch.zeros(3))


def test_config_is_table_2_1():
    op = load("relaxed_bubble_sort")
    assert isinstance(op, RelaxedBubbleSort) and op.beta == 8.0 and op.sigmoid == "logistic" and op.early_exit
