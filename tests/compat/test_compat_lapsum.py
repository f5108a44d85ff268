"""diffrank.compat.lapsum: the official LapSum package's API (gmum/LapSum) on diffrank's LapSum operator.

The expected numbers are the official CPU extensions' outputs (``lapsum/{topk,rank,sort,permute}/cpu/*.cpp`` of
gmum/LapSum at c277d1a, JIT-compiled and called as the official Python wrappers call them) on the scores below,
printed to 10 digits; the official package itself is not needed here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from diffrank.compat import lapsum as C

F64 = torch.float64
X = torch.tensor([[0.5, -1.2, 2.0, 0.3, 1.1], [1.0, 1.0, -0.5, 0.25, 3.0]], dtype=F64)
K = torch.tensor([[2.0], [1.5]], dtype=F64)


def _close(a, b, tol=1e-9):
    torch.testing.assert_close(a, torch.tensor(b, dtype=F64), atol=tol, rtol=0)


def test_soft_topk_and_log_soft_topk_equal_the_official():
    _close(C.soft_topk(X, K, -0.5), [[0.2269427282, 0.0075738209, 0.9451545895, 0.1521242600, 0.6682046013],
                                     [0.2287869748, 0.2287869748, 0.0113906328, 0.0510492743, 0.9799861433]])
    # only |alpha| counts; largest=False: the k smallest
    torch.testing.assert_close(C.soft_topk(X, K, 0.5), C.soft_topk(X, K, -0.5))
    _close(C.soft_topk(X, K, 0.5, largest=False),
           [[0.3608585931, 0.9768792606, 0.0179660914, 0.5356075352, 0.1086885196],
            [0.0967210476, 0.0967210476, 0.8713127349, 0.4334736620, 0.0017715078]])
    _close(C.log_soft_topk(X, K, 0.5), [[-1.4830575920, -4.8830575920, -0.0564067781, -1.8830575920, -0.4031608629],
                                        [-1.4749639494, -1.4749639494, -4.4749639494, -2.9749639494, -0.0202168469]])
    # no underflow: far below the threshold log p stays finite and exact (log ½ + β(x - b))
    far = torch.tensor([[0.0, 1.0, -500.0]], dtype=F64)
    lp = C.log_soft_topk(far, torch.tensor([[1.0]], dtype=F64), 0.5)
    assert torch.isfinite(lp).all() and float(lp[0, 2]) < -900
    torch.testing.assert_close(torch.logsumexp(lp, dim=1).exp(), torch.tensor([1.0], dtype=F64))


def test_soft_topk_gradients_equal_the_official_vjp():
    """x, k and a tensor alpha (the official vjp's grad_alpha, for the signed α it uses, here α = -0.5)."""
    x, k = X.clone().requires_grad_(), K.clone().requires_grad_()
    alpha = torch.tensor(-0.5, dtype=F64, requires_grad=True)
    v = torch.tensor([[1.0, -2.0, 0.5, 0.0, 3.0], [0.5, 0.5, -1.0, 2.0, 1.0]], dtype=F64)
    C.soft_topk(x, k, alpha).backward(v)
    _close(x.grad, [[-0.2707778242, -0.0544796670, -0.1202844799, -0.4857563236, 0.9312982947],
                    [-0.0588841106, -0.0588841106, -0.0371035655, 0.1400090019, 0.0148627848]])
    _close(k.grad, [[1.5965774412], [0.6286876376]])
    _close(alpha.grad, 1.0969862443)
    assert float(alpha.detach()) == -0.5  # left as it was (the official code overwrites it with -|α|)


def test_soft_rank_and_soft_sort_equal_the_official():
    _close(C.soft_rank(X), [[2.1147362404, 3.7265826340, 0.4265727740, 2.3861934595, 1.3459148921],
                            [1.7800807148, 1.7800807148, 3.5255878718, 2.7318527930, 0.1823979056]])
    _close(C.soft_rank(X, 0.5), [[1.8236439821, 0.0474368657, 3.8749396081, 1.4279013828, 2.8260781613],
                                 [2.3726992052, 2.3726992052, 0.1618080894, 1.1136084658, 3.9791850344]])
    _close(C.soft_sort(X), [[2.6168844914, 1.4027216773, 0.5842151933, -0.2651786280, -1.6362107345],
                            [3.3110048285, 1.7415328542, 0.8386946588, 0.0193479484, -1.1672262453]])
    _close(C.soft_sort(X, 0.5), [[-1.2453195214, 0.0194343670, 0.5907716245, 1.2129457521, 2.1116200869],
                                 [-0.6401837602, 0.1786114697, 0.8152771199, 1.3909083844, 3.0203933639]])
    # dim: the items along dim 0 give the transposed result
    torch.testing.assert_close(C.soft_rank(X.T, dim=0), C.soft_rank(X).T)


def test_cross_entropy_equals_the_official():
    target = torch.tensor([[2, 0, 4, 1, 3], [3, 2, 0, 1, 4]])
    _close(C.cross_entropy(X, target, reduction="none"), [4.5031232472, 4.4957292148])
    _close(C.cross_entropy(X, target, 0.5, reduction="none"), [2.8164536325, 3.0415408204])
    _close(C.cross_entropy(X, target), (4.5031232472 + 4.4957292148) / 2)
    # the hard limit: the true ascending ranks give a loss -> 0 (row 0: no ties; the tied pair of row 1 would keep
    # ½ each, 2 log 2), and reversed ranks far apart give a finite loss, not log 0
    true = X[:1].argsort(1).argsort(1)
    assert float(C.cross_entropy(X[:1], true, 0.002)) < 1e-12  # gaps >= 0.2: e^{-0.1/α} terms
    assert torch.isfinite(C.cross_entropy(X[:1] * 1e3, true.flip(1), 1.0))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        C.cross_entropy(X, target, -1.0)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        C.cross_entropy(X, target + 1)


def test_tensor_alpha_gradients():
    """A tensor alpha that requires grad: gradcheck in alpha (and x) for every function."""
    x = X.clone().requires_grad_()
    target = torch.tensor([[2, 0, 4, 1, 3], [3, 2, 0, 1, 4]])
    for f in (lambda z, a: C.soft_topk(z, K, a), lambda z, a: C.log_soft_topk(z, K, a, largest=False),
              lambda z, a: C.soft_rank(z, -a), lambda z, a: C.soft_sort(z, a),
              lambda z, a: C.cross_entropy(z, target, a)):
        assert gradcheck(f, (x, torch.tensor(0.7, dtype=F64, requires_grad=True)))


def test_shapes_and_errors():
    x = torch.randn(2, 3, 6, dtype=F64)
    k = torch.full((2, 1, 6), 2.0, dtype=F64)
    p = C.soft_topk(x, k, 1.0, dim=1)
    assert p.shape == x.shape
    torch.testing.assert_close(p.sum(1), torch.full((2, 6), 2.0, dtype=F64))
    torch.testing.assert_close(C.soft_topk(x, k[:, 0], 1.0, dim=1), p)  # k without the items' dimension
    assert C.soft_topk(X, torch.tensor([[1.0, 2.5], [2.0, 3.0]], dtype=F64), 1.0).shape == (2, 2, 5)
    with pytest.raises(ValueError, match="2-D"):
        C.soft_topk(x, torch.full((2, 2, 6), 2.0, dtype=F64), 1.0)
    with pytest.raises(ValueError, match="non-zero"):
        C.soft_rank(X, 0.0)
    with pytest.raises(ValueError, match="k must satisfy"):
        C.log_soft_topk(X, K * 10, 1.0)


@pytest.mark.parametrize("dim", [2, 3, -3])
def test_dim_outside_the_range_of_x_raises_instead_of_wrapping_round(dim):
    """dim = 2 of a 2-D x used to be taken modulo 2, i.e. the top-k over the rows (every column summing to k); as in
    torch, a dim outside [-x.dim(), x.dim()) is an IndexError naming it."""
    x = torch.randn(3, 6, dtype=F64)
    for call in (lambda: C.soft_topk(x, 2, -1.0, dim=dim), lambda: C.log_soft_topk(x, 2, -1.0, dim=dim),
                 lambda: C.soft_rank(x, -1.0, dim=dim), lambda: C.soft_sort(x, -1.0, dim=dim)):
        with pytest.raises(IndexError, match=f"dim = {dim} is out of range"):
            call()
    torch.testing.assert_close(C.soft_rank(x, -1.0, dim=-2), C.soft_rank(x, -1.0, dim=0))  # in range: as before


def test_arguments_of_the_wrong_type_are_named():
    """k as a list, a string or a complex tensor, dim as a float or a bool, alpha as a string, a two-element array or
    a meta tensor, and integer scores each raise an error naming the argument (k = [1., 2.] used to fail inside
    float(), dim = 1.0 inside movedim(), and k = '2' or alpha = '2' was read as the number 2)."""
    with pytest.raises(TypeError, match=r"k must be a real number or a tensor .* got list \[1.0, 2.0\]"):
        C.soft_topk(X, [1.0, 2.0], -1.0)
    with pytest.raises(TypeError, match="k must be a real number"):
        C.soft_topk(X, "2", -1.0)
    with pytest.raises(TypeError, match="k must be a real tensor"):
        C.soft_topk(X, torch.tensor(2 + 0j), -1.0)
    for dim in (1.0, True, "1"):
        with pytest.raises(TypeError, match="dim must be an integer"):
            C.soft_rank(X, -1.0, dim=dim)
    for alpha in ("2", np.array([1.0, 2.0]), torch.tensor(1.0, device="meta"), True):
        with pytest.raises(ValueError, match="alpha"):
            C.soft_sort(X, alpha)
    with pytest.raises(TypeError, match="x must be floating point"):
        C.soft_rank(torch.tensor([[1, 3, 2]]), -1.0)
    # the integer-like forms are what they say
    torch.testing.assert_close(C.soft_rank(X, np.array([-0.5]), dim=np.int64(1)), C.soft_rank(X, -0.5))
