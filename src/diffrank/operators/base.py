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

**Tracing.** The data-dependent checks (NaN / ±inf scores, a caller's pending checks) need a host read, which
``torch.compile`` cannot trace (a graph break, and no ``fullgraph=True``) and ``torch.func.vmap`` refuses
("data-dependent control flow"). They are skipped under ``torch.compiler.is_compiling()`` and for tensors batched
by ``vmap`` at any level (:func:`data_checks_traced`); everything else (shapes, dtypes, k, β, capabilities) is
still checked, and eager calls (``torch.func.grad`` / ``jacrev`` included) raise exactly as before. Validate the
values once outside the compiled or vmapped function where bad input is possible (docs/api.md, "torch.compile
and torch.func").
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch._C import _functorch

from diffrank.operators.backend import guarded_call

PERMUTATION = "permutation"
TOPK_MEMBERSHIP = "topk_membership"
SOFT_SORT = "soft_sort"
SOFT_RANK = "soft_rank"
ALL_CAPABILITIES = frozenset({PERMUTATION, TOPK_MEMBERSHIP, SOFT_SORT, SOFT_RANK})

# a data-dependent check: a 0-d bool tensor that is True when the input is valid, and the error otherwise
Check = tuple[Tensor, Exception]


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
        checks: ``(ok, error)`` pairs; ``ok`` is a 0-d bool tensor, True when the check passes.

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
            raise error


def check_scores_shape(scores: Tensor, name: str = "scores") -> int:
    """The checks of :func:`check_scores` that need no data (no host synchronisation); returns n.

    Raises:
        TypeError: if ``scores`` is not a tensor or not floating point.
        ValueError: if ``scores`` is not 2-D, has ``n < 1``, or lives on the meta device (no values to rank).
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, n), got {type(scores).__name__}")
    if scores.is_meta:
        raise ValueError(f"{name} are on the meta device: they have a shape but no values to rank. Materialise "
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
            tensor; ``bool`` is rejected).
        n: number of items.

    Returns:
        ``k`` as a Python int.

    Raises:
        TypeError: if ``k`` is not an integer.
        ValueError: if ``k < 1`` or ``k > n``.
    """
    if isinstance(k, bool) or not isinstance(k, (numbers.Integral, torch.SymInt)) and not (
        isinstance(k, Tensor) and k.dim() == 0 and not k.is_floating_point()
    ):
        raise TypeError(f"k must be an integer, got {k!r}")
    k = int(k)
    if k < 1 or k > n:
        raise ValueError(f"k must satisfy 1 <= k <= n = {n}, got k = {k}")
    return k


def check_beta(beta: float | Tensor, *, learnable: bool = False, owner: str = "this operator") -> float | Tensor:
    """Validate an inverse temperature β > 0 (finite).

    Args:
        beta: a number, or a 0-d / one-element floating tensor. A tensor that requires grad is a *learnable* β.
        learnable: whether ``owner`` differentiates with respect to β (its class sets
            :attr:`RankingOperator.learnable_beta`).
        owner: who asks, for the messages (e.g. ``"LapSum"``).

    Returns:
        A Python float, or, for a learnable β where ``learnable`` is True, the tensor itself (0-d, unchanged and
        still in the caller's graph, so that ``beta.grad`` fills).

    Raises:
        ValueError: β not a number, not finite or not positive (also ``operator.beta=abc`` on the command line);
            a tensor β with more than one element; a β that requires grad where ``learnable`` is False (the
            message says which operators can learn it).
    """
    if isinstance(beta, Tensor):
        if beta.numel() != 1:
            raise ValueError(f"beta (inverse temperature) must be one number, got shape {tuple(beta.shape)}")
        if beta.requires_grad:
            if not learnable:
                raise ValueError(
                    f"{owner} cannot learn beta: ∂/∂β is not defined for it. Pass a float (beta.item()), or use "
                    "an operator whose learnable_beta is True (docs/api.md, 'Learnable temperature')")
            check_beta(float(beta.detach()), owner=owner)  # one read, at construction
            # a 0-d tensor as is: an nn.Parameter stays one (the operator registers it; optimisers and .to() see it)
            return beta if beta.dim() == 0 else beta.reshape(())
        beta = float(beta)
    try:
        beta = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"beta (inverse temperature) must be a finite positive number, got {beta!r}") from None
    if not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta (inverse temperature) must be a finite positive number, got {beta}")
    return beta


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
        What ``make`` returns, built with the functorch dispatch disabled.
    """
    with torch._C._DisableFuncTorch():
        return make()


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
            form); otherwise such a β raises at construction (:func:`check_beta`). Default False.
        twice_differentiable: True if every capability passes ``gradgradcheck`` (exact second derivatives);
            False if some double backward raises :class:`DoubleBackwardError` (the message names the method and
            the alternative). Default True.

    Raises:
        ValueError: on a non-positive or non-finite ``beta``.
    """

    capabilities: frozenset[str] = ALL_CAPABILITIES
    doubly_stochastic: bool = False
    permutation_equivariant: bool = False
    hard_beta: float = 100.0
    sums_to_k: bool = True
    learnable_beta: bool = False
    twice_differentiable: bool = True

    def __init__(self, beta: float | Tensor = 1.0) -> None:
        super().__init__()
        self.beta = check_beta(beta, learnable=self.learnable_beta, owner=type(self).__name__)

    # -- the public methods (template: validate, check the capability, compute, cast back) ------------
    def forward(self, scores: Tensor, k: int | None = None, checks: Sequence[Check] = ()) -> Tensor:
        """Relaxed permutation matrix P (rows = ranks, rank 1 = largest; columns = items).

        Args:
            scores: ``(B, n)`` float16 / bfloat16 / float32 / float64.
            k: ``None`` for the full ``n x n`` matrix, else only the top ``k`` rows (an integer).
            checks: a caller's pending ``(ok, error)`` checks (a loss's label checks), read in the same single
                host synchronisation as the operator's own.

        Returns:
            ``P`` of shape ``(B, n, n)`` or ``(B, k, n)``, dtype of ``scores``; each row sums to 1.

        Raises:
            ValueError / TypeError: bad scores (see :func:`check_scores`) or k (see :func:`check_k`),
                or an operator without the ``"permutation"`` capability.
        """
        n = self._check_call(PERMUTATION, "forward", scores)
        k = None if k is None else check_k(k, n)
        if scores.shape[0] == 0:
            raise_failed(checks)
            return self._empty(scores, n if k is None else k, n)
        x = self._compute_input(scores, checks)
        return _cast(guarded_call(self, self._permutation, x, k), scores.dtype)

    def topk_membership(self, scores: Tensor, ks: Sequence[int], checks: Sequence[Check] = ()) -> Tensor:
        """Probability that item j is among the top k, for each k in ``ks``.

        Args:
            scores: ``(B, n)`` floating tensor.
            ks: non-empty sequence of ints in ``[1, n]`` (an operator may accept more, e.g. LapSum's real k).
            checks: a caller's pending checks, read with the operator's own (see :meth:`forward`).

        Returns:
            ``(B, len(ks), n)``, dtype of ``scores``.

        Raises:
            ValueError / TypeError: bad scores or ks, or an operator without ``"topk_membership"``.
        """
        n = self._check_call(TOPK_MEMBERSHIP, "topk_membership", scores)
        ks, own = self._check_ks(ks, n, scores)
        checks = [*own, *checks]
        if scores.shape[0] == 0:
            raise_failed(checks)
            return self._empty(scores, len(ks), n)
        # an operator whose hook tests the scores for NaN / inf itself skips that read when no other check is pending
        x = self._compute_input(scores, checks, finite=bool(checks) or not self._hook_checks_finite(TOPK_MEMBERSHIP,
                                                                                                    scores))
        return _cast(guarded_call(self, self._topk_membership, x, ks), scores.dtype)

    def soft_sort(self, scores: Tensor, checks: Sequence[Check] = ()) -> Tensor:
        """Soft-sorted scores in descending order (``P @ s`` for a P-providing operator).

        Args:
            scores: ``(B, n)`` floating tensor.
            checks: a caller's pending checks, read with the operator's own (see :meth:`forward`).

        Returns:
            ``(B, n)`` of the dtype of ``scores``.

        Raises:
            ValueError / TypeError: bad scores, or an operator without ``"soft_sort"``.
        """
        return self._per_item(SOFT_SORT, "soft_sort", scores, self._soft_sort, checks)

    def soft_rank(self, scores: Tensor, checks: Sequence[Check] = ()) -> Tensor:
        """Soft ranks (1 = largest); for a P-providing operator the expected rank ``Σ_r r · P[r, j]``.

        Args:
            scores: ``(B, n)`` floating tensor.
            checks: a caller's pending checks, read with the operator's own (see :meth:`forward`).

        Returns:
            ``(B, n)`` of the dtype of ``scores``, summing to n(n + 1)/2; values in ``[1, n]`` unless P is only
            row-stochastic (NeuralSort, SoftSort), whose column sums are near 1 only.

        Raises:
            ValueError / TypeError: bad scores, or an operator without ``"soft_rank"``.
        """
        return self._per_item(SOFT_RANK, "soft_rank", scores, self._soft_rank, checks)

    def _per_item(self, capability: str, method: str, scores: Tensor, hook, checks: Sequence[Check] = ()) -> Tensor:
        """The template of the one-value-per-item methods (``soft_sort``, ``soft_rank``): ``(B, n)``."""
        n = self._check_call(capability, method, scores)
        if scores.shape[0] == 0:
            raise_failed(checks)
            return self._empty(scores, n)
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

    @staticmethod
    def _compute_input(scores: Tensor, checks: Sequence[Check] = (), finite: bool = True) -> Tensor:
        """Read every data-dependent check (finite scores, and ``checks``) in one host synchronisation,
        then the scores in their compute dtype (float16 / bfloat16 → float32).

        Plain float32 / float64 CPU scores without other pending checks are tested through numpy instead of two
        tensor operations and a read (the same error, in about half the time, which counts at n <= 10³).
        ``finite=False`` leaves the NaN / inf test to the hook (see :meth:`_hook_checks_finite`). Under
        ``torch.compile`` and ``vmap`` nothing is read (:func:`data_checks_traced`)."""
        if data_checks_traced(scores):
            checks, finite = (), False  # no value can be read here (module docstring, "Tracing")
        if not finite:
            if checks:
                raise_failed(checks)
        elif checks or (ok := _cpu_all_finite(scores)) is None:
            raise_failed([finite_check(scores), *checks])
        elif not ok:
            raise non_finite_error()
        dtype = compute_dtype(scores.dtype)
        return scores if scores.dtype == dtype else scores.to(dtype)

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
        """
        ks = [ks] if isinstance(ks, int) else list(ks)
        if not ks:
            raise ValueError("ks must be a non-empty sequence of integers")
        return [check_k(k, n) for k in ks], []

    def extra_repr(self) -> str:
        """The constructor arguments that ``repr`` shows (β and the paper's own parameters)."""
        return f"beta={beta_repr(self.beta)}"
