"""diffrank.compat.diffsort: diffsort's README example gives diffsort's numbers, P in diffsort's orientation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffrank.compat.diffsort import DEFAULTS, DiffSortNet


def _readme_vectors() -> torch.Tensor:
    # diffsort's README, "Usage" (a fixed seed for the random permutation)
    torch.manual_seed(0)
    vector_length = 2 ** 4
    vectors = torch.randperm(vector_length, dtype=torch.float32, device="cpu", requires_grad=True).view(1, -1)
    return vectors - 5.0


def test_readme_example_equals_diffsort():
    diffsort = pytest.importorskip("diffsort")
    vectors = _readme_vectors()
    ours, p_ours = DiffSortNet("bitonic", 16, steepness=5)(vectors)
    ref, p_ref = diffsort.DiffSortNet("bitonic", 16, steepness=5)(vectors)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(p_ours, p_ref, atol=1e-6, rtol=0)
    (g_ours,) = torch.autograd.grad((ours * torch.arange(16.0)).sum(), vectors)
    (g_ref,) = torch.autograd.grad((ref * torch.arange(16.0)).sum(), vectors)
    torch.testing.assert_close(g_ours, g_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("network,n", [("odd_even", 5), ("odd_even", 9), ("bitonic", 8)])
@pytest.mark.parametrize("distribution", ["cauchy", "logistic_phi", "optimal"])
def test_defaults_and_orientation_equal_diffsort(network, n, distribution):
    diffsort = pytest.importorskip("diffsort")
    x = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    ours, p_ours = DiffSortNet(network, n, distribution=distribution)(x)
    ref, p_ref = diffsort.DiffSortNet(network, n, distribution=distribution)(x)
    # 'optimal' differs by the reference's +1e-10 in 1/(16(|v| + 1e-10))
    torch.testing.assert_close(p_ours, p_ref, atol=1e-8, rtol=0)
    torch.testing.assert_close(ours, ref, atol=1e-8, rtol=0)


def test_bitonic_for_other_n_differs_from_diffsort():
    """n not a power of two (docs/api.md, "Porting", the known differences): at n = 10 both networks sort in the
    hard limit and are different relaxations (up to 0.127 apart at β = 10); at n = 22 diffsort's does not sort."""
    diffsort = pytest.importorskip("diffsort")
    x = torch.randn(200, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ours, _ = DiffSortNet("bitonic", 10)(x)
    ref, _ = diffsort.DiffSortNet("bitonic", 10)(x.float())
    assert 0.1 < float((ours - ref.double()).abs().max()) < 0.15
    for net in (DiffSortNet("bitonic", 10, steepness=1e8), diffsort.DiffSortNet("bitonic", 10, steepness=1e8)):
        torch.testing.assert_close(net(x.float())[0], x.float().sort(1).values, atol=1e-5, rtol=0)
    x = torch.randn(200, 22, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ours, _ = DiffSortNet("bitonic", 22, steepness=1e8)(x)
    ref, _ = diffsort.DiffSortNet("bitonic", 22, steepness=1e8)(x.float())
    torch.testing.assert_close(ours, x.sort(1).values, atol=1e-6, rtol=0)
    unsorted = (ref.double() - x.sort(1).values).abs().amax(1) > 0.01
    assert 0.3 < float(unsorted.double().mean()) < 0.6


def test_x_at_p_is_the_ascending_soft_sort():
    x = torch.randn(4, 7, dtype=torch.float64)
    values, p = DiffSortNet("odd_even", 7)(x)
    torch.testing.assert_close(torch.einsum("bi,bij->bj", x, p), values)
    torch.testing.assert_close(x[:1] @ p[0], values[:1])  # the README's x @ P for one set
    assert (values.diff(dim=1) >= 0).all()
    assert DEFAULTS == {"steepness": 10.0, "art_lambda": 0.25, "distribution": "cauchy"}


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="sorting_network_type"):
        DiffSortNet("merge", 4)
    with pytest.raises(ValueError, match="two different distributions"):
        DiffSortNet("odd_even", 4, interpolation_type="logistic", distribution="optimal")
    assert DiffSortNet("odd_even", 4, interpolation_type="logistic").distribution == "logistic"
    with pytest.raises(ValueError, match=r"shape \(B, 4\)"):
        DiffSortNet("odd_even", 4)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="unknown sigmoid"):
        DiffSortNet("odd_even", 4, distribution="softmax")


def test_size_and_steepness_are_checked_at_construction_under_their_names():
    """DiffSortNet('odd_even', -2) was built without complaint and its first call said 'vectors must have shape
    (B, -2)'; a size below 1 or not an integer (6.5 was truncated to 6) is refused at construction, and a bad
    steepness is reported as steepness (the caller never passed a β)."""
    for size, error in ((-2, ValueError), (0, ValueError), (6.5, TypeError), ("6", TypeError), (True, TypeError)):
        with pytest.raises(error, match="size must be an integer"):
            DiffSortNet("odd_even", size)
    for steepness in (-1.0, 0.0, float("nan"), "10"):
        with pytest.raises(ValueError, match="steepness must be a finite positive number") as e:
            DiffSortNet("odd_even", 4, steepness=steepness)
        assert "beta" not in str(e.value)
    assert DiffSortNet("bitonic", np.int64(4)).size == 4
