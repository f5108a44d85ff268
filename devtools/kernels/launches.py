"""Every kernel launch that ``backend="auto"`` can make on a CUDA device, as compile targets.

:func:`auto_launches` walks the dispatch rules of each kernel module (the block-size, tile and warp helpers that
the launch sites themselves call) over every size the operators send to the kernels, and returns one
:class:`Launch` per distinct compiled program: kernel, Triton signature, constexprs, attributes and warps. The
ahead-of-time checks (:mod:`devtools.kernels.aot`) compile each for real GPU targets, so a new block-size rule
or a new constexpr value is covered as soon as the launch site uses it. A new kernel module is added here.

What reaches the kernels (the operators compute float16 / bfloat16 in float32,
:func:`diffrank.operators.base.compute_dtype`): float32 and float64 scores, except the comparator networks
(float32 only, :func:`diffrank.kernels.networks.supports`).

Triton compiles one program per *specialization* of the integer arguments: an integer equal to 1 becomes the
constant 1, one divisible by 16 carries a divisibility hint; pointers from PyTorch allocations are 16-byte
aligned. Each distinct set of constexprs is therefore listed with up to three examples: ``generic`` (integers
neither 1 nor multiples of 16), ``aligned`` (the largest n of the block's range, a power of two, with the
other counts = 1) and ``n=1`` where n = 1 reaches the kernel.

Importing this module imports triton and the kernel modules (kernels import triton at the top).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from diffrank.kernels import (
    fast_soft_sort,
    lapsum,
    networks,
    neuralsort,
    sinkhorn,
    soft_topk,
    softsort,
    sparse_soft_topk,
)
from diffrank.kernels._common import acc, row_item_blocks

#: the score dtypes that reach the kernels on CUDA (half precision arrives as float32)
SCORE_DTYPES = (torch.float32, torch.float64)
#: n scanned for the kernels without a size limit (every block rule is constant past its cap, <= 1024)
UNBOUNDED_N = tuple(range(1, 4097)) + tuple(2 ** j for j in range(13, 25))

_POINTER = {torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16", torch.bfloat16: "*bf16",
            torch.int32: "*i32", torch.int64: "*i64", torch.int8: "*i8"}
_DIVISIBLE = [["tt.divisibility", 16]]


@dataclass(frozen=True)
class Launch:
    """One compiled program a launch can need: the inputs of ``triton.compile(ASTSource(...))``.

    Attributes:
        kernel: the ``@triton.jit`` function.
        signature: argument name -> Triton type (``"*fp32"``, ``"i32"``, ``"fp32"``, ``"constexpr"``).
        constexprs: argument name -> value, for every ``"constexpr"`` in ``signature``.
        attrs: ``{(argument index,): [["tt.divisibility", 16]]}`` for aligned pointers and integers divisible by 16.
        num_warps: warps per program (Triton's default is 4).
        example: the sizes the launch was derived from, e.g. ``"n=1024 k=1"``.
        role: ``"forward"`` or ``"backward"``.
        int_args: the integer (non-constexpr) parameters of the kernel, some possibly specialised to 1.
    """

    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    attrs: dict = field(hash=False)
    num_warps: int
    example: str
    role: str
    int_args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The kernel's function name, e.g. ``_softsort_fwd``."""
        return self.kernel.__name__

    def config(self) -> str:
        """The configuration in words: the kernel's own constexprs, the float dtypes and the warps."""
        const = [f"{k}={_show(v)}" for k, v in self.constexprs.items() if k not in self.ones]
        dtypes = sorted({t[1:] for t in self.signature.values() if t.startswith(("*f", "*bf"))})
        return " ".join([*const, "/".join(dtypes), f"w{self.num_warps}"])

    @property
    def ones(self) -> tuple[str, ...]:
        """The integer arguments specialised to the constant 1 (part of :attr:`example`, not the config)."""
        return tuple(k for k in self.constexprs if k in self.int_args)

    def key(self) -> tuple:
        """What identifies the compiled program (two launches with equal keys compile to the same binary)."""
        return (self.name, tuple(self.signature.items()), tuple((k, _show(v)) for k, v in self.constexprs.items()),
                tuple(sorted(self.attrs)), self.num_warps)


def _show(v: Any) -> str:
    """A constexpr value as text (``tl.float32`` -> ``fp32``)."""
    return str(v).replace("tl.", "").replace("float", "fp") if not isinstance(v, (bool, int)) else str(v)


def _launch(kernel, args: dict[str, Any], constexprs: dict[str, Any], num_warps: int, example: str,
            role: str) -> Launch:
    """The :class:`Launch` for calling ``kernel`` with ``args`` as Triton's launcher would specialise them.

    ``args`` maps every non-constexpr argument to a torch dtype (a tensor of that dtype), an int or a float.
    """
    signature, consts, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name], consts[name] = "constexpr", constexprs[name]
            continue
        v = args[name]
        if isinstance(v, torch.dtype):
            signature[name] = _POINTER[v]
            attrs[(i,)] = _DIVISIBLE  # PyTorch allocations are 16-byte aligned
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{kernel.__name__}: argument {name} = {v!r} is not a dtype, int or float")
        elif isinstance(v, float):
            signature[name] = "fp32"
        elif v == 1:
            signature[name], consts[name] = "constexpr", 1
        else:
            signature[name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = _DIVISIBLE
    missing = set(args) - set(kernel.arg_names)
    if missing:
        raise TypeError(f"{kernel.__name__} has no arguments {sorted(missing)}")
    ints = tuple(k for k, v in args.items() if isinstance(v, int))
    return Launch(kernel, signature, consts, attrs, num_warps, example, role, ints)


def _examples(sizes: Iterable[int], meta: Callable[[int], Any]) -> dict[Any, dict[str, int]]:
    """Group ``sizes`` by ``meta(n)`` and pick each group's examples: ``generic`` (largest n that is neither 1
    nor a multiple of 16), ``aligned`` (largest n, if a multiple of 16) and ``one`` (n = 1)."""
    groups: dict[Any, list[int]] = {}
    for n in sizes:
        groups.setdefault(meta(n), []).append(n)
    out = {}
    for m, ns in groups.items():
        ex = {}
        generic = [n for n in ns if n != 1 and n % 16]
        if generic:
            ex["generic"] = max(generic)
        if max(ns) % 16 == 0:
            ex["aligned"] = max(ns)
        if 1 in ns:
            ex["one"] = 1
        out[m] = ex
    return out


def _other(kind: str, generic: int) -> int:
    """A count other than n (k, M, m, steps, L) in an example: 1 in ``aligned`` and ``one``, else ``generic``."""
    return generic if kind == "generic" else 1


def auto_launches() -> list[Launch]:
    """Every compiled program ``backend="auto"`` can launch on CUDA, derived from the kernels' dispatch rules.

    Covers each kernel of ``kernels/`` (SoftSort, NeuralSort, LapSum, SOFT top-k, fused Sinkhorn, comparator
    networks, fast soft sort's PAV, sparse soft top-k's PAV), forward and backward, for every dtype the
    operators pass on CUDA (:data:`SCORE_DTYPES`; the networks: float32; sparse top-k: float64), every n from 1
    to the largest the dispatcher sends (unbounded kernels: until every block rule has reached its cap;
    Sinkhorn: :func:`diffrank.kernels.sinkhorn.fused_size`; networks: :data:`diffrank.kernels.networks.MAX_N`)
    and every value of the other constexprs (modes, sigmoids, flags).

    Returns:
        Distinct :class:`Launch` es (by :meth:`Launch.key`), in a stable order.

    Raises:
        TypeError: if a listed argument does not match the kernel's parameters (the listing is out of date).
    """
    out: list[Launch] = []
    for dt in SCORE_DTYPES:
        out += _softsort(dt) + _neuralsort(dt) + _lapsum(dt) + _soft_topk(dt) + _sinkhorn(dt) + _fast_soft_sort(dt)
    out += _networks() + _sparse_soft_topk()
    seen, unique = set(), []
    for launch in out:
        if launch.key() not in seen:
            seen.add(launch.key())
            unique.append(launch)
    return unique


def _softsort(dt: torch.dtype) -> list[Launch]:
    out, ACC = [], acc(dt)
    for (block, item_block), ex in _examples(UNBOUNDED_N, row_item_blocks).items():
        for kind, n in ex.items():
            k = _other(kind, 5)
            e = f"n={n} k={k}"
            out.append(_launch(softsort._softsort_fwd, dict(s_ptr=dt, t_ptr=dt, p_ptr=dt, beta_ptr=dt, n=n, k=k),
                               dict(BLOCK=block, ACC=ACC), 4, e, "forward"))
            ptrs = dict(s_ptr=dt, t_ptr=dt, p_ptr=dt, g_ptr=dt, beta_ptr=dt, dot_ptr=dt)
            out.append(_launch(softsort._softsort_bwd_rows, dict(ptrs, dt_ptr=dt, n=n, k=k),
                               dict(BLOCK=block, ACC=ACC), 4, e, "backward"))
            out.append(_launch(softsort._softsort_bwd_items, dict(ptrs, ds_ptr=dt, n=n, k=k),
                               dict(BLOCK=item_block, ACC=ACC), 4, e, "backward"))
    return out


def _fast_soft_sort(dt: torch.dtype) -> list[Launch]:
    """The PAV kernels: a row of z and of w each either shared by the batch (stride 0) or one per sample (stride n:
    the soft rank shares w = ρ, the soft sort z = ρ/ε, B = 1 shares both, vmap and a learnable β batch both); kl,
    l2, and l2 with w read reversed (the ascending soft sort; kl negates instead); the backward for each set of
    needed gradients."""
    out, i64, f64 = [], torch.int64, torch.float64
    variants = ((False, False), (True, False), (False, True))  # (KL, WREV)
    for block, ex in _examples(UNBOUNDED_N, fast_soft_sort.gather_block).items():
        for n in ex.values():
            for zs in (0, n):
                for ws in (0, n):
                    e = f"n={n} z_stride={zs} w_stride={ws}"
                    for kl, wrev in variants:
                        out.append(_launch(fast_soft_sort._fss_fwd,
                                           dict(z_ptr=dt, order_ptr=i64, w_ptr=dt, worder_ptr=i64, scale_ptr=f64,
                                                mu_ptr=dt, bid_ptr=i64, s_ptr=f64, ws_ptr=f64, acc1_ptr=f64,
                                                acc2_ptr=f64, start_ptr=torch.int32, n=n, z_stride=zs, w_stride=ws),
                                           dict(KL=kl, WREV=wrev, BLOCK=block), fast_soft_sort.NUM_WARPS, e,
                                           "forward"))
                        for need_z, need_w in ((True, False), (False, True), (True, True)):
                            out.append(_launch(fast_soft_sort._fss_bwd,
                                               dict(g_ptr=dt, z_ptr=dt, order_ptr=i64, w_ptr=dt, worder_ptr=i64,
                                                    scale_ptr=f64, bid_ptr=i64, gz_ptr=dt, gw_ptr=dt, n=n,
                                                    z_stride=zs, w_stride=ws),
                                               dict(KL=kl, WREV=wrev, NEED_Z=need_z, NEED_W=need_w),
                                               fast_soft_sort.NUM_WARPS, e, "backward"))
    return out


def _sparse_soft_topk() -> list[Launch]:
    """The sparse top-k PAV: float64 whatever the scores' dtype (the operator solves in float64), mask and magnitude,
    p = 2 and 4/3; its VJPs are PyTorch operations."""
    out, f64 = [], torch.float64
    for ex in _examples(UNBOUNDED_N, lambda n: None).values():
        for kind, n in ex.items():
            k = _other(kind, 5)
            for mag in (False, True):
                for cubic in (False, True):
                    out.append(_launch(sparse_soft_topk._sparse_pav,
                                       dict(s_ptr=f64, y_ptr=f64, a_ptr=f64, c_ptr=f64, den_ptr=f64,
                                            start_ptr=torch.int64, bst_ptr=torch.int32, cnt_ptr=f64, mean_ptr=f64,
                                            m2_ptr=f64, m3_ptr=f64, wsum_ptr=f64, val_ptr=f64, lam_ptr=f64, n=n, k=k),
                                       dict(CUBIC=cubic, MAG=mag), sparse_soft_topk.NUM_WARPS, f"n={n} k={k}",
                                       "forward"))
    return out


def _neuralsort(dt: torch.dtype) -> list[Launch]:
    out, ACC = [], acc(dt)
    for (block, item_block), ex in _examples(UNBOUNDED_N, row_item_blocks).items():
        for kind, n in ex.items():
            k = _other(kind, 5)
            e = f"n={n} k={k}"
            out.append(_launch(neuralsort._neuralsort_fwd, dict(s_ptr=dt, a_ptr=dt, p_ptr=dt, beta_ptr=dt, n=n, k=k),
                               dict(BLOCK=block, ACC=ACC), 4, e, "forward"))
            out.append(_launch(neuralsort._row_dot, dict(p_ptr=dt, g_ptr=dt, dot_ptr=dt, n=n),
                               dict(BLOCK=block, ACC=ACC), 4, e, "backward"))
            out.append(_launch(neuralsort._neuralsort_bwd,
                               dict(p_ptr=dt, g_ptr=dt, dot_ptr=dt, ds_ptr=dt, da_ptr=dt, beta_ptr=dt, n=n, k=k),
                               dict(BLOCK=item_block, ACC=ACC), 4, e, "backward"))
    return out


def _lapsum(dt: torch.dtype) -> list[Launch]:
    out = []
    row = lambda n: lapsum.block_size(n, lapsum._MAX_BLOCK)  # noqa: E731 - the launch sites' rule
    scan = dict(s_ptr=dt, beta_ptr=dt, v_ptr=dt, ab_ptr=dt, below_ptr=dt, above_ptr=dt, out_ptr=dt)
    for block, ex in _examples(UNBOUNDED_N, row).items():
        for kind, n in ex.items():
            M = _other(kind, 5)
            e = f"n={n} M={M}"
            for mode, role in ((lapsum._KNOTS, "forward"), (lapsum._RANK_VJP, "backward"),
                               (lapsum._INVERSE_VJP, "backward")):
                out.append(_launch(lapsum._lapsum_scan, dict(scan, n=n), dict(MODE=mode, BLOCK=block), 4,
                                   f"n={n}", role))
            out.append(_launch(lapsum._lapsum_topk_fwd, dict(s_ptr=dt, beta_ptr=dt, t_ptr=dt, k_ptr=dt, p_ptr=dt,
                                                             n=n, M=M), dict(BLOCK=block), 4, e, "forward"))
            out.append(_launch(lapsum._lapsum_topk_bwd, dict(s_ptr=dt, beta_ptr=dt, t_ptr=dt, k_ptr=dt, g_ptr=dt,
                                                             ds_ptr=dt, dk_ptr=dt, n=n, M=M),
                               dict(BLOCK=block), 4, e, "backward"))
    # the inverse's programs cover blocks of M targets; n enters only as an integer (and its bit length)
    for tblock, ex in _examples(UNBOUNDED_N, lapsum._tblock).items():
        for kind, M in ex.items():
            n = 1 if kind == "one" else 37
            e = f"n={n} M={M}"
            out.append(_launch(lapsum._lapsum_inverse,
                               dict(s_ptr=dt, beta_ptr=dt, a_ptr=dt, b_ptr=dt, knot_ptr=dt, w_ptr=dt, t_ptr=dt,
                                    c_ptr=torch.int32, n=n, M=M, steps=int(n).bit_length()),
                               dict(TBLOCK=tblock), 4, e, "forward"))
            out.append(_launch(lapsum._lapsum_inverse_gaps,
                               dict(s_ptr=dt, beta_ptr=dt, a_ptr=dt, b_ptr=dt, t_ptr=dt, c_ptr=torch.int32, v_ptr=dt,
                                    l_ptr=dt, r_ptr=dt, n=n, M=M), dict(TBLOCK=tblock), 4, e, "backward"))
    return out


def _soft_topk(dt: torch.dtype) -> list[Launch]:
    out, f64 = [], torch.float64
    row = lambda n: soft_topk.block_size(n, soft_topk._MAX_BLOCK)  # noqa: E731 - the launch sites' rule
    # n = 1 never reaches the kernel: k = n = 1 is all ones
    for block, ex in _examples(UNBOUNDED_N[1:], row).items():
        for kind, n in ex.items():
            M = _other(kind, 3)
            e = f"n={n} M={M}"
            out.append(_launch(soft_topk._soft_topk_fwd,
                               dict(s_ptr=dt, start_ptr=f64, k_ptr=f64, scale_ptr=f64, a_ptr=dt, delta_ptr=f64,
                                    stat_ptr=f64, n=n, M=M, max_iter=2000), dict(BLOCK=block), 4, e, "forward"))
            out.append(_launch(soft_topk._soft_topk_bwd,
                               dict(s_ptr=dt, scale_ptr=f64, delta_ptr=f64, g_ptr=dt, ds_ptr=f64, n=n, M=M),
                               dict(BLOCK=block), 4, e, "backward"))
    return out


def _sinkhorn(dt: torch.dtype) -> list[Launch]:
    """SinkhornSort's square cost (items x ranks, n = m), 2 <= n <= fused_size (n = 1 returns before)."""
    out, ACC = [], acc(dt)
    sizes = range(2, sinkhorn.fused_size(dt) + 1)
    for (bn, bm), ex in _examples(sizes, lambda n: sinkhorn._blocks(n, n)).items():
        for kind, n in ex.items():
            steps = _other(kind, 5)
            e = f"n=m={n} steps={steps}"
            for check in (False, True):
                for history in (False, True):
                    out.append(_launch(sinkhorn._sinkhorn_run,
                                       dict(c_ptr=dt, lmu_ptr=dt, lnu_ptr=dt, eps_ptr=dt, f_ptr=dt, g_ptr=dt,
                                            err_ptr=dt, fh_ptr=dt, gh_ptr=dt, n=n, m=n, steps=steps, mu_stride=0,
                                            nu_stride=0, eps_stride=0),
                                       dict(CHECK=check, HISTORY=history, BN=bn, BM=bm, ACC=ACC),
                                       sinkhorn._fwd_warps(bn, bm), e, "forward"))
            out.append(_launch(sinkhorn._sinkhorn_bwd_run,
                               dict(c_ptr=dt, eps_ptr=dt, fh_ptr=dt, gh_ptr=dt, dc_ptr=dt, df_ptr=dt, dg_ptr=dt,
                                    dmu_ptr=dt, dnu_ptr=dt, n=n, m=n, steps=steps, eps_stride=0),
                               dict(BN=bn, BM=bm, ACC=ACC), sinkhorn._bwd_warps(bn, bm), e, "backward"))
    return out


def _networks() -> list[Launch]:
    """float32 only; 2 <= n <= MAX_N (n = 1 has no layers); every sigmoid; rows tiles over every m in 1..n."""
    out, f32, i32, i8 = [], torch.float32, torch.int32, torch.int8
    sizes = range(2, networks.MAX_N + 1)
    for block, ex in _examples(sizes, networks._block).items():
        for kind, n in ex.items():
            L = _other(kind, 7)
            e = f"n={n} L={L}"
            warps = networks._warps(block)
            for code in networks.SIGMOID_CODES.values():
                out.append(_launch(networks._values_fwd,
                                   dict(x_ptr=f32, out_ptr=f32, w_ptr=f32, d_ptr=f32, scratch_ptr=f32, partner_ptr=i32,
                                        sign_ptr=i8, index_ptr=i32, n=n, L=L, beta=10.0, lam=0.25),
                                   dict(SIGMOID=code, BLOCK=block), warps, e, "forward"))
                for has_gout in (True, False):  # values mode: the output's gradient; rows mode: dL/dw
                    out.append(_launch(networks._values_bwd,
                                       dict(gout_ptr=f32, gw_ptr=f32, w_ptr=f32, d_ptr=f32, gx_ptr=f32, scratch_ptr=f32,
                                            partner_ptr=i32, sign_ptr=i8, index_ptr=i32, n=n, L=L, beta=10.0,
                                            lam=0.25),
                                       dict(SIGMOID=code, HAS_GOUT=has_gout, HAS_GW=not has_gout, BLOCK=block), warps,
                                       e, "backward"))
    # rows tiles: (BLOCK_M, BLOCK_N) over every n and every number of rows m in 1..n
    tiles: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
    for n in sizes:
        ms = {1, n} | {m for j in range(13) for m in (2 ** j, 2 ** j + 1) if m <= n}
        for m in ms:
            bm, bn, _ = networks._rows_tiling(m, n)
            ex = tiles.setdefault((bm, bn), {})
            if m != 1 and n % 16 and m % 16:
                ex["generic"] = max(ex.get("generic", (0, 0)), (n, m))
            if n % 16 == 0 and (m == 1 or m % 16 == 0):
                ex["aligned"] = max(ex.get("aligned", (0, 0)), (n, m))
    for (bm, bn), ex in tiles.items():
        for kind, (n, m) in ex.items():
            L = _other(kind, 7)
            e = f"n={n} m={m} L={L}"
            warps = networks._warps(bm * bn)
            out.append(_launch(networks._rows_fwd,
                               dict(y0_ptr=f32, y0_bstride=0, out_ptr=f32, w_ptr=f32, scratch_ptr=f32, partner_ptr=i32,
                                    index_ptr=i32, n=n, m=m, L=L), dict(BLOCK_M=bm, BLOCK_N=bn), warps, e, "forward"))
            out.append(_launch(networks._rows_bwd,
                               dict(y0_ptr=f32, y0_bstride=0, g_ptr=f32, w_ptr=f32, gw_ptr=f32, ysave_ptr=f32,
                                    scratch_ptr=f32, partner_ptr=i32, index_ptr=i32, n=n, m=m, L=L,
                                    S=_other(kind, 3)),  # S = 1: every step kept; 3 = ⌈√7⌉: checkpointed
                               dict(BLOCK_M=bm, BLOCK_N=bn), warps, e, "backward"))
    return out
