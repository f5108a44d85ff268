"""The ``vmap`` rule of the row-wise custom ``autograd.Function``s (networks, SOFT top-k, sparse soft top-k).

Each of them solves one independent problem per row of its ``(B, ...)`` input, often with host-side work (a
numba kernel, an iteration with a stopping test) that ``torch.func.vmap`` cannot trace. Their ``vmap``
staticmethod therefore folds the mapped dimension into the batch, runs the Function once on plain tensors and
unfolds the outputs (the pattern of the PyTorch docs, "Extending torch.func with autograd.Function").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor


def fold_vmap(info, in_dims: Sequence[int | None], apply: Callable, args: Sequence,
              rows: Sequence[int] = (0,)) -> tuple[Tensor | tuple[Tensor, ...], int | tuple[int, ...]]:
    """Run ``apply(*args)`` for a ``vmap`` of batch size V by folding V into the batch dimension.

    Args:
        info: ``torch.func``'s vmap info (``batch_size`` V).
        in_dims: the mapped dimension of each argument (None: not mapped).
        apply: the Function's ``apply``.
        args: its arguments. ``args[rows[0]]`` is the ``(B, ...)`` batch; the other ``rows`` are tensors indexed
            by the batch too, ``(1 or B, ...)`` (or None).
        rows: indices of the batch-indexed arguments.

    Returns:
        ``(outputs, out_dims)``: every output ``(V, B, ...)``, mapped along dimension 0.

    Raises:
        NotImplementedError: a mapped argument that is not batch-indexed (e.g. SOFT top-k's shared anchors).
    """
    V = info.batch_size
    # a non-tensor argument's in_dim is None or, for a container (a stats dict), a container of Nones
    bad = [i for i, d in enumerate(in_dims) if isinstance(d, int) and i not in rows]
    if bad:
        raise NotImplementedError(f"vmap over argument(s) {bad} of {getattr(apply, '__self__', apply)} is not "
                                  "supported (only its batch-indexed inputs can be mapped)")
    folded = list(args)
    B = None
    for i in rows:
        a, d = args[i], in_dims[i]
        if a is None:
            continue
        a = a.unsqueeze(0) if d is None else a.movedim(d, 0)
        if B is None:
            B = a.shape[1]
        elif a.shape[1] == 1 and d is None:  # an unmapped (1, ...) companion broadcasts over the folded batch
            continue
        folded[i] = a.expand(V, B, *a.shape[2:]).reshape(V * B, *a.shape[2:])
    out = apply(*folded)
    if isinstance(out, Tensor):
        return out.unflatten(0, (V, B)), 0
    return tuple(o.unflatten(0, (V, B)) for o in out), (0,) * len(out)
