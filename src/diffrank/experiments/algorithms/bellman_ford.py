"""Relaxed Bellman-Ford shortest paths on k x k grids with vertex costs (Petersen's thesis §2.4; relaxation
rules of §2.2: softmin-weighted values, unrolled ``for`` loops, relaxed ``while`` loops of Eq. 2.12, T-conorms).

The hard algorithm: distances ``d`` from the source (0, 0) by T parallel (Jacobi) Bellman-Ford sweeps over the
8-neighbourhood, every cell keeping the neighbour of smallest distance as its predecessor; then the path is traced
back from the goal (k-1, k-1) along the predecessors, each visited cell marked with a logical *or*.

The relaxation (thesis §2.2, §2.4):

- **argmin over the eight neighbours** -> ``w = softmax(-β·d_u)`` (the relaxed argmin under logistic/Gumbel
  perturbations of the compared distances); the new distance is the *softmin-weighted value*
  ``d_v <- Σ_u w_v(u)·d_u + c_v`` (not a log-sum-exp). The source is reset to 0 after every sweep (its own cost
  is not counted; every path contains it, so argmin paths do not change). Cells outside the grid hold a finite
  ``big`` value: their softmax weight underflows to exactly 0, so gradients stay finite where ``inf`` would give
  ``0·inf = NaN``.
- **predecessor pointer** -> the last sweep's ``w_v`` (a distribution over the eight neighbours).
- **trace-back** -> a mass ``t`` (one-hot at the goal) is moved to the predecessors,
  ``t_u <- Σ_v t_v·w_v(u)``, and accumulated into the path with a T-conorm (relaxed *or*):
  probabilistic sum ``a + b - ab`` (default), Hamacher ``(a + b + (p-2)ab) / (1 + (p-1)ab)`` (thesis
  Suppl. B; p = 1 is the probabilistic sum) or Yager-1 ``min(1, a + b)``. The source is absorbing (its mass
  stays there), so steps beyond the path length do not add cells.
- **loop** -> ``"for"``: a fixed number of trace-back steps (unrolled; no relaxation needed, thesis §2.2);
  ``"while"``: the relaxed loop "while the trace has not reached the source", condition
  ``P[path_source < 1/2] = σ(β_while·(1/2 - path_source))`` (Eq. 2.13), the output being the
  mixture over the number of iterations of Eq. 2.12, truncated after ``steps`` iterations only (the remaining
  probability goes to the last state). No early exit on a negligible continuation probability: that test would
  read the device every iteration, and a map's result would depend on its batch-mates.
  The threshold 1/2 and a separate steepness ``β_while`` are our choices: the thesis states the condition only
  in words, and with the distance β (≈ 1–10 for costs of order 1) the condition would never become negligible.

Neighbour gathering and the scatter of the trace-back are ``unfold`` / ``fold`` with a 3 x 3 kernel: no
per-cell Python loops. Cost per map: O(T·9·k²) for the sweeps plus O(steps·9·k²) for the trace-back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

T_CONORMS = ("probabilistic", "hamacher", "yager1")
LOOPS = ("for", "while")
BIG = 1e12
"""The finite "infinite" distance of cells outside the grid (and of cells not reached yet)."""

_CENTRE = 4  # index of the centre of a 3 x 3 kernel in unfold's row-major order


def t_conorm(a: Tensor, b: Tensor, kind: str = "probabilistic", p: float = 1.0) -> Tensor:
    """A T-conorm (relaxed logical *or*) of two tensors of values in [0, 1], elementwise.

    Args:
        a, b: broadcastable float tensors in [0, 1].
        kind: ``"probabilistic"`` (``a + b - ab``), ``"hamacher"`` (``(a + b + (p-2)ab) / (1 + (p-1)ab)``,
            p > 0; p = 1 is the probabilistic sum, p = 2 the Einstein sum) or ``"yager1"`` (``min(1, a + b)``,
            the Yager T-conorm with p = 1).
        p: Hamacher's parameter (ignored otherwise).

    Returns:
        The T-conorm, same shape as the broadcast, in [0, 1].

    Raises:
        ValueError: unknown ``kind`` or a Hamacher ``p <= 0``.

    Source: Petersen's thesis, Suppl. B (Table B.2) and §5.3 (Def. 5.1).
    """
    if kind == "probabilistic":
        return a + b - a * b
    if kind == "hamacher":
        if not p > 0:
            raise ValueError(f"Hamacher T-conorm needs p > 0, got {p}")
        return (a + b + (p - 2.0) * a * b) / (1.0 + (p - 1.0) * a * b)
    if kind == "yager1":
        return torch.clamp(a + b, max=1.0)
    raise ValueError(f"unknown T-conorm {kind!r}; choose one of {T_CONORMS}")


def _check_costs(costs: Tensor, big: float) -> None:
    if not isinstance(costs, Tensor) or not costs.is_floating_point():
        raise ValueError(f"costs must be a floating torch.Tensor, got {getattr(costs, 'dtype', type(costs))}")
    costs = costs.detach()
    if costs.dim() != 3 or costs.shape[1] != costs.shape[2] or costs.shape[1] < 2:
        raise ValueError(f"costs must have shape (B, k, k) with k >= 2, got {tuple(costs.shape)}")
    if not costs.numel():
        return
    # one host read for the three data checks (a training step should synchronise once)
    finite, low, high = torch.stack([torch.isfinite(costs).all().to(costs.dtype), costs.min(), costs.max()]).tolist()
    if not finite:
        raise ValueError("costs must be finite (found NaN or inf)")
    if low < 0:
        raise ValueError(f"costs must be >= 0 (negative vertex costs make negative cycles), found minimum {low}")
    k = costs.shape[1]
    if high * k * k >= 1e-3 * big:
        raise ValueError(f"costs up to {high:.3g} are too large for the padding value big={big:g} "
                         f"on a {k}x{k} grid (need max·k² < 1e-3·big)")


def _neighbours(d_pad: Tensor, k: int) -> Tensor:
    """``(B, k+2, k+2)`` padded distances -> ``(B, 9, k, k)`` values of the 3 x 3 neighbourhood of each cell."""
    return F.unfold(d_pad.unsqueeze(1), kernel_size=3).view(d_pad.shape[0], 9, k, k)


def relaxed_distances(costs: Tensor, beta: float, sweeps: int, big: float = BIG) -> tuple[Tensor, Tensor]:
    """Relaxed Bellman-Ford distances and predecessor distributions (thesis §2.4, relaxed argmin of §2.2).

    Args:
        costs: ``(B, k, k)`` float vertex costs >= 0 (the network's prediction), k >= 2.
        beta: inverse temperature of the relaxed argmin (units: 1 / cost); larger = closer to Bellman-Ford.
        sweeps: number T of parallel Bellman-Ford sweeps; a path of L cells needs T >= L - 1.
        big: finite distance of the padding and of unreached cells.

    Returns:
        ``(dist (B, k, k), pred (B, 9, k, k))``, same dtype/device as ``costs``: the relaxed distance from the
        source (source's own cost not counted) and, for every cell, the softmax weights over its 3 x 3
        neighbourhood in row-major offset order (index 4 = the cell itself, weight 0; the source's
        distribution is one-hot on itself, i.e. the trace-back stops there).

    Raises:
        ValueError: bad costs (shape, non-finite, negative, too large for ``big``), ``beta <= 0`` or
            ``sweeps < 1``.
    """
    _check_costs(costs, big)
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if int(sweeps) < 1:
        raise ValueError(f"sweeps must be >= 1, got {sweeps}")
    b, k = costs.shape[0], costs.shape[1]
    not_source = torch.ones(k, k, dtype=costs.dtype, device=costs.device)
    not_source[0, 0] = 0.0
    centre = torch.zeros(9, 1, 1, dtype=torch.bool, device=costs.device)
    centre[_CENTRE] = True
    d = torch.full((b, k, k), big, dtype=costs.dtype, device=costs.device) * not_source
    w = None
    for _ in range(int(sweeps)):
        nb = _neighbours(F.pad(d, (1, 1, 1, 1), value=big), k)
        nb = torch.where(centre, torch.full_like(nb, big), nb)  # a cell is not its own neighbour
        w = torch.softmax(-beta * nb, dim=1)
        d = ((w * nb).sum(1) + costs) * not_source
    source_pred = torch.zeros(9, k, k, dtype=costs.dtype, device=costs.device)
    source_pred[_CENTRE, 0, 0] = 1.0
    pred = w * not_source + source_pred
    return d, pred


def _move(t: Tensor, pred: Tensor, k: int) -> Tensor:
    """Move every cell's mass to its neighbours in proportion to ``pred``: ``t_u <- Σ_v t_v·pred_v(u)``."""
    flow = (t.unsqueeze(1) * pred).view(t.shape[0], 9, k * k)
    # fold adds the 3 x 3 patch of cell v onto v's neighbourhood; padding=1 drops what leaves the grid
    return F.fold(flow, output_size=(k, k), kernel_size=3, padding=1).view(t.shape[0], k, k)


def relaxed_trace_back(pred: Tensor, steps: int, t_conorm_kind: str = "probabilistic", p: float = 1.0,
                       loop: str = "for", while_beta: float = 20.0) -> Tensor:
    """Relaxed path reconstruction from the goal along the predecessor distributions (thesis §2.4, §2.2).

    Args:
        pred: ``(B, 9, k, k)`` predecessor distributions of :func:`relaxed_distances`.
        steps: ``"for"``: the number of trace-back steps (a path of L cells needs L); ``"while"``: the
            maximum number of iterations.
        t_conorm_kind, p: the T-conorm accumulating the visited mass (:func:`t_conorm`).
        loop: ``"for"`` or ``"while"`` (module docstring; Eq. 2.12).
        while_beta: steepness of the relaxed while condition ``P[path_source < 1/2]`` (units: 1 / path value).

    Returns:
        ``(B, k, k)`` relaxed path indicator in [0, 1], same dtype/device as ``pred``.

    Raises:
        ValueError: bad shape, ``steps < 1``, unknown ``loop`` / T-conorm, ``while_beta <= 0``.
    """
    if pred.dim() != 4 or pred.shape[1] != 9 or pred.shape[2] != pred.shape[3]:
        raise ValueError(f"pred must have shape (B, 9, k, k), got {tuple(pred.shape)}")
    if int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if loop not in LOOPS:
        raise ValueError(f"unknown loop {loop!r}; choose one of {LOOPS}")
    if t_conorm_kind not in T_CONORMS:
        raise ValueError(f"unknown T-conorm {t_conorm_kind!r}; choose one of {T_CONORMS}")
    if loop == "while" and not while_beta > 0:
        raise ValueError(f"while_beta must be > 0, got {while_beta}")
    b, k = pred.shape[0], pred.shape[2]
    t = torch.zeros(b, k, k, dtype=pred.dtype, device=pred.device)
    t[:, -1, -1] = 1.0
    path = torch.zeros_like(t)
    if loop == "for":
        for _ in range(int(steps)):
            path = t_conorm(path, t, t_conorm_kind, p)
            t = _move(t, pred, k)
        return path.clamp(0.0, 1.0)  # a + b - ab may exceed 1 by an ulp

    def go_on(path_now: Tensor) -> Tensor:  # P[the loop runs once more], (B, 1, 1)
        """Probability that the relaxed while loop runs once more: ``(B, 1, 1)``, from the start cell's path mass."""
        return torch.sigmoid(while_beta * (0.5 - path_now[:, :1, :1]))

    # Eq. 2.12: Σ_i P[exactly i iterations]·state_i, the rest of the probability on the last state
    p_after = go_on(path)
    out = (1.0 - p_after) * path
    for _ in range(int(steps)):
        path = t_conorm(path, t, t_conorm_kind, p)
        t = _move(t, pred, k)
        p_before, p_after = p_after, p_after * go_on(path)
        out = out + (p_before - p_after) * path
    return (out + p_after * path).clamp(0.0, 1.0)


class RelaxedBellmanFord:
    """Relaxed Bellman-Ford shortest path with relaxed trace-back, as a path-supervision loss (thesis §2.4).

    ``path(costs)`` is the relaxed path in [0, 1]^{k x k} (module docstring); ``loss(costs, true_paths)``
    compares it to the label: ``"l1"`` Σ|p − y|, ``"l2"`` ‖p − y‖₂, ``"l2sq"`` Σ(p − y)² (sums over the k²
    cells; thesis Tables 2.2 and 7.4), mean over the batch.

    Args:
        beta: inverse temperature of the relaxed argmin (1 / cost units).
        sweeps: Bellman-Ford sweeps T (>= longest label path − 1).
        steps: trace-back steps (for) / maximum iterations (while); ``None`` = ``sweeps + 1``.
        t_conorm: ``"probabilistic"``, ``"hamacher"`` or ``"yager1"``; ``p`` is Hamacher's parameter.
        loop: ``"for"`` or ``"while"``; ``while_beta`` as in :func:`relaxed_trace_back`.
        loss: ``"l1"``, ``"l2"`` or ``"l2sq"``.
        big: padding distance (:data:`BIG`).

    Raises:
        ValueError: unknown ``loss`` / ``loop`` / ``t_conorm``, ``beta <= 0``, ``sweeps < 1``.
    """

    name = "relaxed_bellman_ford"
    LOSSES = ("l1", "l2", "l2sq")

    def __init__(self, beta: float = 3.0, sweeps: int = 25, steps: int | None = None,
                 t_conorm: str = "probabilistic", p: float = 1.0, loop: str = "for", while_beta: float = 20.0,
                 loss: str = "l2sq", big: float = BIG) -> None:
        if loss not in self.LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of {self.LOSSES}")
        if loop not in LOOPS:
            raise ValueError(f"unknown loop {loop!r}; choose one of {LOOPS}")
        if t_conorm not in T_CONORMS:
            raise ValueError(f"unknown T-conorm {t_conorm!r}; choose one of {T_CONORMS}")
        if t_conorm == "hamacher" and not p > 0:
            raise ValueError(f"Hamacher T-conorm needs p > 0, got {p}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if int(sweeps) < 1:
            raise ValueError(f"sweeps must be >= 1, got {sweeps}")
        self.beta, self.sweeps = float(beta), int(sweeps)
        self.steps = self.sweeps + 1 if steps is None else int(steps)
        self.t_conorm, self.p, self.loop = t_conorm, float(p), loop
        self.while_beta, self.loss_kind, self.big = float(while_beta), loss, big

    def path(self, costs: Tensor) -> Tensor:
        """Relaxed path ``(B, k, k)`` in [0, 1] for costs ``(B, k, k)`` >= 0 (same dtype/device).

        Raises:
            ValueError: bad costs (see :func:`relaxed_distances`).
        """
        _, pred = relaxed_distances(costs, self.beta, self.sweeps, self.big)
        return relaxed_trace_back(pred, self.steps, self.t_conorm, self.p, self.loop, self.while_beta)

    def loss(self, costs: Tensor, true_paths: Tensor) -> Tensor:
        """Scalar loss between the relaxed path of ``costs`` and the 0/1 label ``true_paths`` (both ``(B, k, k)``).

        Raises:
            ValueError: shapes differ, or bad costs.
        """
        if tuple(true_paths.shape) != tuple(costs.shape):
            raise ValueError(f"costs {tuple(costs.shape)} and true_paths {tuple(true_paths.shape)} differ in shape")
        diff = (self.path(costs) - true_paths.to(costs.dtype)).flatten(1)
        if self.loss_kind == "l1":
            per_map = diff.abs().sum(1)
        elif self.loss_kind == "l2sq":
            per_map = diff.pow(2).sum(1)
        else:
            # the norm's gradient is undefined at 0; the clamp makes it 0 there instead of NaN
            per_map = diff.pow(2).sum(1).clamp_min(1e-12).sqrt()
        return per_map.mean()

    def __repr__(self) -> str:
        return (f"RelaxedBellmanFord(beta={self.beta}, sweeps={self.sweeps}, steps={self.steps}, "
                f"t_conorm={self.t_conorm!r}, p={self.p}, loop={self.loop!r}, loss={self.loss_kind!r})")


__all__ = ["BIG", "LOOPS", "T_CONORMS", "RelaxedBellmanFord", "relaxed_distances", "relaxed_trace_back", "t_conorm"]
