"""Newton losses: a Newton step on the loss, plain gradient descent on the network.

Petersen, PhD thesis 2022, §7.3 (Petersen et al., "Newton Losses", NeurIPS 2024). Training is split at the
network's output y = f(x; θ) (§7.2, Eqs. 7.3a / 7.3b): a Newton step on the loss ℓ gives a target

    z* = y − (M + λI)⁻¹ ∇_y ℓ(y)                                            (Eq. 7.24, Tikhonov term λ ≥ 0)

with y detached, and the network is trained on the Newton loss ½‖z* − y‖² (Eq. 7.25), whose gradient with
respect to y is y − z* (Eq. 7.27). The curvature M is, per Definitions 7.1–7.3:

- ``"elementwise_hessian"``: each sample's own Hessian ∇²ℓ(y_i) (Def. 7.1); one d×d solve per sample;
- ``"hessian"``: the batch mean of the per-sample Hessians (Def. 7.2); one d×d solve per batch;
- ``"fisher"``: the batch mean of ∇ℓ(y_i) ∇ℓ(y_i)ᵀ over the per-sample gradients (Def. 7.3); one d×d solve per
  batch and no second derivatives.

Per-sample derivatives: a loss of this framework returns the batch mean of per-sample losses ℓ(y_i), so the
per-sample gradients are B times the gradient of the batch loss, and the per-sample Hessians are the diagonal
d×d blocks of the batch loss's Hessian (d double-backward passes). A pure per-sample function can instead be
differentiated by ``torch.func`` (``vmap`` over ``hessian``), and the softmax cross-entropy uses its closed form
(Example 7.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from diffrank.losses.knn import NeighbourLoss
from diffrank.losses.newton_closed_forms import softmax_ce_derivatives
from diffrank.losses.softmax_ce import SoftmaxCrossEntropyLoss
from diffrank.losses.topk_cross_entropy import TopKCrossEntropyLoss, m_subset
from diffrank.losses.validation import check_logits_labels, index_labels
from diffrank.operators.base import raise_failed

VARIANTS = ("hessian", "fisher", "elementwise_hessian")
DERIVATIVES = ("auto", "autograd", "func", "closed_form")
Derivatives = tuple[Tensor, Tensor, Tensor | None]


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def _check_tikhonov(tikhonov: float) -> float:
    try:
        lam = float(tikhonov)
    except (TypeError, ValueError):
        raise ValueError(f"tikhonov must be a finite number >= 0, got {tikhonov!r}") from None
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"tikhonov must be a finite number >= 0, got {tikhonov!r}")
    return lam


def newton_step(y: Tensor, grads: Tensor, hessians: Tensor | None = None, variant: str = "hessian",
                tikhonov: float = 0.0) -> Tensor:
    """The Newton target z* = y − (M + λI)⁻¹ g_i of each sample, for one of the three curvatures M.

    Args:
        y: ``(B, d)`` floating outputs (used detached).
        grads: ``(B, d)`` per-sample gradients g_i = ∇ℓ(y_i) (of the per-sample loss, not of the batch mean).
        hessians: ``(B, d, d)`` per-sample Hessians ∇²ℓ(y_i); needed by ``"hessian"`` and
            ``"elementwise_hessian"``, ignored by ``"fisher"``.
        variant: ``"hessian"`` (M = mean_i ∇²ℓ(y_i), Def. 7.2), ``"fisher"`` (M = mean_i g_i g_iᵀ, Def. 7.3) or
            ``"elementwise_hessian"`` (M = ∇²ℓ(y_i) per sample, Def. 7.1).
        tikhonov: λ ≥ 0 added to M's diagonal (the Tikhonov regularisation of thesis §7.3, which the thesis
            recommends for non-convex or ill-conditioned losses).

    Returns:
        ``(B, d)`` z*, dtype of ``y``, no gradient. The d×d systems are solved in float64 (d is the loss's
        input size, small): one solve with B right-hand sides for ``"hessian"`` / ``"fisher"``, B solves for
        ``"elementwise_hessian"``. One host synchronisation (the check that M + λI was invertible; with λ = 0 also
        that M's condition number, from a symmetric eigendecomposition, stays below 1 / (d · eps) of the
        derivatives' dtype: beyond it the step is rounding noise).

    Raises:
        ValueError: unknown ``variant``, negative or non-finite ``tikhonov``, B = 0, shapes that do not
            match, missing Hessians, non-finite gradients or curvature, or an M + λI that is singular up to the
            derivatives' precision, e.g. softmax CE with λ = 0 (the message says to raise ``tikhonov``).

    Source: Petersen, PhD thesis 2022, §7.3, Eq. 7.24 and Definitions 7.1–7.3.
    """
    _check_variant(variant)
    lam = _check_tikhonov(tikhonov)
    if y.dim() != 2 or not y.is_floating_point():
        raise ValueError(f"y must be a floating tensor of shape (B, d), got {tuple(y.shape)} {y.dtype}")
    b, d = y.shape
    if b == 0 or d == 0:
        raise ValueError(f"y must hold at least one sample of at least one entry, got shape {tuple(y.shape)}")
    if grads.shape != y.shape:
        raise ValueError(f"grads must have the shape of y {tuple(y.shape)}, got {tuple(grads.shape)}")
    source_dtype = grads.dtype if variant == "fisher" or hessians is None else hessians.dtype
    g = grads.detach().double()
    m = _curvature(g, hessians, variant)
    m = m + lam * torch.eye(d, dtype=m.dtype, device=m.device)
    finite = torch.isfinite(m).all() & torch.isfinite(g).all()
    well_posed = _well_posed(m, source_dtype) if lam == 0 else torch.ones((), dtype=torch.bool, device=m.device)
    if variant == "elementwise_hessian":
        step, info = torch.linalg.solve_ex(m, g.unsqueeze(2))
        step = step.squeeze(2)
    else:
        step_t, info = torch.linalg.solve_ex(m, g.T)
        step = step_t.T
    ok = (info == 0).all() & torch.isfinite(step).all() & well_posed
    raise_failed([(finite, ValueError("the per-sample gradients or the curvature hold NaN or inf (a loss whose "
                                      "derivatives overflow at these outputs)")),
                  (ok, ValueError(f"the {variant} curvature + tikhonov·I is singular up to the precision of the "
                                  f"derivatives ({source_dtype}; tikhonov = {lam}); set a larger tikhonov "
                                  "(newton.tikhonov=...)"))])
    return (y.detach().double() - step).to(y.dtype)

def _curvature(g: Tensor, hessians: Tensor | None, variant: str) -> Tensor:
    """M of :func:`newton_step` in float64 from the ``(B, d)`` float64 gradients ``g``: ``(d, d)``, or ``(B, d, d)``
    for ``"elementwise_hessian"``. Raises ValueError for missing or misshapen ``hessians``."""
    b, d = g.shape
    if variant == "fisher":
        return g.T @ g / b
    if hessians is None:
        raise ValueError(f"variant={variant!r} needs the per-sample hessians (B, d, d)")
    if hessians.shape != (b, d, d):
        raise ValueError(f"hessians must have shape ({b}, {d}, {d}), got {tuple(hessians.shape)}")
    h = hessians.detach().double()
    return h if variant == "elementwise_hessian" else h.mean(0)


def _well_posed(m: Tensor, source_dtype: torch.dtype) -> Tensor:
    """Whether M (``(d, d)`` or ``(B, d, d)``, without λ) stays below the condition number 1 / (d · eps) of the
    derivatives' dtype, as a bool tensor (no host synchronisation).

    A solve succeeds on a matrix singular up to rounding (softmax CE's Hessian and Fisher have the all-ones vector
    in their null space, so do the shift-invariant sorting losses) and returns a step that is rounding noise:
    without λ, condition numbers beyond what the derivatives' precision resolves are refused.
    """
    d = m.shape[-1]
    eig = torch.linalg.eigvalsh(torch.where(torch.isfinite(m), m, 0.0)).abs()
    return (eig.amin(-1) > d * torch.finfo(source_dtype).eps * eig.amax(-1)).all()



def _custom_functions(value: Tensor) -> list[str]:
    """Names of the custom ``torch.autograd.Function``s in the graph of ``value`` that do not declare
    ``twice_differentiable = True``: a double backward through them is silently wrong when their backward reads
    intermediates saved in forward (LapSum's closed-form VJPs: measured errors of 10 % of the Hessian)."""
    seen, found, stack = set(), [], [value.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            cls = getattr(node, "_forward_cls", None)
            if not getattr(cls, "twice_differentiable", False):
                found.append(getattr(cls, "__name__", type(node).__name__))
        stack.extend(nxt for nxt, _ in node.next_functions)
    return sorted(set(found))


def per_sample_derivatives(loss: Callable[..., Tensor], y: Tensor, *targets: Any, hessian: bool = True
                           ) -> Derivatives:
    """Per-sample gradients (and Hessians) of a batch loss that is the mean of per-sample losses, by autograd.

    The loss ℓ(Y) = (1/B) Σ_i ℓ_i(y_i) of a batch has ∇_{y_i} ℓ = g_i / B and a block-diagonal Hessian with
    blocks ∇²ℓ_i / B; the Hessian blocks come from d double-backward passes (row j: the gradient of Σ_i g_i[j]).
    A loss that mixes samples (a batch-level normaliser) breaks this and gives wrong per-sample terms.

    Args:
        loss: ``loss(y (B, d), *targets) -> scalar``, the batch mean (every loss of :mod:`diffrank.losses`).
        y: ``(B, d)`` floating outputs (used detached).
        *targets: the loss's other arguments (labels, true values, ...).
        hessian: also compute the per-sample Hessians (needs a twice-differentiable loss).

    Returns:
        ``(value (), grads (B, d), hessians (B, d, d) or None)``, detached: the batch loss, g_i = ∇ℓ_i(y_i) and
        ∇²ℓ_i(y_i). Cost: one backward pass, plus d double-backward passes for the Hessians.

    Raises:
        ValueError: ``y`` not ``(B, d)`` floating, a loss that is not a scalar, or (``hessian=True``) a loss
            whose gradient cannot be differentiated again: one that runs a custom ``torch.autograd.Function``
            (the sorting networks, LapSum, the fused Sinkhorn / soft top-k kernels; a Function may declare
            ``twice_differentiable = True`` to pass) or whose double backward fails. The message names
            ``variant='fisher'``, which needs first derivatives only.
    """
    if not isinstance(y, Tensor) or y.dim() != 2 or not y.is_floating_point():
        raise ValueError(f"y must be a floating tensor of shape (B, d), got {getattr(y, 'shape', type(y))}")
    b, d = y.shape
    with torch.enable_grad():
        leaf = y.detach().requires_grad_(True)
        value = loss(leaf, *targets)
        if not isinstance(value, Tensor) or value.dim() != 0:
            raise ValueError(f"the loss must return a scalar tensor (the batch mean), got "
                             f"{getattr(value, 'shape', type(value).__name__)}")
        custom = _custom_functions(value) if hessian else []
        if custom:
            raise ValueError(f"{type(loss).__name__} runs custom autograd Functions ({', '.join(custom)}) whose "
                             "backward autograd cannot be trusted to differentiate again (intermediates saved "
                             "in forward are constants to it); the Hessian variants need second derivatives, "
                             "variant='fisher' needs first derivatives only")
        (g,) = torch.autograd.grad(value, leaf, create_graph=hessian)
        grads = g * b
        if not hessian:
            return value.detach(), grads.detach(), None
        rows = []
        try:
            if not grads.requires_grad:
                raise RuntimeError("the gradient does not depend on y through a differentiable graph")
            for j in range(d):
                (row,) = torch.autograd.grad(grads[:, j].sum(), leaf, retain_graph=j < d - 1, allow_unused=True)
                rows.append(torch.zeros_like(leaf) if row is None else row)
        except RuntimeError as err:
            raise ValueError(f"{type(loss).__name__} cannot be differentiated twice ({err}); the Hessian variants "
                             "need second derivatives, variant='fisher' needs first derivatives only") from err
    return value.detach(), grads.detach(), torch.stack(rows, dim=1).detach()


def per_sample_derivatives_func(fn: Callable[..., Tensor], y: Tensor, *targets: Tensor, hessian: bool = True
                                ) -> Derivatives:
    """Per-sample gradients (and Hessians) of a pure per-sample loss by ``torch.func`` (vmap over grad / hessian).

    Args:
        fn: ``fn(y_i (d,), *targets_i) -> scalar``, the loss of one sample, written with torch operations that
            ``torch.func.vmap`` can batch (no data-dependent Python control flow, no host reads).
        y: ``(B, d)`` floating outputs (used detached).
        *targets: tensors with a leading batch dimension B (sample i gets ``t[i]``).
        hessian: also compute the Hessians (``torch.func.hessian``, forward-over-reverse).

    Returns:
        ``(value (), grads (B, d), hessians (B, d, d) or None)``, detached; ``value`` is the batch mean of ``fn``.

    Raises:
        ValueError: ``y`` not ``(B, d)`` floating, or a target without the leading batch dimension.
    """
    from torch.func import grad_and_value, vmap
    from torch.func import hessian as func_hessian

    if not isinstance(y, Tensor) or y.dim() != 2 or not y.is_floating_point():
        raise ValueError(f"y must be a floating tensor of shape (B, d), got {getattr(y, 'shape', type(y))}")
    for t in targets:
        if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] != y.shape[0]:
            raise ValueError(f"every target must be a tensor with leading dimension B = {y.shape[0]}, got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    leaf = y.detach()
    grads, values = vmap(grad_and_value(fn))(leaf, *targets)
    hessians = vmap(func_hessian(fn))(leaf, *targets) if hessian else None
    return values.mean().detach(), grads.detach(), None if hessians is None else hessians.detach()


class NewtonLoss(nn.Module):
    """The Newton loss ½‖z* − y‖² of a wrapped loss ℓ (Petersen, PhD thesis 2022, §7.3, Eqs. 7.24–7.27).

    Args:
        loss: the wrapped loss, ``loss(y (B, d), *targets) -> scalar`` = the batch mean of per-sample losses
            (softmax CE, the sorting losses with d = n, the top-k cross-entropy, a :class:`SmoothedLoss`, ...).
        variant: ``"hessian"`` (Def. 7.2), ``"fisher"`` (Def. 7.3) or ``"elementwise_hessian"`` (Def. 7.1).
        tikhonov: λ ≥ 0 added to the curvature's diagonal.
        derivatives: how the per-sample derivatives are obtained: ``"auto"`` (the loss's own
            ``per_sample_derivatives`` method if it has one, e.g. a :class:`~diffrank.losses.smoothing.SmoothedLoss`;
            the closed form of Example 7.2 for :class:`SoftmaxCrossEntropyLoss`; autograd otherwise),
            ``"autograd"`` (:func:`per_sample_derivatives`), ``"func"`` (:func:`per_sample_derivatives_func` on
            ``loss(y_i[None], *t_i[None])``; needs a loss that ``torch.func.vmap`` can batch),
            ``"closed_form"`` (softmax CE only), or a callable ``(y, *targets) -> (value, grads, hessians)``.
        float64: take the derivatives of a detached float64 copy of y (the wrapped loss then runs in float64 for
            this pass): float32 second derivatives can overflow (Sinkhorn at β = 100 gives NaN Hessians in float32,
            finite ones in float64).
        reduction: ``"mean"`` (default) over the batch of ½‖z*_i − y_i‖², so that the gradient with respect to
            y_i is (y_i − z*_i) / B, on the scale of a mean-reduced loss; ``"sum"``: Eq. 7.25 over the whole
            batch matrix, gradient y_i − z*_i.

    ``forward(output, *targets) -> scalar``. With a :class:`~diffrank.losses.topk_cross_entropy.TopKCrossEntropyLoss`
    that ranks an m-subset, the split is at the m-subset scores (d = m): z* is computed for
    ``m_subset(logits, labels, m)`` (ground truth first) and the network is trained through that selection.
    Without autograd (``torch.no_grad`` / inference mode: validation, test) there is no step to take and the
    wrapped loss's value is returned, so that ``val/loss`` compares with a run without Newton loss.

    Cost per training step on top of the wrapped loss's forward: one backward pass of the loss for the gradients,
    d double-backward passes for the Hessian variants (none with a closed form), and one d×d solve per batch
    (``"hessian"``, ``"fisher"``) or per sample (``"elementwise_hessian"``), in float64; one more host
    synchronisation (the invertibility check of :func:`newton_step`), two with an m-subset (its label check).

    Raises:
        ValueError: unknown ``variant`` / ``derivatives`` / ``reduction``, a bad ``tikhonov``, ``"closed_form"`` for
            a loss without one, a :class:`~diffrank.losses.knn.NeighbourLoss` (not a mean of per-sample losses),
            and at call time what :func:`newton_step` and the derivative functions raise (``"func"`` on a loss that
            ``torch.func`` cannot batch: a ValueError naming ``"autograd"``).
    """

    def __init__(self, loss: Callable[..., Tensor], variant: str = "hessian", tikhonov: float = 0.0,
                 derivatives: str | Callable[..., Derivatives] = "auto", reduction: str = "mean",
                 float64: bool = False) -> None:
        super().__init__()
        _check_variant(variant)
        if not callable(loss):
            raise ValueError(f"loss must be callable, got {type(loss).__name__}")
        if not callable(derivatives) and derivatives not in DERIVATIVES:
            raise ValueError(f"derivatives must be one of {DERIVATIVES} or a callable, got {derivatives!r}")
        if derivatives == "closed_form" and not isinstance(loss, SoftmaxCrossEntropyLoss):
            raise ValueError(f"derivatives='closed_form' needs SoftmaxCrossEntropyLoss, got {type(loss).__name__}")
        if isinstance(loss, NeighbourLoss):
            raise ValueError("NeighbourLoss compares queries with templates of the same batch: it is not a mean of "
                             "per-sample losses of one output, which the Newton loss needs; use newton=none")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.loss, self.variant, self.tikhonov = loss, variant, _check_tikhonov(tikhonov)
        self.derivatives, self.reduction, self.float64 = derivatives, reduction, bool(float64)
        self._subset_loss = None
        if isinstance(loss, TopKCrossEntropyLoss) and loss.m is not None:
            # the same loss on the already-selected m-subset (ground truth in column 0)
            self._subset_loss = TopKCrossEntropyLoss(loss.operator, loss.p_k, m=None, top1_mode=loss.top1_mode)

    @property
    def operator(self) -> nn.Module | None:
        """The wrapped loss's ranking operator (None without one): what the run's record names."""
        return getattr(self.loss, "operator", None)

    @property
    def p_k(self) -> Any:
        """The wrapped loss's P_K (None without one)."""
        return getattr(self.loss, "p_k", None)

    def forward(self, output: Tensor, *targets: Any) -> Tensor:
        """Scalar Newton loss (dtype of ``output``; float32 for half precision); the wrapped loss without autograd."""
        if not torch.is_grad_enabled():
            return self.loss(output, *targets)
        loss, y = self.loss, output
        if self._subset_loss is not None:
            (labels,) = targets
            check_logits_labels(output, labels)
            labels = index_labels(labels)
            if self.loss.m > output.shape[1]:
                raise ValueError(f"m-subset size m = {self.loss.m} exceeds the number of classes n = "
                                 f"{output.shape[1]} (set loss.m=null to rank all classes)")
            y = m_subset(output, labels, self.loss.m)
            loss, targets = self._subset_loss, (torch.zeros_like(labels),)
        if y.dtype in (torch.float16, torch.bfloat16):
            y = y.float()
        _, grads, hessians = self._derivatives(loss, y.detach().double() if self.float64 else y, targets)
        z = newton_step(y, grads, hessians, self.variant, self.tikhonov)
        half_sq = 0.5 * (z - y).pow(2).sum(1)
        return half_sq.mean() if self.reduction == "mean" else half_sq.sum()

    def _derivatives(self, loss: Callable[..., Tensor], y: Tensor, targets: tuple) -> Derivatives:
        need_h = self.variant != "fisher"
        how = self.derivatives
        if callable(how):
            return how(y.detach(), *targets)
        own = getattr(loss, "per_sample_derivatives", None)
        if how == "auto" and callable(own):
            return own(y.detach(), *targets, hessian=need_h)
        if how in ("auto", "closed_form") and isinstance(loss, SoftmaxCrossEntropyLoss):
            (labels,) = targets
            check_logits_labels(y, labels)
            values, grads, hessians = softmax_ce_derivatives(y.detach(), labels)
            return values.mean(), grads, hessians if need_h else None
        if how == "func":
            def one(y_i: Tensor, *t_i: Tensor) -> Tensor:
                """The loss of one sample: ``y_i (d,)`` and its targets → a scalar."""
                return loss(y_i.unsqueeze(0), *(t.unsqueeze(0) for t in t_i))

            try:
                return per_sample_derivatives_func(one, y, *targets, hessian=need_h)
            except RuntimeError as err:  # torch.func refuses data-dependent control flow (input checks) and more
                raise ValueError(f"derivatives='func': torch.func cannot batch {type(loss).__name__} ({err}); use "
                                 "derivatives='autograd'") from err
        return per_sample_derivatives(loss, y, *targets, hessian=need_h)

    def extra_repr(self) -> str:
        return (f"variant={self.variant!r}, tikhonov={self.tikhonov}, reduction={self.reduction!r}, "
                f"float64={self.float64}")


def wrap_newton(loss: Callable[..., Tensor] | None = None, variant: str = "none", tikhonov: float = 0.0,
                derivatives: str = "auto", float64: bool = False) -> Callable[..., Tensor] | None:
    """The run's loss, wrapped in a :class:`NewtonLoss` unless ``variant`` is ``"none"`` (the ``newton`` group).

    Args:
        loss: the loss the run built (None: the model brings its own).
        variant: ``"none"`` (return ``loss`` unchanged) or one of :data:`VARIANTS`.
        tikhonov: λ ≥ 0 (see :class:`NewtonLoss`).
        derivatives, float64: see :class:`NewtonLoss`.

    Returns:
        ``loss`` itself for ``"none"``, else ``NewtonLoss(loss, variant, tikhonov, derivatives, float64=float64)``.

    Raises:
        ValueError: an unknown variant, or a Newton variant without a loss to wrap.

    Source: Petersen, PhD thesis 2022, §7.3, Definitions 7.1–7.3.
    """
    if variant in (None, "none"):
        return loss
    _check_variant(variant)
    if loss is None:
        raise ValueError(f"newton={variant} needs a loss to wrap, but the model brings its own (model.algorithm); "
                         "use newton=none")
    return NewtonLoss(loss, variant=variant, tikhonov=tikhonov, derivatives=derivatives, float64=float64)
