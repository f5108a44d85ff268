"""Variable-length lists for :mod:`diffrank.functional`: the real items of each padded set, and a function run on
each set's real items only.

The lists of a batch are grouped by their number of real items L, and each group runs as one ``(b, L)`` batch of
the real items in their order, so a padded list gives exactly what the same list unpadded gives, values and
gradients, for every method (an operator sees no padding at all), and padded items get a fixed value and no
gradient. The cost: one host read of the lengths and one call per distinct length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def real_items(rows: Tensor, mask: Tensor | None, lengths: Tensor | None, batch: tuple[int, ...],
               moved_mask: Callable[[Tensor], Tensor]) -> Tensor | None:
    """The ``(B, n)`` bool of the real items of ``rows`` ``(B, n)``, or None when neither is given.

    Args:
        rows: the scores as the operators take them.
        mask: bool, the shape of ``x`` (True = a real item), or None.
        lengths: integer tensor of the batch shape (``x``'s shape without ``dim``): right padding, the first
            ``lengths`` items along ``dim`` are real; or None.
        batch: the batch shape.
        moved_mask: ``mask`` → ``(B, n)``, as the scores were moved.

    Raises:
        ValueError: both given; a mask that is not bool or not of ``x``'s shape; lengths of another shape, not
            integers, or outside [0, n].
    """
    if mask is None and lengths is None:
        return None
    if mask is not None and lengths is not None:
        raise ValueError("give mask or lengths, not both")
    n = rows.shape[-1]
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor of x's shape (True = a real item), got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)}")
        real = moved_mask(mask)
        if real.shape != rows.shape:
            raise ValueError(f"mask's shape must be x's, got {tuple(mask.shape)}")
        return real.to(rows.device)
    if not isinstance(lengths, Tensor) or lengths.is_floating_point() or lengths.dtype == torch.bool \
            or tuple(lengths.shape) != batch:
        raise ValueError(f"lengths must be an integer tensor of the batch shape {batch} (x's shape without dim), got "
                         f"{getattr(lengths, 'dtype', type(lengths).__name__)} of shape "
                         f"{tuple(getattr(lengths, 'shape', ()))}")
    flat = lengths.reshape(-1, 1).to(rows.device)
    if bool(((flat < 0) | (flat > n)).any()):
        raise ValueError(f"lengths must lie in [0, n = {n}], got {lengths.tolist()}")
    return torch.arange(n, device=rows.device) < flat


def _place(res: Tensor, pos: Tensor, kind: str, tail: tuple[int, ...], fill: float) -> Tensor:
    """A group's result ``(b, *mid, L)`` in the full layout ``(b, *tail)``: ``"item"`` scatters the last dim to the
    items' positions ``pos`` ``(b, L)``; ``"position"`` keeps the first L slots of the last dim; ``"matrix"`` scatters
    the columns and keeps the first rows. The rest is ``fill``."""
    b = res.shape[0]
    if kind == "position":
        return torch.cat([res, res.new_full((*res.shape[:-1], tail[-1] - res.shape[-1]), fill)], dim=-1)
    index = pos.reshape(b, *(1,) * (res.dim() - 2), -1).expand(res.shape)
    full = res.new_full((*res.shape[:-1], tail[-1]), fill).scatter(-1, index, res)
    if kind == "matrix" and full.shape[-2] < tail[-2]:
        full = torch.cat([full, full.new_full((b, tail[-2] - full.shape[-2], tail[-1]), fill)], dim=-2)
    return full


def per_length(rows: Tensor, real: Tensor, fn: Callable[..., Tensor], kind: str, tail: tuple[int, ...],
               fill: float = 0.0, *others: Tensor) -> Tensor:
    """``fn`` on the real items of each set, grouped by length, placed back as ``kind`` says.

    Args:
        rows: ``(B, n)`` scores.
        real: ``(B, n)`` bool, True = a real item.
        fn: ``fn(compact, idx)`` with ``compact`` ``(b, L)`` the real items of the sets ``idx`` ``(b,)`` in their
            order, L >= 1; returns ``(b, *mid, L)`` (``"item"``, ``"matrix"``: its last dim is the items;
            ``"position"``: sorted positions, L of them, or fewer for a top-k).
        kind: ``"item"``, ``"position"`` or ``"matrix"`` (:func:`_place`).
        tail: the shape of one set's full result, e.g. ``(n,)``, ``(M, n)``, ``(m, n)``, ``(k,)``.
        fill: the value of padded items / positions and of a set without real items.
        *others: ``(B, n)`` tensors taken along (a loss's targets): ``fn(compact, idx, *others_compact)`` gets their
            entries at the same items.

    Returns:
        ``(B, *tail)`` of ``rows``' dtype; padded entries ``fill`` with zero gradient.
    """
    counts = real.sum(-1)
    order = real.to(torch.uint8).argsort(dim=-1, descending=True, stable=True)  # the real items first, in order
    # attached to the graph of rows even when no set has a real item (a backward then gives zeros, not an error)
    out = rows.new_full((rows.shape[0], *tail), fill) + rows.reshape(-1)[:0].sum()
    for length in sorted(set(counts.tolist())):  # one host read
        if length == 0:
            continue
        idx = (counts == length).nonzero().squeeze(-1)
        pos = order[idx, :length]
        res = fn(rows[idx].gather(1, pos), idx, *(o[idx].gather(1, pos) for o in others))
        out = out.index_put((idx,), _place(res.to(rows.dtype), pos, kind, tail, fill))
    return out
