"""The ranking-operator contract shared by every relaxed sorting / ranking / top-k method.

Conventions (docs/conventions.md, "Relaxed permutation matrix: rows = ranks" and "Inverse temperature β vs
τ, ε, α"): scores ``s`` of shape ``(B, n)``; the relaxed permutation matrix ``P`` has rows = ranks (row 0 =
rank 1 = the largest score) and columns = items, so ``P @ s`` is the soft-sorted vector in *descending*
order. ``beta`` is the inverse temperature of every operator; a paper's own parameter (τ = 1/β, ε = 1/β,
α = -1/β) is derived from it.

An operator says what it can compute through :attr:`RankingOperator.capabilities`:

- ``"permutation"``: rows of P (``forward``); the other three then have default forms built from P.
- ``"topk_membership"``: Pr(item j is among the top k) for given ks.
- ``"soft_sort"``: soft-sorted values, descending.
- ``"soft_rank"``: soft ranks, 1 = largest.

The four public methods are defined here only (a template): each validates its inputs once, checks the
capability, computes float16 / bfloat16 inputs in float32, calls one protected hook that a subclass
implements (``_permutation``, ``_topk_membership``, ``_soft_sort``, ``_soft_rank``; through
:func:`~diffrank.operators.backend.guarded_call`, which falls back to the PyTorch path when a Triton kernel
fails under ``backend="auto"``) and casts the result back to the input dtype. Validation synchronises with
the host at most once per call (one read of all data-dependent checks together). Losses and experiments
call :func:`require` to reject an operator that cannot serve them, with a message naming what is missing.

**Tracing.** The data-dependent checks (NaN / ±inf scores, the sign of a tensor β, a caller's pending checks) need
a host read, which ``torch.compile`` cannot trace (a graph break, and no ``fullgraph=True``) and ``torch.func.vmap``
refuses ("data-dependent control flow"). They are skipped under ``torch.compiler.is_compiling()`` and for tensors
batched by ``vmap`` at any level (:func:`data_checks_traced`); everything else (shapes, dtypes, k, a float β,
capabilities) is still checked, and eager calls (``torch.func.grad`` / ``jacrev`` included) raise exactly as
before. Validate the values once outside the compiled or vmapped function where bad input is possible
(docs/api.md, "torch.compile and torch.func").
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch._C import _functorch

from diffrank._padding import per_length
from diffrank.operators.backend import guarded_call
from diffrank.operators.gumbel import GumbelSampling
from diffrank.operators.memory import check_dense

PERMUTATION = "permutation"
TOPK_MEMBERSHIP = "topk_membership"
SOFT_SORT = "soft_sort"
SOFT_RANK = "soft_rank"
ALL_CAPABILITIES = frozenset({PERMUTATION, TOPK_MEMBERSHIP, SOFT_SORT, SOFT_RANK})

# the protected hook of each capability but the permutation (RankingOperator._dense_rows: overridden or not)
_HOOKS = {TOPK_MEMBERSHIP: "_topk_membership", SOFT_SORT: "_soft_sort", SOFT_RANK: "_soft_rank"}

# a data-dependent check: a 0-d bool tensor that is True when the input is valid, and the error otherwise (or a
# function that builds it, called only when the check fails: raise_failed)
Check = tuple[Tensor, Exception | Callable[[], Exception]]


def _functorch_levels(t: Tensor):
    """``t`` and every tensor it wraps, outermost first (one per ``torch.func`` transform level)."""
    yield t
    while _functorch.is_functorch_wrapped_tensor(t):
        t = _functorch.get_unwrapped(t)
        yield t


def data_checks_traced(*tensors: Tensor) -> bool:
    """Whether a host read of these tensors' values cannot be done here: under ``torch.compile`` (dynamo,
    ``torch.export``), or when one of them is batched by ``torch.func.vmap`` at any transform level.

    The data-dependent checks (:func:`raise_failed`) are skipped then (documented in the module docstring);
    ``torch.func.grad`` / ``jvp`` alone read values fine and keep them.

    Args:
        tensors: the tensors a check would read.

    Returns:
        True to skip the read.
    """
    if torch.compiler.is_compiling():
        return True
    for t in tensors:  # a plain tensor costs one call: the common eager case stays at ~1 µs
        while _functorch.is_functorch_wrapped_tensor(t):
            if _functorch.is_batchedtensor(t):
                return True
            t = _functorch.get_unwrapped(t)
    return False


def host_max(t: Tensor) -> float:
    """The largest value of ``t`` as a Python float (one host read), also inside ``torch.func`` transforms.

    Under ``vmap`` the read covers every vmapped sample (the unwrapped tensor holds them all): a stopping rule
    "the worst row is below the tolerance" then stops where the eager call on the stacked batch stops, so a
    vmapped call equals that call. Not traceable by ``torch.compile`` (a graph break, like ``Tensor.item()``).

    Args:
        t: a non-empty tensor (any shape, real dtype).

    Returns:
        ``float(t.max())`` over every level's values.
    """
    if torch.compiler.is_compiling():  # dynamo cannot trace the unwrapping; the read itself is the graph break
        return float(t.detach().max())
    *_, plain = _functorch_levels(t.detach())
    return float(plain.max())


def fold_vmapped(x: Tensor, dim: int | None, size: int) -> Tensor:
    """The input of a custom ``autograd.Function``'s ``vmap`` rule with its vmapped dimension folded into the batch.

    Args:
        x: ``(B, ...)`` per vmapped sample; ``dim`` is where the vmapped dimension sits (None: not vmapped, then
            expanded to every sample).
        size: the vmapped batch size.

    Returns:
        ``(size · B, ...)``, sample-major (``unflatten(0, (size, -1))`` splits a result back).
    """
    x = x.unsqueeze(0).expand(size, *x.shape) if dim is None else x.movedim(dim, 0)
    return x.flatten(0, 1)


def raise_failed(checks: Sequence[Check]) -> None:
    """Raise the error of the first failed check, reading every flag with one host synchronisation.

    Skipped under ``torch.compile`` and ``vmap`` (:func:`data_checks_traced`), where no value can be read.

    Args:
        checks: ``(ok, error)`` pairs; ``ok`` is a 0-d bool tensor, True when the check passes; ``error`` an
            exception, or a function of no arguments that returns one (built only when the check fails, so that
            its message may read the bad value: a second read on the failure path only).

    Raises:
        The ``error`` of the first pair whose ``ok`` is False.
    """
    if not checks or data_checks_traced(*(ok for ok, _ in checks)):
        return
    if len(checks) == 1:
        oks = [bool(checks[0][0])]
    else:
        oks = torch.stack([ok.reshape(()).to(checks[0][0].device) for ok, _ in checks]).tolist()
    for ok, (_, error) in zip(oks, checks):
        if not ok:
            raise error if isinstance(error, BaseException) else error()


def check_scores_shape(scores: Tensor, name: str = "scores") -> int:
    """The checks of :func:`check_scores` that need no data (no host synchronisation); returns n.

    Raises:
        TypeError: if ``scores`` is not a tensor or not floating point.
        ValueError: if ``scores`` is not 2-D, has ``n < 1``, or lives on the meta device (no values to rank).
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, n), got {type(scores).__name__}")
    if scores.is_meta:
        are, they = ("are", "they have") if name.endswith("s") else ("is", "it has")
        raise ValueError(f"{name} {are} on the meta device: {they} a shape but no values to rank. Materialise "
                         "them first (a model built under torch.device('meta') needs .to_empty(device=…) and its "
                         "weights loaded or initialised)")
    if scores.dim() != 2:
        raise ValueError(f"{name} must be 2-D (B, n), got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"{name} must be floating point, got dtype {scores.dtype}")
    if scores.shape[1] < 1:
        raise ValueError(f"{name} must have at least one item (n >= 1), got shape {tuple(scores.shape)}")
    return scores.shape[1]


def non_finite_error(name: str = "scores") -> ValueError:
    """The error of scores that hold NaN or ±inf."""
    return ValueError(f"{name} contain non-finite values (NaN or inf)")


def finite_check(scores: Tensor, name: str = "scores") -> Check:
    """The data-dependent check of :func:`check_scores`, not yet read (see :func:`raise_failed`)."""
    return torch.isfinite(scores).all(), non_finite_error(name)


def _cpu_all_finite(scores: Tensor) -> bool | None:
    """Whether plain float32 / float64 CPU scores are all finite, read through numpy; None for any other tensor
    (another device or dtype, a subclass, a tensor without accessible data), which takes the tensor check.

    A finite sum proves every value finite (one inf or NaN makes the sum inf or NaN); only bad input, or finite
    values whose sum overflows, take the elementwise test."""
    if type(scores) is not Tensor or not scores.is_cpu or scores.dtype not in _NUMPY_FLOATS:
        return None
    try:
        a = scores.numpy(force=True)
    except (RuntimeError, TypeError):  # e.g. a functorch-wrapped tensor: no numpy view
        return None
    return math.isfinite(np.add.reduce(a, axis=None)) or bool(np.isfinite(a).all())


_NUMPY_FLOATS = (torch.float32, torch.float64)


def check_scores(scores: Tensor, name: str = "scores") -> None:
    """Validate a batch of scores (one host synchronisation).

    Args:
        scores: ``(B, n)`` floating-point tensor (float16 / bfloat16 / float32 / float64).
        name: how the tensor is called in error messages.

    Raises:
        TypeError: if ``scores`` is not a tensor or not floating point.
        ValueError: if ``scores`` is not 2-D, has ``n < 1``, or holds NaN / ±inf.
    """
    check_scores_shape(scores, name)
    raise_failed([finite_check(scores, name)])


def check_k(k: int, n: int) -> int:
    """Validate a top-k size against the number of items.

    Args:
        k: number of top ranks: an integer (``int``, an integer-like such as ``numpy.int64``, or a 0-dim integer
            tensor; ``bool``, bool and complex tensors are rejected).
        n: number of items.

    Returns:
        ``k`` as a Python int.

    Raises:
        TypeError: if ``k`` is not an integer.
        ValueError: if ``k < 1`` or ``k > n``, or a tensor ``k`` on the meta device.
    """
    if isinstance(k, bool) or not isinstance(k, (numbers.Integral, torch.SymInt)) and not (
        isinstance(k, Tensor) and k.dim() == 0 and not k.is_floating_point() and not k.is_complex()
        and k.dtype != torch.bool
    ):
        real = isinstance(k, numbers.Real) and not isinstance(k, bool)
        hint = " (real-valued k is LapSum's: method='lapsum')" if real else ""
        raise TypeError(f"k must be an integer, got {k!r}{hint}")
    if isinstance(k, Tensor) and k.is_meta:
        raise ValueError("k is on the meta device: it has no value; pass an int")
    k = int(k)
    if k < 1 or k > n:
        raise ValueError(f"k must satisfy 1 <= k <= n = {n}, got k = {k}")
    return k


def check_int(value: int, name: str, low: int = 1, what: str = "") -> int:
    """An integer setting (an iteration count, a size) as an ``int``, refused rather than truncated (``int(2.7)``
    would be 2, ``int("abc")`` an error that does not say which argument).

    Args:
        value: an ``int`` or an integer-like (``numpy.int64``); not a bool, a float or a string.
        name: the argument's name, for the messages.
        low: the least value accepted.
        what: what the argument is, for the messages (e.g. ``"the number of values per set"``).

    Returns:
        ``value`` as a Python int.

    Raises:
        TypeError: not an integer. ValueError: below ``low``.
    """
    about = f" ({what})" if what else ""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer{about}, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer{about}, got {value!r} of type {type(value).__name__}") from None
    if out < low:
        raise ValueError(f"{name} must be an integer >= {low}{about}, got {out}")
    return out


def check_beta(beta: float | Tensor, *, learnable: bool = False, owner: str = "this operator",
               name: str = "beta") -> float | Tensor:
    """Validate an inverse temperature β > 0 (finite).

    A learnable β is best parametrised so that an optimiser step cannot leave (0, ∞), e.g.
    ``beta = torch.nn.functional.softplus(raw)`` with ``raw`` the ``nn.Parameter`` (docs/api.md, "Learnable
    temperature"): a tensor β is checked here at construction and again at every call of the operator
    (:meth:`RankingOperator.beta_checks`, read with the scores' checks in their single host synchronisation), but
    not under ``torch.compile`` or ``vmap``, where no value can be read (:func:`data_checks_traced`): a β that
    has left (0, ∞) then gives undefined results without an error.

    Args:
        beta: a number (``int`` / ``float`` / a NumPy scalar or one-element array), or a one-element real tensor. A
            tensor that requires grad is a *learnable* β.
        learnable: whether ``owner`` differentiates with respect to β (its class sets
            :attr:`RankingOperator.learnable_beta`).
        owner: who asks, for the messages (e.g. ``"LapSum"``).
        name: the argument's name in the caller's API, for the messages (e.g. ``"steepness"`` for diffsort's).

    Returns:
        A Python float, or, for a learnable β where ``learnable`` is True, the tensor itself (0-d, unchanged and
        still in the caller's graph, so that ``beta.grad`` fills).

    Raises:
        ValueError: β not a number (a string, a bool, ``operator.beta=abc`` on the command line), not finite or not
            positive; a tensor or array β with more than one element; a tensor β on the meta device (no value);
            a β that requires grad where ``learnable`` is False (the message says which operators can learn it).
    """
    what = f"{name} (inverse temperature)" if name == "beta" else name
    if isinstance(beta, np.ndarray):
        if beta.size != 1:
            raise ValueError(f"{what} must be one number, got an array of shape {beta.shape}")
        beta = beta.reshape(()).item()
    if isinstance(beta, Tensor):
        if beta.numel() != 1:
            raise ValueError(f"{what} must be one number, got a tensor of shape {tuple(beta.shape)}")
        if beta.is_meta:
            raise ValueError(f"{what} is on the meta device: it has a shape but no value. Pass a float, or a tensor "
                             "with a value (a model built under torch.device('meta') needs .to_empty(device=…) and "
                             "its parameters initialised)")
        if beta.is_complex() or beta.dtype == torch.bool:
            raise ValueError(f"{what} must be a real number, got a tensor of dtype {beta.dtype}")
        if beta.requires_grad:
            if not learnable:
                raise ValueError(
                    f"{owner} cannot learn {name}: ∂/∂β is not defined for it. Pass a float ({name}.item()), or "
                    "use an operator whose learnable_beta is True (docs/api.md, 'Learnable temperature')")
            if not data_checks_traced(beta):  # one read, at construction (each call checks again: beta_checks)
                check_beta(float(beta.detach()), owner=owner, name=name)
            # a 0-d tensor as is: an nn.Parameter stays one (the operator registers it; optimisers and .to() see it)
            return beta if beta.dim() == 0 else beta.reshape(())
        beta = float(beta)
    if isinstance(beta, (bool, np.bool_)) or not isinstance(beta, numbers.Real):
        # float("2") would read a string, float(True) a flag: neither is a temperature
        raise ValueError(f"{what} must be a finite positive number, got {beta!r} of type {type(beta).__name__}")
    beta = float(beta)
    if not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"{what} must be a finite positive number, got {beta}")
    return beta


def beta_error(beta: Tensor, owner: str) -> ValueError:
    """The error of a learnable β that has left (0, ∞) since construction (an optimiser step took it through 0, or
    to NaN / inf): names β, its value and the parametrisation that prevents it. Reads β (the failure path only)."""
    return ValueError(f"beta (inverse temperature) of {owner} must be a finite positive number, got "
                      f"{float(beta.detach())}: a learnable beta must stay in (0, inf), and an optimiser step can take "
                      "it out. Parametrise it so that it cannot, e.g. beta = torch.nn.functional.softplus(raw) with "
                      "raw the nn.Parameter (docs/api.md, 'Learnable temperature')")


def beta_repr(beta: float | Tensor) -> str:
    """β as ``extra_repr`` shows it: the float, or a learnable tensor's current value marked ``(learnable)`` (no
    comma, so that :func:`~diffrank.operators.backend.guarded_call`'s settings key can strip it)."""
    return f"{beta}" if not isinstance(beta, Tensor) else f"{float(beta.detach()):g}(learnable)"


class DoubleBackwardError(RuntimeError):
    """A second derivative that an operator cannot give (it names the method and what to use instead)."""


class _NoSecondDerivative(torch.autograd.Function):
    """Identity on first-order gradients whose own backward raises :class:`DoubleBackwardError`."""

    generate_vmap_rule = True

    @staticmethod
    def forward(message: str, *grads: Tensor) -> tuple[Tensor, ...]:
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save for backward what the forward computed (forward and context split, as torch.func requires)."""
        ctx.message = inputs[0]

    @staticmethod
    def backward(ctx, *_grads):
        raise DoubleBackwardError(ctx.message)


def refuse_double_backward(grads: tuple[Tensor | None, ...], method: str, alternative: str) -> tuple:
    """Return a backward's gradients so that differentiating them again raises a clear error instead of a wrong
    (silently dropped) second derivative. Call it at the end of a custom ``backward``; a no-op unless the
    backward itself is being recorded (``create_graph=True``, ``torch.func`` transforms).

    Args:
        grads: what ``backward`` returns (``None`` entries pass through).
        method: the operator / method, e.g. ``"SparseSoftTopK(solver='pav').topk_membership"``.
        alternative: what gives a second derivative instead, e.g. ``"solver='dykstra'"``.

    Returns:
        ``grads``, unchanged in value.

    Raises:
        DoubleBackwardError: later, when the returned gradients are differentiated.
    """
    if not torch.is_grad_enabled():
        return grads
    idx = [i for i, g in enumerate(grads) if isinstance(g, Tensor)]
    message = f"{method} has no second derivative (double backward); use {alternative}"
    outs = _NoSecondDerivative.apply(message, *(grads[i] for i in idx))
    res = list(grads)
    for i, o in zip(idx, outs):
        res[i] = o
    return tuple(res)


def constant(make):
    """``make()`` outside any ``torch.func`` transform: a tensor cached across calls must be a plain tensor. Built
    inside ``jacfwd`` / ``hessian`` (whose levels wrap even the ``.to(device)`` of a numpy array), it would be
    that level's wrapper, and a later call would fail with functorch's "level … escaped" assertion.

    Args:
        make: a function of no arguments returning a tensor or a tuple of tensors.

    Returns:
        What ``make`` returns, built with the functorch dispatch disabled (under ``torch.compile``, which cannot
        trace that guard, as it is: dynamo builds it as a graph constant).
    """
    if torch.compiler.is_compiling():
        return make()
    with torch._C._DisableFuncTorch():
        return make()


def _ks_for(ks, idx: Tensor, length: int):
    """The ks of the sets ``idx`` capped at their length L: a list, a (M,) tensor, or the rows ``idx`` of a per-set
    (B, M) tensor (LapSum's)."""
    if isinstance(ks, Tensor):
        rows = ks[idx.to(ks.device)] if ks.dim() == 2 else ks
        return rows.clamp(max=length)
    return [min(k, length) for k in ks]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a computation runs in: float32 for float16 / bfloat16, else ``dtype`` itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _cast(out: Tensor, dtype: torch.dtype) -> Tensor:
    """``out`` in ``dtype`` (no call when it already is)."""
    return out if out.dtype == dtype else out.to(dtype)


def require(operator: nn.Module, capability: str, user: str) -> None:
    """Raise unless ``operator`` provides ``capability``.

    Args:
        operator: a :class:`RankingOperator`.
        capability: one of ``"permutation"``, ``"topk_membership"``, ``"soft_sort"``, ``"soft_rank"``.
        user: who needs it (for the message), e.g. ``"TopKCrossEntropyLoss"``.

    Raises:
        ValueError: if the operator lacks the capability; the message lists what it does provide.
    """
    caps = getattr(operator, "capabilities", frozenset())
    if capability not in caps:
        raise ValueError(
            f"{user} needs an operator that provides '{capability}', but {type(operator).__name__} "
            f"provides only {sorted(caps)}"
        )


class RankingOperator(nn.Module):
    """Base class of every relaxed ranking operator: the public methods and what the contract reads.

    A subclass implements the hooks of the capabilities it declares and nothing public:
    ``_permutation(x, k)`` (``"permutation"``; the other three hooks default to forms built from it),
    or ``_topk_membership(x, ks)``, ``_soft_sort(x)``, ``_soft_rank(x)`` directly. Hooks receive scores
    ``x`` already validated (but for the NaN / inf test of a hook that does it itself,
    :meth:`_hook_checks_finite`), in float32 or float64, and return any floating dtype (the caller casts).

    Args:
        beta: inverse temperature β > 0. Larger β = closer to the hard sort.

    Attributes (declared here with these defaults; a subclass overrides them as class attributes, or per
    instance in ``__init__`` when they depend on its arguments):
        capabilities: what the operator computes (see the module docstring). Default: all four.
        doubly_stochastic: True if the full P has unit column sums too (Sinkhorn, sorting networks,
            LapSum); default False (only rows are normalised, as for NeuralSort and SoftSort).
        permutation_equivariant: True if permuting the items permutes the columns of P the same way
            (every operator that treats items alike); default False (comparator networks compare fixed
            wires).
        hard_beta: a β at which the operator is within 1e-3 of the hard result on scores spaced >= 0.5
            apart, n <= 8 (the contract tests use it); default 100.
        sums_to_k: True if ``topk_membership`` sums to k over the items for every β (every operator built
            on a permutahedron / transport / CDF-sum constraint); False for a per-item threshold sigmoid
            (DFTopK), whose sum only tends to k in the hard limit. Default True.
        learnable_beta: True if β may be a tensor that requires grad (∂/∂β is given, by autograd or in closed
            form; checked at construction and at every call, :meth:`beta_checks`); otherwise such a β raises at
            construction (:func:`check_beta`). Default False.
        twice_differentiable: True if every capability passes ``gradgradcheck`` (exact second derivatives);
            False if some double backward raises :class:`DoubleBackwardError` (the message names the method and
            the alternative). Default True.
        exact_gradient: True if the backward is the derivative of the forward (``gradcheck`` applies); False
            for a Monte-Carlo estimate of the derivative of an expectation (the perturbed operator: each call is a
            piecewise-constant function of its draws, and its own tests check the estimator). Default True.
        low_memory: True if the hook of every capability but the permutation forms no ``(B, m, n)`` buffer:
            O(n log n) time and O(n) memory per set (:mod:`diffrank.operators.memory` names these methods when it
            refuses a dense call). Default False.

    Metadata of the operator table (docs/operators.md, :mod:`diffrank.operators.table`), set by every class that
    a config targets, on the class itself (a subclass does not inherit its parent's paper):
        paper: where the method comes from (authors, venue year, section / equation).
        parameter: the paper's own parameter and its relation to β, e.g. ``τ = 1/β``, ``α = −1/β (…)`` or ``β (…)``
            when the paper uses β itself; for the forms ``X = 1/β`` / ``X = −1/β`` the table prints the value at
            the config's β.
        canonical: only for a class that several configs target (``ComparatorNetwork``): the config whose values
            are the constructor defaults. Such a class may give ``paper`` and ``parameter`` per config, as a
            mapping config name → text.

    Raises:
        ValueError: on a non-positive or non-finite ``beta`` (a tensor β: also at any later call where it has left
            (0, ∞), e.g. after an optimiser step; :meth:`beta_checks`).
    """

    capabilities: frozenset[str] = ALL_CAPABILITIES
    doubly_stochastic: bool = False
    permutation_equivariant: bool = False
    hard_beta: float = 100.0
    sums_to_k: bool = True
    learnable_beta: bool = False
    twice_differentiable: bool = True
    exact_gradient: bool = True
    low_memory: bool = False
    paper: str | Mapping[str, str] = ""
    parameter: str | Mapping[str, str] = ""
    canonical: str | None = None

    def __init__(self, beta: float | Tensor = 1.0) -> None:
        super().__init__()
        self.beta = check_beta(beta, learnable=self.learnable_beta, owner=type(self).__name__)

    # -- the public methods (template: validate, check the capability, compute, cast back) ------------
    def forward(self, scores: Tensor, k: int | None = None, checks: Sequence[Check] = (),
                mask: Tensor | None = None) -> Tensor:
        """Relaxed permutation matrix P (rows = ranks, rank 1 = largest; columns = items).

        Args:
            scores: ``(B, n)`` float16 / bfloat16 / float32 / float64.
            k: ``None`` for the full ``n x n`` matrix, else only the top ``k`` rows (an integer).
            checks: a caller's pending ``(ok, error)`` checks (a loss's label checks), read in the same single
                host synchronisation as the operator's own.
            mask: ``(B, n)`` bool, True = a real item, or None: each set is computed on its real items only, in their
                order, exactly as the same set unpadded (:mod:`diffrank._padding`: one host read of the lengths, one
                call per distinct length); padded items get zero columns and no gradient, the rows past a set's L real
                items are zero (k > L: L rows). Not with ``samples`` > 1.

        Returns:
            ``P`` of shape ``(B, n, n)`` or ``(B, k, n)``, dtype of ``scores``; each row sums to 1.

        Raises:
            ValueError / TypeError: bad scores (see :func:`check_scores`) or k (see :func:`check_k`),
                or an operator without the ``"permutation"`` capability.
            DenseMemoryError: P's rows would not fit in memory (:mod:`diffrank.operators.memory`).
        """
        n = self._check_call(PERMUTATION, "forward", scores)
        k = None if k is None else check_k(k, n)
        if mask is not None:
            return self._masked(scores, mask, checks, "matrix", (n if k is None else k, n), lambda c, _: self.forward(
                c, None if k is None else min(k, c.shape[-1])))
        self._check_memory(PERMUTATION, "forward", scores, k)
        if scores.shape[0] == 0:
            raise_failed([*checks, *self.beta_checks()])
            return self._empty(scores, n if k is None else k, n)
        x = self._compute_input(scores, checks)
        return _cast(guarded_call(self, self._permutation, x, k), scores.dtype)

    def topk_membership(self, scores: Tensor, ks: Sequence[int], checks: Sequence[Check] = (),
                        mask: Tensor | None = None) -> Tensor:
        """Probability that item j is among the top k, for each k in ``ks``.

        Args:
            scores: ``(B, n)`` floating tensor.
            ks: non-empty sequence of ints in ``[1, n]`` (an operator may accept more, e.g. LapSum's real k).
            checks: a caller's pending checks, read with the operator's own (see :meth:`forward`).
            mask: ``(B, n)`` bool, True = a real item, or None: each set is computed on its real items only, in their
                order, exactly as the same set unpadded (:mod:`diffrank._padding`: one host read of the lengths, one
                call per distinct length); padded items get membership 0 and no gradient; a set with L < k real items
                uses k = L. Not with ``samples`` > 1.

        Returns:
            ``(B, len(ks), n)``, dtype of ``scores``.

        Raises:
            ValueError / TypeError: bad scores or ks, or an operator without ``"topk_membership"``.
            DenseMemoryError: rows of P that would not fit in memory (:mod:`diffrank.operators.memory`).
        """
        n = self._check_call(TOPK_MEMBERSHIP, "topk_membership", scores)
        ks, own = self._check_ks(ks, n, scores)
        if mask is not None:
            m = ks.shape[-1] if isinstance(ks, Tensor) else len(ks)
            return self._masked(scores, mask, [*own, *checks], "item", (m, n),
                                lambda c, idx: self.topk_membership(c, _ks_for(ks, idx, c.shape[-1])))
        self._check_memory(TOPK_MEMBERSHIP, "topk_membership", scores, ks)
        checks = [*own, *checks]
        if scores.shape[0] == 0:
            raise_failed([*checks, *self.beta_checks()])
            return self._empty(scores, len(ks), n)
        # an operator whose hook tests the scores for NaN / inf itself skips that read when no other check is pending
        x = self._compute_input(scores, checks, finite=bool(checks) or not self._hook_checks_finite(TOPK_MEMBERSHIP,
                                                                                                    scores))
        return _cast(guarded_call(self, self._topk_membership, x, ks), scores.dtype)

    def soft_sort(self, scores: Tensor, checks: Sequence[Check] = (), mask: Tensor | None = None) -> Tensor:
        """Soft-sorted scores in descending order (``P @ s`` for a P-providing operator).

        Args:
            scores: ``(B, n)`` floating tensor.
            checks: a caller's pending checks, read with the operator's own (see :meth:`forward`).
            mask: ``(B, n)`` bool, True = a real item, or None: each set is computed on its real items only, in their
                order, exactly as the same set unpadded (:mod:`diffrank._padding`: one host read of the lengths, one
                call per distinct length); padded items get no place: a set's L sorted values fill the first L places, 0
                the rest and no gradient. Not with ``samples`` > 1.

        Returns:
            ``(B, n)`` of the dtype of ``scores``.

        Raises:
            ValueError / TypeError: bad scores, or an operator without ``"soft_sort"``.
            DenseMemoryError: rows of P that would not fit in memory (:mod:`diffrank.operators.memory`).
        """
        if mask is not None:
            return self._masked(scores, mask, checks, "position", scores.shape[-1:], lambda c, _: self.soft_sort(c))
        return self._per_item(SOFT_SORT, "soft_sort", scores, self._soft_sort, checks)

    def soft_rank(self, scores: Tensor, checks: Sequence[Check] = (), mask: Tensor | None = None) -> Tensor:
        """Soft ranks (1 = largest); for a P-providing operator the expected rank ``Σ_r r · P[r, j]``.

        Args:
            scores: ``(B, n)`` floating tensor.
            checks: a caller's pending checks, read with the operator's own (see :meth:`forward`).
            mask: ``(B, n)`` bool, True = a real item, or None: each set is computed on its real items only, in their
                order, exactly as the same set unpadded (:mod:`diffrank._padding`: one host read of the lengths, one
                call per distinct length); padded items get rank 0 and no gradient. Not with ``samples`` > 1.

        Returns:
            ``(B, n)`` of the dtype of ``scores``, summing to n(n + 1)/2; values in ``[1, n]`` unless P is only
            row-stochastic (NeuralSort, SoftSort), whose column sums are near 1 only.

        Raises:
            ValueError / TypeError: bad scores, or an operator without ``"soft_rank"``.
            DenseMemoryError: rows of P that would not fit in memory (:mod:`diffrank.operators.memory`).
        """
        if mask is not None:
            return self._masked(scores, mask, checks, "item", scores.shape[-1:], lambda c, _: self.soft_rank(c))
        return self._per_item(SOFT_RANK, "soft_rank", scores, self._soft_rank, checks)

    def _masked(self, scores: Tensor, mask: Tensor, checks: Sequence[Check], kind: str, tail: tuple[int, ...],
                call: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        """A public method on the real items of each set (:func:`diffrank._padding.per_length`): ``call(compact
        (b, L), idx (b,))`` is the method on the sets ``idx``; the caller's checks are read first.

        Raises:
            ValueError: a mask that is not a bool tensor of the scores' shape, or an operator with ``samples`` > 1.
        """
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != scores.shape:
            raise ValueError(f"mask must be a bool tensor of the scores' shape {tuple(scores.shape)} (True = a real "
                             f"item), got {getattr(mask, 'dtype', type(mask).__name__)} "
                             f"{tuple(getattr(mask, 'shape', ()))}")
        if isinstance(self, GumbelSampling) and self.samples != 1:
            raise ValueError(f"{type(self).__name__}(samples={self.samples}) adds a samples dimension, which mask= "
                             "does not place back; call with samples=1 or without mask")
        raise_failed(list(checks))
        return per_length(scores, mask.to(scores.device), call, kind, tuple(tail))

    def _per_item(self, capability: str, method: str, scores: Tensor, hook, checks: Sequence[Check] = ()) -> Tensor:
        """The template of the one-value-per-item methods (``soft_sort``, ``soft_rank``): ``(B, n)``."""
        n = self._check_call(capability, method, scores)
        if scores.shape[0] == 0:
            raise_failed([*checks, *self.beta_checks()])
            return self._empty(scores, n)
        self._check_memory(capability, method, scores, None)
        return _cast(guarded_call(self, hook, self._compute_input(scores, checks)), scores.dtype)

    # -- the hooks a subclass implements ----------------------------------------------------------------
    def _permutation(self, x: Tensor, k: int | None) -> Tensor:
        """Rows of P for validated float32 / float64 scores ``x`` ``(B, n)``: ``(B, n or k, n)``."""
        raise NotImplementedError(f"{type(self).__name__} declares 'permutation' but has no _permutation")

    def _topk_membership(self, x: Tensor, ks: list[int]) -> Tensor:
        """Default: cumulative sums of the top ``max(ks)`` rows of P (Petersen et al. 2022, Eq. 2, inner
        sum Σ_{r<=k} P_{r,j}). Returns ``(B, len(ks), n)`` (``(S, B, len(ks), n)`` for a P with a leading samples
        dimension: the rows are always the second-to-last dimension)."""
        csum = self._permutation(x, max(ks)).cumsum(dim=-2)
        return csum.index_select(-2, self._rows_index(ks, x.device))

    def _rows_index(self, ks: Sequence[int], device: torch.device) -> Tensor:
        """The int64 rows ``k - 1`` on ``device``, cached: a fresh host-to-device copy each call would be a
        synchronisation per training step on CUDA."""
        cache = self.__dict__.setdefault("_rows_index_cache", {})
        key = (tuple(ks), str(device))
        if key not in cache:
            cache[key] = constant(lambda: torch.as_tensor([k - 1 for k in ks], device=device))
        return cache[key]

    def _soft_sort(self, x: Tensor) -> Tensor:
        """Default: ``P @ s``, ``(B, n)`` (``(S, B, n)`` for a P with a leading samples dimension)."""
        return (self._permutation(x, None) @ x.unsqueeze(-1)).squeeze(-1)

    def _soft_rank(self, x: Tensor) -> Tensor:
        """Default: ``Σ_r r · P[r, j]``, ``(B, n)`` (``(S, B, n)`` for a P with a leading samples dimension)."""
        p = self._permutation(x, None)
        r = torch.arange(1, x.shape[1] + 1, dtype=p.dtype, device=p.device)
        return (r.view(-1, 1) * p).sum(dim=-2)

    # -- validation -------------------------------------------------------------------------------------
    def _dense_rows(self, capability: str, n: int, k: int | Sequence[int] | None) -> int | None:
        """The rows m of the ``(B, m, n)`` buffers (rows of P) that the hook of ``capability`` forms, or None when
        it forms none (O(n) memory per set: LapSum's, fast soft sort's and the top-k methods' own hooks).

        Default: a permutation (``k`` rows, or n); a top-k membership, soft sort or soft rank whose hook is the
        default one built from P (``max(ks)`` rows for the top-k, n otherwise); None for a hook a subclass
        overrides. A subclass whose own hook forms rows of P overrides this (the sorting networks' top-k).

        Args:
            capability: one of the four.
            n: items per set.
            k: ``forward``'s k (None: all n rows), or ``topk_membership``'s validated ks.
        """
        if capability == PERMUTATION:
            return n if k is None else k
        hook = _HOOKS[capability]
        if getattr(type(self), hook) is not getattr(RankingOperator, hook):
            return None
        return max(k) if capability == TOPK_MEMBERSHIP else n

    def _check_memory(self, capability: str, method: str, scores: Tensor, k: int | Sequence[int] | None) -> None:
        """Refuse, before allocating, a call whose rows of P cannot fit (:mod:`diffrank.operators.memory`).

        Raises:
            DenseMemoryError: naming the buffer size, the limit and the O(n log n) methods.
        """
        if torch.compiler.is_compiling():  # shapes may be symbolic: a comparison would add guards
            return
        rows = self._dense_rows(capability, scores.shape[1], k)
        if rows is not None:
            check_dense(type(self).__name__, method, scores.shape[0], rows, scores.shape[1],
                        compute_dtype(scores.dtype), scores.device)

    def _check_call(self, capability: str, method: str, scores: Tensor) -> int:
        """The capability and the data-free checks of the scores (no host synchronisation); returns n."""
        if capability not in self.capabilities:  # the message only when it fails
            require(self, capability, f"{type(self).__name__}.{method}")
        return check_scores_shape(scores)

    @staticmethod
    def _empty(scores: Tensor, *shape: int) -> Tensor:
        """The result for a batch of zero sets, ``(0, *shape)``, still attached to ``scores``' graph: no hook
        runs (their reductions over an empty batch would raise)."""
        return scores.new_zeros((0, *shape)) + 0 * scores.sum()

    def _compute_input(self, scores: Tensor, checks: Sequence[Check] = (), finite: bool = True) -> Tensor:
        """Read every data-dependent check (finite scores, ``checks`` and a tensor β's :meth:`beta_checks`) in one
        host synchronisation, then the scores in their compute dtype (float16 / bfloat16 → float32).

        Plain float32 / float64 CPU scores without other pending checks are tested through numpy instead of two
        tensor operations and a read (the same error, in about half the time, which counts at n <= 10³).
        ``finite=False`` leaves the NaN / inf test to the hook (see :meth:`_hook_checks_finite`). Under
        ``torch.compile`` and ``vmap`` nothing is read (:func:`data_checks_traced`)."""
        if data_checks_traced(scores):
            checks, finite = (), False  # no value can be read here (module docstring, "Tracing")
        else:
            checks = [*checks, *self.beta_checks()]
        if not finite:
            if checks:
                raise_failed(checks)
        elif checks or (ok := _cpu_all_finite(scores)) is None:
            raise_failed([finite_check(scores), *checks])
        elif not ok:
            raise non_finite_error()
        dtype = compute_dtype(scores.dtype)
        return scores if scores.dtype == dtype else scores.to(dtype)

    def beta_checks(self) -> list[Check]:
        """The per-call check of a tensor (learnable) β: finite and > 0, as a pending :data:`Check` that the
        public methods read together with the scores' (no extra host synchronisation); ``[]`` for a float β,
        which :func:`check_beta` validated at construction for good.

        An optimiser step can take a learnable β through 0 (NeuralSort's ranks then leave [1, n], LapSum's and fast
        soft sort's reverse the order) or to NaN; every call therefore raises ``ValueError`` naming β and its value
        (:func:`beta_error`). Skipped, with the other data-dependent checks, under ``torch.compile`` and ``vmap``
        (:func:`data_checks_traced`): the result of a bad β is undefined there. Parametrising β as
        ``softplus(raw)`` keeps it positive everywhere (docs/api.md, "Learnable temperature").

        Returns:
            ``[(ok, error)]`` with ``ok`` a 0-d bool tensor on β's device, or ``[]``.
        """
        beta = getattr(self, "beta", None)  # a registered parametrisation computes it here
        if not isinstance(beta, Tensor):
            return []
        b = beta.detach()
        owner = type(self).__name__
        return [((b > 0) & torch.isfinite(b), lambda: beta_error(b, owner))]

    def _hook_checks_finite(self, capability: str, scores: Tensor) -> bool:
        """Whether the hook of ``capability`` tests these scores for NaN / ±inf itself, in a pass over them that it
        makes anyway, and raises :func:`non_finite_error` before it computes anything: validation then does not
        test them first (when no other check is pending, so that the order of the errors stays the same).
        False here; LapSum's CPU top-k returns True."""
        return False

    def _check_ks(self, ks: Sequence[int], n: int, scores: Tensor) -> tuple[list[int], list[Check]]:
        """Validate ``ks`` (host-side: integers in [1, n]); returns them and no data-dependent checks.

        A subclass that accepts other ks (LapSum: real k, tensors) overrides this and returns the checks
        it cannot do without reading tensor data, so that they share the single synchronisation.

        Raises:
            TypeError: a non-integer k, or a 2-D (per-row) or floating tensor of ks (the message says they are
                LapSum's). ValueError: an empty ks, a k outside [1, n].
        """
        if isinstance(ks, Tensor) and (ks.dim() > 1 or ks.is_floating_point()):
            # a (B, M) tensor (one row of ks per set, what topk_membership(x, k=<batch-shaped tensor>) passes) or
            # real ks: name whose they are rather than failing on the first element ("got tensor([1])")
            what = "per-row k (one k per set)" if ks.dim() > 1 else "real-valued k"
            raise TypeError(f"{what} is LapSum's (method='lapsum'); {type(self).__name__} takes one list of integer "
                            f"ks for the whole batch: got a {ks.dtype} tensor of shape {tuple(ks.shape)}. Group the "
                            "sets by k and call once per k, or use LapSum")
        ks = [ks] if isinstance(ks, int) else list(ks)
        if not ks:
            raise ValueError("ks must be a non-empty sequence of integers")
        return [check_k(k, n) for k in ks], []

    def extra_repr(self) -> str:
        """The constructor arguments that ``repr`` shows (β and the paper's own parameters)."""
        return f"beta={beta_repr(self.beta)}"
