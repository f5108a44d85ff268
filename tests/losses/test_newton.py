"""Newton losses (thesis §7.3): z* of each variant against a float64 Newton step by hand, the three ways of
getting per-sample derivatives, the λ → ∞ limit, the sorting and top-k losses, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from diffrank.losses.knn import NeighbourLoss
from diffrank.losses.newton import (
    NewtonLoss,
    newton_step,
    per_sample_derivatives,
    per_sample_derivatives_func,
    wrap_newton,
)
from diffrank.losses.softmax_ce import SoftmaxCrossEntropyLoss
from diffrank.losses.sorting import SortingBCELoss
from diffrank.losses.topk_cross_entropy import TopKCrossEntropyLoss, m_subset
from diffrank.operators import load

VARIANTS = ("hessian", "fisher", "elementwise_hessian")


class Quartic(nn.Module):
    """ℓ_i(y) = ½(y − a_i)ᵀA_i(y − a_i) + c Σ_j (y_j − a_ij)⁴, batch mean: known gradients and Hessians."""

    def __init__(self, mats: torch.Tensor, c: float = 0.3) -> None:
        super().__init__()
        self.mats, self.c = mats, c

    def forward(self, y, a):
        r = y - a
        quad = 0.5 * torch.einsum("bi,bij,bj->b", r, self.mats, r)
        return (quad + self.c * (r**4).sum(1)).mean()

    def by_hand(self, y, a):
        """numpy float64 per-sample gradients and Hessians."""
        r = (y - a).numpy()
        mats = self.mats.numpy()
        g = np.einsum("bij,bj->bi", mats, r) + 4 * self.c * r**3
        h = mats + np.stack([np.diag(12 * self.c * ri**2) for ri in r])
        return g, h


def _spd(b, d, gen):
    m = torch.randn(b, d, d, generator=gen, dtype=torch.float64)
    return m @ m.transpose(1, 2) + 0.5 * torch.eye(d, dtype=torch.float64)


def _z_from_newton_loss(loss, y, *targets):
    """z* read off the Newton loss: with reduction='sum' its gradient with respect to y is y − z* (Eq. 7.27)."""
    leaf = y.clone().requires_grad_(True)
    loss(leaf, *targets).backward()
    return (leaf - leaf.grad).detach()


def _by_hand_step(y, g, h, variant, lam):
    y = y.numpy()
    d = y.shape[1]
    if variant == "fisher":
        m = g.T @ g / len(g) + lam * np.eye(d)
        return y - np.linalg.solve(m, g.T).T
    if variant == "hessian":
        return y - np.linalg.solve(h.mean(0) + lam * np.eye(d), g.T).T
    return y - np.stack([np.linalg.solve(hi + lam * np.eye(d), gi) for hi, gi in zip(h, g)])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("derivatives", ["autograd", "func"])
@pytest.mark.parametrize("lam", [0.0, 0.7])
def test_each_variant_is_the_newton_step_by_hand(variant, derivatives, lam):
    gen = torch.Generator().manual_seed(0)
    b, d = 5, 3
    loss = Quartic(_spd(b, d, gen))
    y = torch.randn(b, d, generator=gen, dtype=torch.float64)
    a = torch.randn(b, d, generator=gen, dtype=torch.float64)
    g, h = loss.by_hand(y, a)
    expected = _by_hand_step(y, g, h, variant, lam)
    if derivatives == "func":  # a pure per-sample function: torch.func (vmap over grad / hessian)
        def fn(y_i, a_i, m_i):
            r = y_i - a_i
            return 0.5 * r @ m_i @ r + loss.c * (r**4).sum()

        def how(y_, a_):
            return per_sample_derivatives_func(fn, y_, a_, loss.mats, hessian=variant != "fisher")

        newton = NewtonLoss(loss, variant, lam, derivatives=how, reduction="sum")
    else:
        newton = NewtonLoss(loss, variant, lam, derivatives="autograd", reduction="sum")
    z = _z_from_newton_loss(newton, y, a)
    np.testing.assert_allclose(z.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_elementwise_newton_on_a_quadratic_lands_on_its_minimum():
    """Example 7.1 generalised: for ℓ_i quadratic, z*_E = a_i (one Newton step solves it)."""
    gen = torch.Generator().manual_seed(1)
    loss = Quartic(_spd(4, 3, gen), c=0.0)
    y, a = torch.randn(4, 3, dtype=torch.float64, generator=gen), torch.randn(4, 3, dtype=torch.float64, generator=gen)
    z = _z_from_newton_loss(NewtonLoss(loss, "elementwise_hessian", reduction="sum"), y, a)
    torch.testing.assert_close(z, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("derivatives", ["auto", "closed_form", "autograd"])
def test_softmax_ce_step_by_hand(variant, derivatives):
    """Example 7.2, Eqs. 7.31–7.33: H = diag(q) − qqᵀ, g = q − p, by hand in numpy (λ = 0.5: H is singular)."""
    gen = torch.Generator().manual_seed(2)
    y = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 4, (6,), generator=gen)
    q = torch.softmax(y, 1).numpy()
    p = np.eye(4)[labels.numpy()]
    g = q - p
    h = np.stack([np.diag(qi) - np.outer(qi, qi) for qi in q])
    expected = _by_hand_step(y, g, h, variant, 0.5)
    newton = NewtonLoss(SoftmaxCrossEntropyLoss(), variant, 0.5, derivatives=derivatives, reduction="sum")
    np.testing.assert_allclose(_z_from_newton_loss(newton, y, labels).numpy(), expected, rtol=1e-10, atol=1e-12)


def test_mean_reduction_is_the_sum_over_the_batch():
    gen = torch.Generator().manual_seed(3)
    y = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (8,), generator=gen)
    mean = NewtonLoss(SoftmaxCrossEntropyLoss(), "fisher", 0.1)(y, labels)
    total = NewtonLoss(SoftmaxCrossEntropyLoss(), "fisher", 0.1, reduction="sum")(y, labels)
    assert total.item() == pytest.approx(8 * mean.item(), rel=1e-12)


def _sorting_loss(name="neuralsort"):
    return SortingBCELoss(load(name, beta=1.0))


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_sorting_loss_hessians_match_finite_differences(name):
    """d = n: the per-sample Hessian blocks of a sorting loss by double backward equal central differences."""
    gen = torch.Generator().manual_seed(4)
    loss = _sorting_loss(name)
    s = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    values = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    _, g, h = per_sample_derivatives(loss, s, values)
    eps, fd = 1e-5, torch.zeros_like(h)
    for k in range(5):
        e = torch.zeros_like(s)
        e[:, k] = eps
        gp = per_sample_derivatives(loss, s + e, values, hessian=False)[1]
        gm = per_sample_derivatives(loss, s - e, values, hessian=False)[1]
        fd[:, :, k] = (gp - gm) / (2 * eps)
    torch.testing.assert_close(h, fd, rtol=1e-6, atol=1e-8)
    # per-sample gradients: B times the gradient of the batch mean
    leaf = s.clone().requires_grad_(True)
    loss(leaf, values).backward()
    torch.testing.assert_close(g, 3 * leaf.grad)


@pytest.mark.parametrize("variant", ["hessian", "fisher"])
def test_top_k_cross_entropy_splits_at_the_m_subset(variant):
    """d = m: z* is taken for the m-subset scores; classes outside the subset get no gradient."""
    gen = torch.Generator().manual_seed(5)
    topk = TopKCrossEntropyLoss(load("neuralsort", beta=1.0), [0.5, 0, 0, 0, 0.5], m=6)
    logits = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 12, (4,), generator=gen)
    newton = NewtonLoss(topk, variant, 0.1, reduction="sum")
    leaf = logits.clone().requires_grad_(True)
    newton(leaf, labels).backward()
    assert ((leaf.grad != 0).sum(1) <= 6).all()
    # by hand: the same step on the m-subset with the loss restricted to it (m = None, truth in column 0)
    sub = m_subset(logits, labels, 6)
    inner = TopKCrossEntropyLoss(topk.operator, topk.p_k, m=None)
    _, g, h = per_sample_derivatives(inner, sub, torch.zeros_like(labels))
    z = newton_step(sub, g, h, variant, 0.1)
    others = logits.scatter(1, labels[:, None], float("-inf")).topk(5, dim=1).indices
    columns = torch.cat([labels[:, None], others], dim=1)  # the subset's classes, ground truth first
    expected = torch.zeros_like(logits).scatter_add(1, columns, sub - z)
    torch.testing.assert_close(leaf.grad, expected)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ["softmax_ce", "neuralsort"])
def test_large_tikhonov_gives_the_plain_gradient_direction(variant, case):
    """(H + λI)⁻¹ g → g / λ: the Newton loss's gradient turns into the plain loss's gradient (times 1/λ)."""
    gen = torch.Generator().manual_seed(6)
    if case == "softmax_ce":
        loss, y = SoftmaxCrossEntropyLoss(), torch.randn(8, 5, generator=gen, dtype=torch.float64)
        target = torch.randint(0, 5, (8,), generator=gen)
    else:
        loss, y = _sorting_loss(), torch.randn(8, 5, generator=gen, dtype=torch.float64)
        target = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    leaf = y.clone().requires_grad_(True)
    loss(leaf, target).backward()
    plain = leaf.grad.flatten()
    gaps = []
    for lam in (1e1, 1e3, 1e6):
        leaf = y.clone().requires_grad_(True)
        NewtonLoss(loss, variant, lam)(leaf, target).backward()
        newton = leaf.grad.flatten()
        gaps.append(1 - torch.nn.functional.cosine_similarity(newton, plain, dim=0).item())
        if lam == 1e6:
            torch.testing.assert_close(lam * newton, plain, rtol=1e-4, atol=1e-9)
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-9


def test_custom_autograd_operators_refuse_hessians_but_take_fisher():
    loss = SortingBCELoss(load("lapsum", beta=1.0))
    s, values = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="variant='fisher'"):
        NewtonLoss(loss, "hessian", 0.1)(s.requires_grad_(True), values)
    out = NewtonLoss(loss, "fisher", 0.1)(s, values)
    assert torch.isfinite(out)


def test_float64_derivatives_where_float32_second_derivatives_overflow():
    """Sinkhorn at β = 100: its float32 double backward gives NaN (refused, named); float64=True is finite."""
    torch.manual_seed(0)
    loss = SortingBCELoss(load("sinkhorn", beta=100.0))
    s, values = torch.randn(4, 5), torch.randn(4, 5)
    with pytest.raises(ValueError, match="NaN or inf"):
        NewtonLoss(loss, "hessian", 0.1)(s.clone().requires_grad_(True), values)
    leaf = s.clone().requires_grad_(True)
    out = NewtonLoss(loss, "hessian", 0.1, float64=True)(leaf, values)
    out.backward()
    assert out.dtype == torch.float32 and torch.isfinite(leaf.grad).all()
    _, g, h = per_sample_derivatives(loss, s.double(), values)
    torch.testing.assert_close(leaf.grad, ((s.double() - newton_step(s.double(), g, h, "hessian", 0.1)) / 4).float())


def test_without_autograd_the_wrapped_loss_is_returned():
    y, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    with torch.no_grad():
        assert NewtonLoss(SoftmaxCrossEntropyLoss(), "fisher", 0.1)(y, labels) == SoftmaxCrossEntropyLoss()(y, labels)


def test_properties_forward_the_wrapped_loss():
    topk = TopKCrossEntropyLoss(load("neuralsort"), [0.5, 0.5], m=None)
    newton = wrap_newton(topk, "fisher", 0.1)
    assert newton.operator is topk.operator and newton.p_k is topk.p_k
    assert wrap_newton(topk, "none") is topk and wrap_newton(None, "none") is None


def test_errors_name_the_argument():
    loss = SoftmaxCrossEntropyLoss()
    with pytest.raises(ValueError, match="variant"):
        NewtonLoss(loss, "newton")
    with pytest.raises(ValueError, match="tikhonov"):
        NewtonLoss(loss, "fisher", -1.0)
    with pytest.raises(ValueError, match="tikhonov"):
        NewtonLoss(loss, "fisher", float("nan"))
    with pytest.raises(ValueError, match="derivatives"):
        NewtonLoss(loss, "fisher", derivatives="numeric")
    with pytest.raises(ValueError, match="closed_form"):
        NewtonLoss(_sorting_loss(), "fisher", derivatives="closed_form")
    with pytest.raises(ValueError, match="needs a loss"):
        wrap_newton(None, "fisher")
    y = torch.randn(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="singular"):  # a linear loss: zero Hessian, no λ
        newton_step(y, torch.ones_like(y), torch.zeros(3, 2, 2, dtype=torch.float64), "hessian", 0.0)
    with pytest.raises(ValueError, match="NaN or inf"):
        newton_step(y, torch.full_like(y, float("nan")), None, "fisher", 1.0)
    with pytest.raises(ValueError, match="hessians"):
        newton_step(y, torch.ones_like(y), None, "hessian", 1.0)
    with pytest.raises(ValueError, match="at least one sample"):
        newton_step(torch.zeros(0, 2), torch.zeros(0, 2), None, "fisher", 1.0)
    # softmax CE's H and F have the all-ones vector in their null space: without λ the step is rounding noise
    with pytest.raises(ValueError, match="singular up to the precision"):
        NewtonLoss(loss, "hessian", 0.0)(torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="singular up to the precision"):
        NewtonLoss(loss, "fisher", 0.0)(torch.randn(8, 3), torch.tensor([0, 1, 2, 0, 1, 1, 2, 0]))
    # the input checks that read data are skipped under vmap (diffrank.operators.base, "Tracing"): torch.func batches
    # the loss and gives autograd's derivatives
    y = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 0])
    by_func = torch.autograd.grad(NewtonLoss(loss, "fisher", 0.1, derivatives="func")(y, labels), y)
    torch.testing.assert_close(by_func, torch.autograd.grad(NewtonLoss(loss, "fisher", 0.1, derivatives="autograd")(
        y, labels), y))
    with pytest.raises(ValueError, match="not a mean of per-sample losses"):
        NewtonLoss(NeighbourLoss(load("neuralsort")), "fisher")
    with pytest.raises(ValueError, match="labels must lie"):
        NewtonLoss(loss, "fisher", 0.1)(torch.randn(2, 3), torch.tensor([0, 5]))
