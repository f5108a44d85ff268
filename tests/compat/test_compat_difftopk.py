"""diffrank.compat.difftopk: difftopk's README examples give difftopk's numbers, with difftopk's own defaults."""

from __future__ import annotations

import contextlib
import importlib.util
import io

import numpy as np
import pytest
import torch

from diffrank.compat.difftopk import LOSS_DEFAULTS, NET_DEFAULTS, DiffTopkNet, TopKCrossEntropyLoss


@pytest.fixture(scope="module")
def difftopk():
    with contextlib.redirect_stdout(io.StringIO()):  # it prints a note when torch-sparse is missing
        return pytest.importorskip("difftopk")


def _readme_loss_kwargs(**kw) -> dict:
    # difftopk's README, "TopKCrossEntropyLoss"
    return dict(diffsort_method="odd_even", inverse_temperature=2, p_k=[.5, 0., 0., 0., .5], n=1000, m=16,
                distribution="cauchy", art_lambda=None, device="cpu", top1_mode="sm") | kw


def _logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 1000, generator=g) * 3, torch.randint(0, 1000, (8,), generator=g)


def _both(ref_loss, our_loss, x, y):
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    la, lb = ref_loss(a, y), our_loss(b, y)
    la.backward()
    lb.backward()
    return la, lb, a.grad, b.grad


def test_readme_loss_example_equals_difftopk(difftopk):
    x, y = _logits()
    la, lb, ga, gb = _both(difftopk.TopKCrossEntropyLoss(**_readme_loss_kwargs()),
                           TopKCrossEntropyLoss(**_readme_loss_kwargs()), x, y)
    assert abs(la.item() - lb.item()) < 1e-5
    torch.testing.assert_close(gb, ga, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("method", ["bitonic__non_sparse", "neuralsort", "softsort"])
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
def test_loss_methods_and_modes_equal_difftopk(difftopk, method, top1_mode):
    x, y = _logits()
    kw = _readme_loss_kwargs(diffsort_method=method, top1_mode=top1_mode, p_k=[.2] * 5, distribution="logistic_phi",
                             art_lambda=0.5)
    la, lb, ga, gb = _both(difftopk.TopKCrossEntropyLoss(**kw), TopKCrossEntropyLoss(**kw), x, y)
    assert abs(la.item() - lb.item()) < 1e-5
    torch.testing.assert_close(gb, ga, atol=1e-6, rtol=1e-5)


def test_default_top1_mode_is_difftopks(difftopk):
    kw = _readme_loss_kwargs()
    del kw["top1_mode"]
    x, y = _logits()
    la, lb, _, _ = _both(difftopk.TopKCrossEntropyLoss(**kw), TopKCrossEntropyLoss(**kw), x, y)
    assert abs(la.item() - lb.item()) < 1e-5
    assert LOSS_DEFAULTS == {"m": None, "distribution": None, "art_lambda": 0.25, "top1_mode": "sm"}


def test_readme_difftopknet_example_equals_difftopk(difftopk):
    # difftopk's README, "DiffTopkNet"; its sparse path needs torch-sparse, the dense one is the same network
    sparse = importlib.util.find_spec("torch_sparse") is not None
    kw = dict(sorting_network_type="bitonic", size=16, k=5, device="cpu", steepness=10.0, art_lambda=0.25,
              distribution="cauchy")
    sorter = DiffTopkNet(sparse=True, **kw)
    ref = difftopk.DiffTopkNet(sparse=sparse, **kw)
    torch.manual_seed(0)
    x = torch.randperm(16).unsqueeze(0).float() * 100.
    torch.testing.assert_close(x @ sorter(x)[1][0], x @ ref(x)[1][0], atol=1e-3, rtol=1e-6)
    assert sorter(x)[0] is None


@pytest.mark.parametrize("network", ["bitonic", "odd_even"])
def test_defaults_and_orientation_equal_difftopk(difftopk, network):
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    _, ours = DiffTopkNet(network, 16, 4)(x)
    _, ref = difftopk.DiffTopkNet(network, 16, 4)(x)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    assert NET_DEFAULTS == {"sparse": False, "steepness": 10.0, "art_lambda": 0.25, "distribution": "cauchy"}


def test_splitter_loss_is_difftopks_formula_on_the_network_built_for_len_pk():
    """difftopk builds the splitter for k = len(p_k) (its sparse path, not runnable without torch-sparse); diffrank's
    loss builds it for the largest k it needs: the top rows agree, and the loss is difftopk's 'sm' formula."""
    from diffrank.operators.sorting_network import ComparatorNetwork

    x = torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.arange(4)
    kw = dict(diffsort_method="splitter_selection", inverse_temperature=1.0, p_k=[.5, .5, 0, 0, 0], n=16,
              distribution="logistic")
    op = ComparatorNetwork(beta=1.0, sigmoid="logistic", network="splitter_selection")
    # the rows of the network built for k = 5, as difftopk's forward returns them
    rows = op.topk_rows(x, 5)
    mix = 0.5 * torch.softmax(x, 1)[y, y] + 0.5 * rows[:, :2].sum(1)[y, y]
    expect = -torch.log(mix * (1 - 2e-7) + 1e-7).mean()
    torch.testing.assert_close(TopKCrossEntropyLoss(**kw)(x, y), expect)
    torch.testing.assert_close(op.topk_rows(x, 2), rows[:, :2], atol=1e-15, rtol=0)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="sparse=True"):
        DiffTopkNet("splitter_selection", 8, 2)
    with pytest.raises(ValueError, match="needs a distribution"):
        TopKCrossEntropyLoss("odd_even", 1.0, [.5, .5], n=10)
    with pytest.raises(ValueError, match="sum up to 1"):
        TopKCrossEntropyLoss("softsort", 1.0, [.5, .4], n=10)
    with pytest.raises(ValueError, match="m < n"):
        TopKCrossEntropyLoss("softsort", 1.0, [.5, .5], n=10, m=10)
    with pytest.raises(ValueError, match="unknown diffsort_method"):
        TopKCrossEntropyLoss("sinkhorn_sort", 1.0, [1.0], n=10)
    with pytest.raises(ValueError, match=r"shape \(B, 8\)"):
        DiffTopkNet("bitonic", 8, 2)(torch.randn(1, 9))


def test_a_real_k_or_size_is_refused_not_truncated():
    """DiffTopkNet('bitonic', 6, 2.7) returned the top 2 (int(2.7)), and k = 1.9 the top 1; difftopk takes an integer
    k, so a real one is a TypeError naming k (and likewise size)."""
    for k in (2.7, 1.9, 2.0, "2"):
        with pytest.raises(TypeError, match="k must be an integer"):
            DiffTopkNet("bitonic", 6, k)
    with pytest.raises(TypeError, match="size must be an integer"):
        DiffTopkNet("bitonic", 6.5, 2)
    for k in (0, 7):
        with pytest.raises(ValueError, match="k must"):
            DiffTopkNet("bitonic", 6, k)
    assert DiffTopkNet("bitonic", 6, np.int64(2))(torch.randn(3, 6))[1].shape == (3, 6, 2)


def test_the_loss_names_its_own_arguments():
    """Logits with 5 classes for a loss built with n = 10, m = 8 were refused by diffrank's loss with 'm-subset size
    m = 8 exceeds the number of classes n = 5 (set loss.m=null ...)': a Hydra key, and not the declared n. The call
    names n and the shape; a bad inverse_temperature, n, m or p_k is reported under its own name."""
    loss = TopKCrossEntropyLoss("bitonic", 1.0, [0.5, 0.5], n=10, m=8, distribution="cauchy")
    with pytest.raises(ValueError, match=r"outputs must have n = 10 classes .* got shape \(4, 5\)") as e:
        loss(torch.randn(4, 5), torch.tensor([0, 1, 2, 3]))
    assert "loss.m" not in str(e.value)
    with pytest.raises(ValueError, match="inverse_temperature must be a finite positive number"):
        TopKCrossEntropyLoss("softsort", -1.0, [0.5, 0.5], n=10)
    with pytest.raises(TypeError, match="n must be an integer"):
        TopKCrossEntropyLoss("softsort", 1.0, [0.5, 0.5], n=10.5)
    with pytest.raises(TypeError, match="m must be an integer"):
        TopKCrossEntropyLoss("softsort", 1.0, [0.5, 0.5], n=10, m=4.5)
    with pytest.raises(ValueError, match="p_k must be a sequence of numbers"):
        TopKCrossEntropyLoss("softsort", 1.0, ["half", "half"], n=10)
    assert loss(torch.randn(4, 10), torch.tensor([0, 1, 2, 3])).isfinite()
