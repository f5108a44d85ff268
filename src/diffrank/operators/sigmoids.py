"""Sigmoids of the relaxed conditional swap in differentiable sorting networks.

A comparator on wires (hi, lo) should leave the larger value on ``hi`` and the smaller on ``lo``.
With d = x_hi - x_lo (positive when the pair is already in order) and α = f(d) for a sigmoid f with
f(0) = ½, f(+∞) = 1 (Petersen et al. 2021 "Differentiable sorting networks", Eq. 1; thesis §3.2):

    max' = α·x_hi + (1 - α)·x_lo,    min' = (1 - α)·x_hi + α·x_lo.

Every function here maps ``(d, beta, art_lambda) -> α`` with v = β·d unless said otherwise. The β scale is
the one of the reference code (``diffsort`` / ``difftopk``), so a β from their papers or READMEs means the
same thing here; where the thesis (Petersen 2022, §3.3, Eqs. 3.13, 3.21-3.24) writes a different scale it is
stated per function. Slopes f'(0) are per unit of d.

| name | α | f'(0) | thesis |
|---|---|---|---|
| ``logistic`` | σ(β d) | β/4 | Eq. 3.21, same β |
| ``logistic_phi`` | σ(β d / (\\|d\\| + ε)^λ), ε = 1e-10 | ∞ (cusp) | σ∘φ, Eq. 3.13, same β |
| ``gaussian`` | Φ(β d) = ½ + ½ erf(β d / √2) | β/√(2π) | not in the thesis' table |
| ``reciprocal`` | ½ (v / (2 + \\|v\\|) + 1) | β/4 | Eq. 3.22 with β_thesis = β/4 |
| ``cauchy`` | atan(v)/π + ½ | β/π | Eq. 3.23, same β |
| ``optimal`` | 1/(16\\|v\\|) if v < -¼; v + ½ if \\|v\\| ≤ ¼; 1 - 1/(16 v) if v > ¼ | β | Eq. 3.24, same β |

Monotonic and error-bounded (thesis Table 3.1): ``reciprocal``, ``cauchy``, ``optimal``. ``logistic`` and
``logistic_phi`` are not monotonic.

ART ε placement: the thesis writes φ(x) = x / (|x|^λ + ε); the reference code puts ε inside the power,
x / (|x| + ε)^λ. We follow the code: it is what produced the published top-k numbers (the β and λ of the
difftopk README were tuned with it), it keeps the slope at d = 0 finite and moderate (ε^{-λ} = 1e5 for
λ = ½ instead of 1/ε = 1e10), and it gives bit-level parity with the peers. Both agree to ~1e-10 relative
for |d| ≫ ε and both give α = ½ at d = 0.

Half precision: float16 / bfloat16 differences are evaluated in float32 and α is cast back to the input
dtype (the peers do this for float16 only; bfloat16's 8-bit mantissa is worse).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
from torch import Tensor

ART_EPSILON = 1e-10


def _logistic(d: Tensor, beta: float, art_lambda: float) -> Tensor:
    return torch.sigmoid(beta * d)


def _logistic_phi(d: Tensor, beta: float, art_lambda: float) -> Tensor:
    # (|d| + ε)^λ with ε inside the power: the reference code's form (see module docstring)
    return torch.sigmoid(beta * d / (d.abs() + ART_EPSILON).pow(art_lambda))


def _gaussian(d: Tensor, beta: float, art_lambda: float) -> Tensor:
    return 0.5 + 0.5 * torch.erf(d * (beta / math.sqrt(2.0)))


def _reciprocal(d: Tensor, beta: float, art_lambda: float) -> Tensor:
    v = beta * d
    return 0.5 * (v / (2.0 + v.abs()) + 1.0)


def _cauchy(d: Tensor, beta: float, art_lambda: float) -> Tensor:
    return torch.atan(beta * d) / math.pi + 0.5


def _optimal(d: Tensor, beta: float, art_lambda: float) -> Tensor:
    v = beta * d
    tail = v.abs() > 0.25
    # the hyperbolic branch is evaluated on a safe argument: torch.where would otherwise route a zero
    # gradient through 1/(16 v) at v = 0 and produce 0 * inf = NaN
    v_tail = torch.where(tail, v, torch.ones_like(v))
    hyper = torch.where(v_tail > 0, 1.0 - 1.0 / (16.0 * v_tail), -1.0 / (16.0 * v_tail))
    return torch.where(tail, hyper, v + 0.5)


SIGMOIDS: dict[str, Callable[[Tensor, float, float], Tensor]] = {
    "logistic": _logistic,
    "logistic_phi": _logistic_phi,
    "gaussian": _gaussian,
    "reciprocal": _reciprocal,
    "cauchy": _cauchy,
    "optimal": _optimal,
}

MONOTONIC = frozenset({"reciprocal", "cauchy", "optimal"})


def check_sigmoid(name: str) -> str:
    """Return ``name`` if it is a known sigmoid.

    Raises:
        ValueError: for an unknown name; the message lists the known ones.
    """
    if name not in SIGMOIDS:
        raise ValueError(f"unknown sigmoid {name!r}; known sigmoids: {', '.join(SIGMOIDS)}")
    return name


def check_art_lambda(art_lambda: float) -> float:
    """Validate the ART exponent λ ∈ [0, 1] (thesis Eq. 3.13). Raises ``ValueError`` otherwise (also for a value
    that is not a number, e.g. a string)."""
    if isinstance(art_lambda, bool) or not isinstance(art_lambda, numbers.Real):
        raise ValueError(
            f"art_lambda must be a number in [0, 1], got {art_lambda!r} of type {type(art_lambda).__name__}"
        )
    art_lambda = float(art_lambda)
    if not 0.0 <= art_lambda <= 1.0:
        raise ValueError(f"art_lambda must lie in [0, 1], got {art_lambda}")
    return art_lambda


def swap_weight(d: Tensor, beta: float, sigmoid: str = "cauchy", art_lambda: float = 0.25) -> Tensor:
    """α = f(d) of the relaxed conditional swap (see the module docstring for each f and its β scale).

    Args:
        d: differences x_hi - x_lo, any shape, floating dtype.
        beta: inverse temperature β > 0 (reference-code scale).
        sigmoid: one of ``SIGMOIDS``.
        art_lambda: λ of the activation replacement trick (``logistic_phi`` only), in [0, 1].

    Returns:
        α with the shape and dtype of ``d``, in [0, 1]; ½ at d = 0; → 1 as d → +∞.

    Raises:
        ValueError: for an unknown sigmoid name.
    """
    fn = SIGMOIDS[check_sigmoid(sigmoid)]
    if d.dtype in (torch.float16, torch.bfloat16):
        return fn(d.float(), beta, art_lambda).to(d.dtype)
    return fn(d, beta, art_lambda)


def swap_slope(d: Tensor, beta: float, sigmoid: str = "cauchy", art_lambda: float = 0.25) -> Tensor:
    """dα/dd of :func:`swap_weight`, in closed form (for the fused backward pass of the networks).

    Args / Returns: as :func:`swap_weight` (float32 / float64 ``d``); the slope is >= 0 everywhere. At
    d = 0 ``logistic_phi`` gives β ε^{-λ}/4 (the subgradient 0 of |d| at 0, as autograd would).

    Raises:
        ValueError: for an unknown sigmoid name.
    """
    check_sigmoid(sigmoid)
    if sigmoid == "logistic":
        s = torch.sigmoid(beta * d)
        return beta * s * (1.0 - s)
    if sigmoid == "logistic_phi":
        a = d.abs() + ART_EPSILON
        z = beta * d * a.pow(-art_lambda)
        s = torch.sigmoid(z)
        return s * (1.0 - s) * beta * a.pow(-art_lambda - 1.0) * (a - art_lambda * d.abs())
    if sigmoid == "gaussian":
        v = beta * d
        return (beta / math.sqrt(2.0 * math.pi)) * torch.exp(-0.5 * v * v)
    if sigmoid == "reciprocal":
        v = beta * d
        return beta / (2.0 + v.abs()).square()
    if sigmoid == "cauchy":
        v = beta * d
        return (beta / math.pi) / (1.0 + v * v)
    v = beta * d  # optimal
    tail = v.abs() > 0.25
    v_tail = torch.where(tail, v, torch.ones_like(v))
    return torch.where(tail, beta / (16.0 * v_tail * v_tail), torch.full_like(v, beta))
