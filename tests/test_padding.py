"""Variable-length lists: for every method × function of :mod:`diffrank.functional`, a batch of padded sets (real
items anywhere, a mask drawn by hypothesis, or right padding with ``lengths``) gives each set's real items exactly
what the same set unpadded gives, values and gradients (1e-12 in float64); padded items get the documented value
(rank 0, membership 0, sorted value 0, zero columns of P) and no gradient; a set without real items gives zeros."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import diffrank.functional as F
from diffrank.operators import available
from helpers import load_deterministic as load

N, K = 6, 2
# fixed iterations: the default stopping rule of Sinkhorn reads the worst row of the batch, so the same set would stop
# elsewhere in another batch
OPTIONS = {"sinkhorn": {"tolerance": None, "max_iter": 60}, "gumbel_sinkhorn": {"tolerance": None, "max_iter": 60}}
CAPABILITIES = {"soft_rank": "soft_rank", "soft_sort": "soft_sort", "topk_membership": "topk_membership",
                "permutation_matrix": "permutation"}


def _call(fn: str, method: str, x, **kw):
    op = load(method, **OPTIONS.get(method, {}))
    if fn == "topk_membership":
        return F.topk_membership(x, K, method=op, **kw)
    return getattr(F, fn)(x, method=op, **kw)


CELLS = [(m, fn) for m in available() for fn, cap in CAPABILITIES.items() if cap in load(m).capabilities]


@pytest.mark.parametrize("method, fn", CELLS, ids=[f"{m}-{f}" for m, f in CELLS])
@settings(max_examples=4, deadline=None, derandomize=True)
@given(data=st.data())
def test_padding_changes_nothing(method, fn, data):
    masks = [data.draw(st.lists(st.booleans(), min_size=N, max_size=N)) for _ in range(3)]
    masks[0] = [True] * N  # one full set
    mask = torch.tensor(masks)
    x = (torch.randn(3, N, dtype=torch.float64, generator=torch.Generator().manual_seed(len(masks[1])))
         * 2 / float(load(method).beta)).requires_grad_()
    out = _call(fn, method, x, mask=mask)
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (grad,) = torch.autograd.grad((out * g).sum(), x)
    for b in range(3):
        real = mask[b]
        length = int(real.sum())
        if length == 0:
            assert not out[b].any() and not grad[b].any()
            continue
        xr = x.detach()[b, real].unsqueeze(0).requires_grad_()
        if fn == "topk_membership" and length < K:
            want = F.topk_membership(xr, length, method=load(method, **OPTIONS.get(method, {})))
        else:
            want = _call(fn, method, xr)
        if fn == "permutation_matrix":
            got, gb = out[b][:length][:, real].unsqueeze(0), g[b][:length][:, real].unsqueeze(0)
            assert not out[b][:, ~real].any() and not out[b][length:].any()
        elif fn == "soft_sort":
            got, gb = out[b, :length].unsqueeze(0), g[b, :length].unsqueeze(0)
            assert not out[b, length:].any()
        else:
            got, gb = out[b, real].unsqueeze(0), g[b, real].unsqueeze(0)
            assert not out[b, ~real].any()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        # a set of one item may have a constant result (a network without comparators)
        want_grad = torch.autograd.grad((want * gb).sum(), xr)[0] if want.requires_grad else torch.zeros_like(xr)
        torch.testing.assert_close(grad[b, real].unsqueeze(0), want_grad, rtol=0, atol=1e-12)
        assert not grad[b, ~real].any()


def test_lengths_are_right_padding_along_any_dim():
    x = torch.randn(4, 2, dtype=torch.float64)  # items along dim 0, two sets
    lengths = torch.tensor([4, 2])
    mask = torch.arange(4).unsqueeze(1) < lengths
    for fn in ("soft_rank", "soft_sort", "topk_membership"):
        torch.testing.assert_close(_call(fn, "softsort", x, dim=0, lengths=lengths),
                                   _call(fn, "softsort", x, dim=0, mask=mask), rtol=0, atol=0)
    torch.testing.assert_close(F.soft_quantile(x, 0.5, method="softsort", dim=0, lengths=lengths, hard=True),
                               torch.stack([x[:4, 0].quantile(0.5), x[:2, 1].quantile(0.5)]))
    got = F.soft_argsort(x, method="neuralsort", dim=0, lengths=lengths, hard=True)
    assert got[:, 1].tolist() == [*x[:2, 1].argsort().double().tolist(), -1.0, -1.0]
    top = F.soft_topk_indices(x, 3, method="neuralsort", dim=0, lengths=lengths, hard=True)
    assert top.indices[:, 1].tolist() == [*x[:2, 1].topk(2).indices.double().tolist(), -1.0]


def test_bad_masks_and_lengths_are_named():
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        F.soft_rank(x, method="softsort", mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="mask's shape must be x's"):
        F.soft_rank(x, method="softsort", mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, n = 5\]"):
        F.soft_rank(x, method="softsort", lengths=torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="lengths must be an integer tensor of the batch shape"):
        F.soft_rank(x, method="softsort", lengths=torch.tensor([5.0, 2.0]))
    with pytest.raises(ValueError, match="mask or lengths, not both"):
        F.soft_rank(x, method="softsort", lengths=torch.tensor([5, 2]), mask=torch.ones(2, 5, dtype=torch.bool))


METHODS = {"soft_rank": "soft_rank", "soft_sort": "soft_sort", "topk_membership": "topk_membership",
           "forward": "permutation"}
OP_CELLS = [(m, fn) for m in available() for fn, cap in METHODS.items() if cap in load(m).capabilities]


@pytest.mark.parametrize("method, fn", OP_CELLS, ids=[f"{m}-{f}" for m, f in OP_CELLS])
def test_operator_methods_take_a_mask(method, fn):
    """The operator methods (scores (B, n), rows = ranks) take the same mask: each set as if unpadded."""
    op = load(method, **OPTIONS.get(method, {}))
    mask = torch.tensor([[True] * N, [False, True, True, False, True, False], [False] * N, [True] + [False] * 5])
    x = (torch.randn(4, N, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
         * 2 / float(op.beta)).requires_grad_()
    call = {"topk_membership": lambda s, **kw: op.topk_membership(s, [K], **kw)[:, 0],
            "forward": lambda s, **kw: op(s, **kw)}.get(fn, getattr(op, fn))
    out = call(x, mask=mask)
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
    (grad,) = torch.autograd.grad((out * g).sum(), x)
    for b in range(4):
        real, length = mask[b], int(mask[b].sum())
        if length == 0:
            assert not out[b].any() and not grad[b].any()
            continue
        xr = x.detach()[b, real].unsqueeze(0).requires_grad_()
        want = op.topk_membership(xr, [min(K, length)])[:, 0] if fn == "topk_membership" else \
            (op(xr) if fn == "forward" else getattr(op, fn)(xr))
        if fn == "forward":
            got, gb = out[b][:length][:, real], g[b][:length][:, real]
        elif fn == "soft_sort":
            got, gb = out[b, :length], g[b, :length]
        else:
            got, gb = out[b, real], g[b, real]
        torch.testing.assert_close(got.unsqueeze(0), want, rtol=0, atol=1e-12)
        want_grad = torch.autograd.grad((want * gb).sum(), xr)[0] if want.requires_grad else torch.zeros_like(xr)
        torch.testing.assert_close(grad[b, real].unsqueeze(0), want_grad, rtol=0, atol=1e-12)
        assert not grad[b, ~real].any()


def test_operator_mask_is_checked():
    op = load("softsort")
    with pytest.raises(ValueError, match="mask must be a bool tensor of the scores' shape"):
        op.soft_rank(torch.randn(2, 5), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="adds a samples dimension"):
        load("neuralsort_stochastic", samples=3).soft_rank(torch.randn(2, 5), mask=torch.ones(2, 5, dtype=torch.bool))
