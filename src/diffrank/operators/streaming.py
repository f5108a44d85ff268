"""Soft ranks and soft sorts of the row-softmax relaxations (NeuralSort, SoftSort) without the n x n matrix P.

Both operators' P has rows P[r, :] = softmax_j(ℓ[r, j]) (rows = ranks r = 1..n, rank 1 = largest), with logits

- NeuralSort (Grover, Wang, Zweig, Ermon, ICLR 2019, Eq. 5 / Cor. 3): ℓ[r, j] = β ((n + 1 − 2r) s_j − (A_s 1)_j),
  ``y`` = the row sums A_s 1 (:func:`~diffrank.operators.neuralsort.abs_diff_row_sums`);
- SoftSort (Prillo & Eisenschlos, ICML 2020, Eq. 3): ℓ[r, j] = −β |s̃_r − s_j|^p, ``y`` = s̃, the scores sorted in
  descending order.

The soft rank ``Σ_r r · P[r, j]`` and the soft sort ``Σ_j P[r, j] s_j`` (the forms
:class:`~diffrank.operators.base.RankingOperator` builds from P) are sums over rows, or row by row: they are
accumulated over chunks of c rows, so no more than a few ``(B, c, n)`` buffers exist at once. The backward pass
recomputes each chunk's rows instead of saving P (rematerialisation): saved for it are s, y (and a tensor β),
O(B · n); the forward costs O(B · n²) time, the backward about twice that. c follows from a byte budget per
``(B, c, n)`` buffer, :data:`CHUNK_BYTES`; nothing is tuned by timing.

Derivatives: with dℓ = ∂L/∂ℓ = P ⊙ (G − (P ⊙ G) 1) row-wise, G = ∂L/∂P, the rank's G[r, j] = r g_j and the sort's
G[r, j] = g_r s_j make dℓ[r, j] = P[r, j] (a_r h_j − b_r) (rank: a = r, b = r (P g)_r, h = g; sort: a = g_r,
b = g_r (P s)_r, h = s), so NeuralSort's ∂L/∂s, ∂L/∂y, ∂L/∂β are four weighted column sums of P (one batched
matrix product per chunk); SoftSort's need dℓ itself (the distance's derivative differs per entry). The backward is
written in differentiable operations: a backward that autograd records (``create_graph=True``, ``torch.func``)
runs the same chunks with its graph, so second derivatives are exact (its graph then holds O(B · n²), as the dense
form's would). Forward mode (``torch.func.jvp`` / ``jacfwd`` / ``hessian``) has its own chunked rule, and
``torch.func.vmap`` folds the mapped dimension into the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.base import check_int, fold_vmapped
from diffrank.operators.memory import DenseMemoryError, check_dense

#: bytes of one ``(B, c, n)`` buffer; the chunk c of rows is the most that fits (at least 1 row). A chunk holds a
#: few such buffers at once (logits, P, the products of the backward), hence 64 MiB: a peak of well under 1 GiB above
#: the O(B · n) tensors whatever n is (SoftSort's soft rank at B = 1, n = 10⁵, float32, forward + backward: 0.46 GiB
#: above the interpreter's own), with chunks large enough that the per-chunk overhead does not count (167 rows of
#: 400 KB there).
CHUNK_BYTES = 64 * 2**20

KINDS = ("neuralsort", "softsort")
MODES = ("rank", "sort")


def chunk_rows(batch: int, n: int, itemsize: int, chunk_bytes: int | None = None) -> int:
    """Rows per chunk: the most rows c whose ``(batch, c, n)`` buffer of ``itemsize``-byte elements stays within
    ``chunk_bytes`` (:data:`CHUNK_BYTES` when None, read at call time), between 1 and n."""
    budget = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return max(1, min(n, budget // max(1, batch * n * itemsize)))


def _chunks(x: Tensor, chunk_bytes: int | None):
    B, n = x.shape
    c = chunk_rows(B, n, x.element_size(), chunk_bytes)
    return [(lo, min(n, lo + c)) for lo in range(0, n, c)]


def _ranks(lo: int, hi: int, x: Tensor) -> Tensor:
    """The ranks lo + 1 .. hi (1 = largest) in x's dtype and device, ``(c,)``."""
    return torch.arange(lo + 1, hi + 1, device=x.device, dtype=x.dtype)


def _logits(x: Tensor, y: Tensor, beta, kind: str, power: float, lo: int, hi: int) -> Tensor:
    """ℓ of rows lo..hi−1, ``(B, c, n)``: the very operations of the operators' dense ``_permutation``, so that each
    row of P is bit for bit the dense one."""
    if kind == "neuralsort":
        scale = (x.shape[-1] + 1 - 2 * _ranks(lo, hi, x)).view(1, -1, 1)
        return (scale * x.unsqueeze(1) - y.unsqueeze(1)) * beta
    dist = (y[:, lo:hi].unsqueeze(-1) - x.unsqueeze(1)).abs()
    if power < 1.0:  # the same values; a recorded backward must not differentiate d^p at d = 0 (_dist_slope)
        dist = torch.where(dist > 0, _nonzero(dist).pow(power), torch.zeros_like(dist))
    elif power != 1.0:
        dist = dist.pow(power)
    return -beta * dist


def _nonzero(d: Tensor) -> Tensor:
    """d with its zeros replaced by 1: d^(p-1) there would be inf (p < 1), and inf · 0 NaN, even in the branch of a
    ``torch.where`` that is not taken (its gradient is multiplied by 0)."""
    return torch.where(d > 0, d, torch.ones_like(d))


def _dist_slope(diff: Tensor, power: float) -> tuple[Tensor, Tensor]:
    """d^p and p d^(p−1) sign(diff) for d = |diff|: ∂(d^p)/∂diff, 0 where d = 0 (there the row r is item j's own
    rank, s̃_r ≡ s_j, and the distance is identically 0: no derivative, where d^(p−1) alone would be inf for p < 1)."""
    d = diff.abs()
    sign = torch.sign(diff).detach()  # its derivative is 0 (a.e.); detached so that a recorded graph holds less
    if power == 1.0:
        return d, sign
    safe = _nonzero(d)
    return torch.where(d > 0, safe.pow(power), torch.zeros_like(d)), power * safe.pow(power - 1) * sign


def _softmax_rows(x: Tensor, y: Tensor, beta, kind: str, power: float, lo: int, hi: int) -> Tensor:
    """P's rows lo..hi−1, ``(B, c, n)`` (the logits are dropped as soon as the softmax is taken)."""
    return torch.softmax(_logits(x, y, beta, kind, power, lo, hi), dim=-1)


# One function per chunk: its (B, c, n) temporaries die when it returns; a loop body would keep the previous chunk's
# alive while the next one is computed (twice the peak).

def _forward_chunk(x: Tensor, y: Tensor, beta, kind: str, mode: str, power: float, lo: int, hi: int) -> Tensor:
    p = _softmax_rows(x, y, beta, kind, power, lo, hi)
    if mode == "rank":  # Σ_r r P[r, j] over this chunk's rows, as the dense form sums it (one chunk: bit for bit)
        return (_ranks(lo, hi, x).view(-1, 1) * p).sum(dim=-2)
    return (p @ x.unsqueeze(-1)).squeeze(-1)  # (P s)_r for this chunk's rows


def _forward(x: Tensor, y: Tensor, beta, kind: str, mode: str, power: float, chunk_bytes: int | None) -> Tensor:
    return _gather((_forward_chunk(x, y, beta, kind, mode, power, lo, hi) for lo, hi in _chunks(x, chunk_bytes)),
                   mode)


def _gather(parts, mode: str) -> Tensor:
    """The chunks' results: the rank's ``(B, n)`` summed as they come (a list of them would be O(n² / c)), the
    sort's ``(B, c)`` rows concatenated."""
    if mode == "sort":
        return torch.cat(list(parts), dim=-1)
    out = None
    for part in parts:
        out = part if out is None else out + part
    return out


def _vjp_chunk(x: Tensor, y: Tensor, beta, kind: str, mode: str, power: float, g: Tensor, lo: int, hi: int,
               beta_grad: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """This chunk's share of ∂L/∂x, of ∂L/∂y (NeuralSort: all of y, ``(B, n)``; SoftSort: rows lo..hi−1, ``(B, c)``)
    and of ∂L/∂β (or None)."""
    if kind == "softsort" and power == 1.0 and not torch.is_grad_enabled():
        return _softsort_vjp_chunk_in_place(x, y, beta, mode, g, lo, hi, beta_grad)
    p = _softmax_rows(x, y, beta, kind, power, lo, hi)  # recomputed, never saved
    gx = None
    if mode == "rank":  # dℓ[r, j] = P[r, j] (a_r h_j − b_r), h = g
        h, a = g, _ranks(lo, hi, x).expand(x.shape[0], -1)  # (B, c)
        b = a * (p @ g.unsqueeze(-1)).squeeze(-1)
    else:  # h = s
        h, a = x, g[:, lo:hi]
        b = a * (p @ x.unsqueeze(-1)).squeeze(-1)
        gx = (a.unsqueeze(1) @ p).squeeze(1)  # the sort's direct term Σ_r g_r P[r, j]
    if kind == "neuralsort":  # ℓ = β (C_r s_j − y_j): column sums U = Σ_r C_r dℓ, V = Σ_r dℓ
        C = (x.shape[-1] + 1 - 2 * _ranks(lo, hi, x)).view(1, -1)
        m = torch.stack((C * a, C * b, a, b), dim=1) @ p  # (B, 4, n)
        U = h * m[:, 0] - m[:, 1]
        V = h * m[:, 2] - m[:, 3]
        gx = beta * U if gx is None else gx + beta * U
        return gx, -beta * V, (x * U - y * V).sum() if beta_grad else None
    # SoftSort: ℓ = −β d^p, d = |s̃_r − s_j|
    dl = p * (a.unsqueeze(-1) * h.unsqueeze(1) - b.unsqueeze(-1))
    del p  # what a recorded backward needs of it, autograd keeps
    dist, slope = _dist_slope(y[:, lo:hi].unsqueeze(-1) - x.unsqueeze(1), power)
    gb = -(dl * dist).sum() if beta_grad else None
    del dist
    q = dl * slope
    del dl, slope
    gx = beta * q.sum(1) if gx is None else gx + beta * q.sum(1)
    return gx, -beta * q.sum(-1), gb


def _softsort_vjp_chunk_in_place(x: Tensor, y: Tensor, beta, mode: str, g: Tensor, lo: int, hi: int,
                                 beta_grad: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`_vjp_chunk` of SoftSort with power 1 when the backward is not recorded: the same formulas, with the
    distance computed once for the logits, the sign and ∂/∂β, and P overwritten by dℓ (half the ``(B, c, n)``
    allocations, each of which the CPU pays in fresh pages: the backward took 2.2 times the dense one without)."""
    diff = y[:, lo:hi].unsqueeze(-1) - x.unsqueeze(1)
    sign = torch.sign(diff)
    dist = diff.abs_()
    p = torch.softmax(-beta * dist, dim=-1)
    if mode == "rank":
        h, a = g, _ranks(lo, hi, x).expand(x.shape[0], -1)
        b = a * (p @ g.unsqueeze(-1)).squeeze(-1)
        gx = None
    else:
        h, a = x, g[:, lo:hi]
        b = a * (p @ x.unsqueeze(-1)).squeeze(-1)
        gx = (a.unsqueeze(1) @ p).squeeze(1)
    dl = p.mul_(torch.addcmul(-b.unsqueeze(-1), a.unsqueeze(-1), h.unsqueeze(1)))  # P ⊙ (a_r h_j − b_r)
    gb = -torch.dot(dl.reshape(-1), dist.reshape(-1)) if beta_grad else None
    del dist, diff
    q = dl.mul_(sign)
    gx = beta * q.sum(1) if gx is None else gx + beta * q.sum(1)
    return gx, -beta * q.sum(-1), gb


def _vjp(x: Tensor, y: Tensor, beta, kind: str, mode: str, power: float, chunk_bytes: int | None, g: Tensor,
         beta_grad: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """∂L/∂x, ∂L/∂y and (``beta_grad``) ∂L/∂β of ``g`` = ∂L/∂out, chunk by chunk (module docstring); every operation
    is differentiable, so that a recorded backward is exact."""
    gx = gy = gb = None
    gy_parts = []
    for lo, hi in _chunks(x, chunk_bytes):
        dx, dy, db = _vjp_chunk(x, y, beta, kind, mode, power, g, lo, hi, beta_grad)
        gx = dx if gx is None else gx + dx
        if kind == "neuralsort":
            gy = dy if gy is None else gy + dy
        else:
            gy_parts.append(dy)
        if beta_grad:
            gb = db if gb is None else gb + db
    if kind == "softsort":
        gy = torch.cat(gy_parts, dim=-1)
    return gx, gy, gb


def _jvp_chunk(x: Tensor, y: Tensor, beta, kind: str, mode: str, power: float, xt: Tensor, yt: Tensor,
               bt: Tensor | None, lo: int, hi: int) -> Tensor:
    p = _softmax_rows(x, y, beta, kind, power, lo, hi)
    if kind == "neuralsort":
        C = (x.shape[-1] + 1 - 2 * _ranks(lo, hi, x)).view(1, -1, 1)
        lt = (C * xt.unsqueeze(1) - yt.unsqueeze(1)) * beta
        if bt is not None:
            lt = lt + (C * x.unsqueeze(1) - y.unsqueeze(1)) * bt
    else:
        dist, slope = _dist_slope(y[:, lo:hi].unsqueeze(-1) - x.unsqueeze(1), power)
        lt = -beta * slope * (yt[:, lo:hi].unsqueeze(-1) - xt.unsqueeze(1))
        if bt is not None:
            lt = lt - bt * dist
    pt = p * (lt - (p * lt).sum(-1, keepdim=True))
    if mode == "rank":
        return (_ranks(lo, hi, x).view(1, 1, -1) @ pt).squeeze(1)
    return (pt @ x.unsqueeze(-1) + p @ xt.unsqueeze(-1)).squeeze(-1)


def _jvp(x: Tensor, y: Tensor, beta, kind: str, mode: str, power: float, chunk_bytes: int | None,
         xt: Tensor | None, yt: Tensor | None, bt: Tensor | None) -> Tensor:
    """The tangent of the output for tangents ``xt``, ``yt``, ``bt`` of x, y, β (None: zero), chunk by chunk."""
    xt = torch.zeros_like(x) if xt is None else xt
    yt = torch.zeros_like(y) if yt is None else yt
    chunks = _chunks(x, chunk_bytes)
    return _gather((_jvp_chunk(x, y, beta, kind, mode, power, xt, yt, bt, lo, hi) for lo, hi in chunks), mode)


class _StreamRows(torch.autograd.Function):
    """Soft rank / soft sort of P's row softmaxes, forward accumulated over chunks of rows, backward recomputing each
    chunk (module docstring). Inputs: x ``(B, n)``, y ``(B, n)``, β (float, or a 0-d tensor: learnable), kind, mode,
    power, chunk_bytes."""

    twice_differentiable = True  # the backward is differentiable operations (read by diffrank.losses.newton)

    @staticmethod
    def forward(x: Tensor, y: Tensor, beta, kind: str, mode: str, power: float, chunk_bytes: int | None) -> Tensor:
        return _forward(x, y, beta, kind, mode, power, chunk_bytes)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Save x, y and a tensor β only: O(B · n) (forward and context split, as torch.func requires)."""
        x, y, beta, ctx.kind, ctx.mode, ctx.power, ctx.chunk_bytes = inputs
        ctx.beta_tensor = isinstance(beta, Tensor)
        if ctx.beta_tensor:
            ctx.save_for_backward(x, y, beta)
            ctx.save_for_forward(x, y, beta)
        else:
            ctx.beta = beta
            ctx.save_for_backward(x, y)
            ctx.save_for_forward(x, y)

    @staticmethod
    def vmap(info, in_dims, x, y, beta, kind, mode, power, chunk_bytes):
        """Batch rule for ``torch.func.vmap``: the vmapped dimension folded into the batch, one call (whose chunk
        then follows from the folded batch)."""
        if isinstance(in_dims[2], int):
            raise NotImplementedError("vmap over beta is not supported by the streamed soft rank / soft sort; "
                                      "vmap over the scores, or loop over the betas")
        size = info.batch_size
        out = _StreamRows.apply(fold_vmapped(x, in_dims[0], size), fold_vmapped(y, in_dims[1], size), beta, kind,
                                mode, power, chunk_bytes)
        return out.unflatten(0, (size, -1)), 0

    @staticmethod
    def _saved(ctx):
        if ctx.beta_tensor:
            return ctx.saved_tensors
        return (*ctx.saved_tensors, ctx.beta)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, y, beta = _StreamRows._saved(ctx)
        beta_grad = ctx.beta_tensor and ctx.needs_input_grad[2]
        gx, gy, gb = _vjp(x, y, beta, ctx.kind, ctx.mode, ctx.power, ctx.chunk_bytes, g, beta_grad)
        if gb is not None:
            gb = gb.reshape(beta.shape).to(beta.dtype)
        return gx, gy, gb, None, None, None, None

    @staticmethod
    def jvp(ctx, xt, yt, bt, *_):
        """Forward mode (``torch.func.jvp`` / ``jacfwd`` / ``hessian``), chunk by chunk."""
        x, y, beta = _StreamRows._saved(ctx)
        bt = bt if ctx.beta_tensor else None
        return _jvp(x, y, beta, ctx.kind, ctx.mode, ctx.power, ctx.chunk_bytes, xt, yt, bt)


class _StreamRowsTraced(_StreamRows):
    """:class:`_StreamRows` without its forward-mode rule, for ``torch.compile``: dynamo refuses to trace a Function
    that defines ``jvp`` (a graph break, and no ``fullgraph=True``); forward mode under compile is not supported."""

    jvp = torch.autograd.Function.jvp


def streamed_rows(x: Tensor, y: Tensor, beta: float | Tensor, kind: str, mode: str, power: float = 1.0,
                  chunk_bytes: int | None = None) -> Tensor:
    """Soft rank or soft sort of NeuralSort / SoftSort without forming P (module docstring).

    Args:
        x: ``(B, n)`` float32 / float64 scores s, validated by the caller (finite).
        y: ``(B, n)`` of the same dtype: NeuralSort's row sums ``(A_s 1)_j = Σ_l |s_j − s_l|``
            (:func:`~diffrank.operators.neuralsort.abs_diff_row_sums`), SoftSort's scores sorted in descending order;
            gradients flow into it (and from it to s through whatever computed it).
        beta: inverse temperature β > 0, a float or a 0-d tensor (a tensor that requires grad gets ∂L/∂β).
        kind: ``"neuralsort"`` (Grover et al. 2019, Eq. 5) or ``"softsort"`` (Prillo & Eisenschlos 2020, Eq. 3).
        mode: ``"rank"``: ``Σ_r r · P[r, j]`` (1 = largest), or ``"sort"``: ``Σ_j P[r, j] s_j`` (descending).
        power: SoftSort's exponent p of the distance (> 0); ignored for NeuralSort.
        chunk_bytes: bytes per ``(B, c, n)`` buffer (None: :data:`CHUNK_BYTES` at call time).

    Returns:
        ``(B, n)`` in x's dtype: what the dense form built from P gives, up to the rounding of the sums' order.

    Raises:
        ValueError: an unknown kind or mode, x and y not both ``(B, n)``, power <= 0, chunk_bytes < 1.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if x.dim() != 2 or y.shape != x.shape:
        raise ValueError(f"x and y must both be (B, n), got {tuple(x.shape)} and {tuple(y.shape)}")
    if not power > 0:
        raise ValueError(f"power must be > 0, got {power}")
    # resolved here, once: the backward (perhaps much later) recomputes the very chunks of the forward
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else check_int(chunk_bytes, "chunk_bytes",
                                                                    what="bytes per (B, c, n) buffer")
    fn = _StreamRowsTraced if torch.compiler.is_compiling() else _StreamRows
    return fn.apply(x, y, beta, kind, mode, float(power), chunk_bytes)


def dense_fits(owner: str, method: str, x: Tensor) -> bool:
    """Whether ``method``'s ``(B, n, n)`` buffers of P fit in memory (:func:`~diffrank.operators.memory.check_dense`
    does not refuse them); True under ``torch.compile``, which reads nothing (no guards on the shapes).

    Args:
        owner, method: for the check's message (unused when it fits).
        x: ``(B, n)`` scores in their compute dtype, on their device.
    """
    if torch.compiler.is_compiling():
        return True
    try:
        check_dense(owner, method, x.shape[0], x.shape[1], x.shape[1], x.dtype, x.device)
    except DenseMemoryError:
        return False
    return True
