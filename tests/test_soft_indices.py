"""Soft indices and sort by key in :mod:`diffrank.functional`: ``soft_sort(values, key=…)``, ``soft_argsort``,
``soft_topk_indices`` and ``soft_take_along_dim`` against torch's hard functions (hard=True exactly, large β
closely), against the operators' own soft sort where that is ``P @ s``, and gradcheck in float64."""

from __future__ import annotations

import pytest
import torch

import diffrank.functional as F

P_SORTS = ("neuralsort", "softsort", "sinkhorn", "diffsort_bitonic")  # soft_sort is P @ s for these


def _scores(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("method", P_SORTS)
@pytest.mark.parametrize("descending", [False, True])
def test_sorting_by_itself_is_the_soft_sort(method, descending):
    x = _scores(3, 6)
    torch.testing.assert_close(F.soft_sort(x, key=x, method=method, descending=descending),
                               F.soft_sort(x, method=method, descending=descending), rtol=0, atol=1e-12)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_by_key_carries_trailing_dims_and_is_exact_when_hard(descending):
    key, v = _scores(2, 5), _scores(2, 5, 3, seed=1)
    order = torch.sort(key, dim=1, descending=descending, stable=True).indices
    hard = F.soft_sort(v, key=key, method="neuralsort", descending=descending, hard=True)
    assert torch.equal(hard, torch.take_along_dim(v, order[..., None], 1))
    sharp = F.soft_sort(v, key=key, method="neuralsort", beta=1e4, descending=descending)
    torch.testing.assert_close(sharp, hard, rtol=0, atol=1e-9)
    # each trailing column is sorted by the same relaxed permutation
    p = F.permutation_matrix(key, method="neuralsort")
    p = p if descending else p.flip(-2)
    torch.testing.assert_close(F.soft_sort(v, key=key, method="neuralsort", descending=descending),
                               torch.einsum("brn,bnd->brd", p, v))


def test_sort_by_key_along_another_dim():
    key, v = _scores(4, 6), _scores(4, 6, 2, seed=1)
    moved = F.soft_sort(v.transpose(0, 1), key=key.T, dim=0, method="softsort")
    torch.testing.assert_close(moved, F.soft_sort(v, key=key, dim=1, method="softsort").transpose(0, 1))


def test_sort_by_key_gradcheck_in_values_and_key():
    key, v = _scores(2, 4).requires_grad_(), _scores(2, 4, 2, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: F.soft_sort(b, key=a, method="neuralsort", beta=2.0), (key, v))
    assert torch.autograd.gradgradcheck(lambda a, b: F.soft_sort(b, key=a, method="neuralsort", beta=2.0), (key, v))


def test_sort_by_key_refuses_mismatched_shapes_and_methods_without_p():
    with pytest.raises(ValueError, match=r"key's shape \(2, 5\) must be the leading part of x's \(2, 4\)"):
        F.soft_sort(_scores(2, 4), key=_scores(2, 5), method="neuralsort")
    with pytest.raises(ValueError, match="permutation"):
        F.soft_sort(_scores(2, 4), key=_scores(2, 4), method="fast_soft_sort")


@pytest.mark.parametrize("descending", [False, True])
def test_soft_argsort_tends_to_argsort(descending):
    x = _scores(3, 7)
    want = torch.argsort(x, dim=-1, descending=descending, stable=True).to(x.dtype)
    assert torch.equal(F.soft_argsort(x, method="softsort", descending=descending, hard=True), want)
    torch.testing.assert_close(F.soft_argsort(x, method="softsort", beta=1e4, descending=descending), want,
                               rtol=0, atol=1e-9)
    soft = F.soft_argsort(x, method="softsort", beta=0.5, descending=descending)
    assert ((soft >= 0) & (soft <= 6)).all() and not torch.equal(soft, want)
    y = x.requires_grad_()
    assert torch.autograd.gradcheck(lambda s: F.soft_argsort(s, method="neuralsort", descending=descending), (y,))


def test_soft_topk_indices_and_take_along_dim():
    x, v = _scores(3, 8), _scores(3, 8, 4, seed=1)
    top = torch.topk(x, 3, dim=-1)
    hard = F.soft_topk_indices(x, 3, method="diffsort_bitonic", hard=True)
    assert torch.equal(hard.indices, top.indices.to(x.dtype)) and hard.one_hot.shape == (3, 3, 8)
    gathered = torch.take_along_dim(v, top.indices[..., None], 1)
    assert torch.equal(F.soft_take_along_dim(v, hard.one_hot, dim=1), gathered)
    assert torch.equal(F.soft_take_along_dim(x, hard.one_hot), top.values)
    soft = F.soft_topk_indices(x, 3, method="softsort", beta=2.0)
    torch.testing.assert_close(soft.one_hot.sum(-1), torch.ones(3, 3, dtype=x.dtype))
    sharp = F.soft_topk_indices(x, 3, method="softsort", beta=1e4)
    torch.testing.assert_close(sharp.indices, top.indices.to(x.dtype), rtol=0, atol=1e-9)
    y = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda s: F.soft_topk_indices(s, 2, method="softsort").indices, (y,))
    assert torch.autograd.gradcheck(lambda s: F.soft_take_along_dim(v, F.soft_topk_indices(
        s, 2, method="neuralsort").one_hot, dim=1), (y,))


def test_soft_topk_indices_along_a_middle_dim():
    x = _scores(2, 6, 3)  # items along dim 1, batch (2, 3)
    got = F.soft_topk_indices(x, 2, method="neuralsort", dim=1, hard=True)
    assert torch.equal(got.indices, torch.topk(x, 2, dim=1).indices.to(x.dtype))
    assert got.one_hot.shape == (2, 3, 2, 6)


def test_take_along_dim_refuses_shapes_that_do_not_match():
    w = torch.ones(2, 3, 5) / 5
    with pytest.raises(ValueError, match="do not match one_hot"):
        F.soft_take_along_dim(torch.zeros(2, 4), w, dim=1)
    with pytest.raises(IndexError, match="dim = 2 is out of range"):
        F.soft_take_along_dim(torch.zeros(2, 5), w, dim=2)
    with pytest.raises(TypeError, match="must be torch.Tensors"):
        F.soft_take_along_dim([[1.0]], w)
