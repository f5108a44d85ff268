"""Differentiable sorting / top-k networks (ours: gather + lerp) vs difftopk and diffsort (dense matmuls).

Objective for every cell: forward + backward of Σ out ⊙ G for a fixed random G, where ``out`` is the top-k
rows of P (top-k tables) or the full P (sorting tables); also the forward alone for top-k.

- top-k bitonic: ours (bidirectional, O(L·B·k·n)) vs ``difftopk.DiffTopkNet('bitonic', n, k, sparse=False)``
  (dense O(L·B·n²) memory; its sparse path needs torch-sparse, used when importable).
- top-k splitter selection: ours vs difftopk's sparse splitter when torch-sparse is importable, else vs the
  difftopk dense bitonic cell (the only top-k network difftopk can run without torch-sparse).
- full P: odd-even and bitonic vs ``diffsort.DiffSortNet`` (O(L·B·n³) matmuls).

Peer cells predicted to need more than the memory / time budget are skipped with a note: difftopk dense
bitonic keeps ~L·B·n²/2 floats per call (n = 1000, B = 64: ~15 GB, ~80 s) and its network construction
alone is O(L·n²) numpy; diffsort's full P at n >= 1000 and its odd-even construction (16 GB at n = 1000).
Sigmoid: logistic_phi, β = 1, λ = 0.5 (the top-k paper's ImageNet setting) for top-k; cauchy, β = 10 for P.
"""

from __future__ import annotations

import contextlib
import io
import math

import torch

from diffrank.benchmark.harness import Measurement, compare_row, fwd_bwd, measure
from diffrank.operators import load

TOPK_KW = {"beta": 1.0, "sigmoid": "logistic_phi", "art_lambda": 0.5}
SORT_KW = {"beta": 10.0, "sigmoid": "cauchy", "art_lambda": 0.25}


def _skip(why: str) -> Measurement:
    return Measurement(float("nan"), float("nan"), error=f"skip: {why}")


def _quiet(fn):
    with contextlib.redirect_stdout(io.StringIO()):  # difftopk prints on import / construction
        return fn()


def _bitonic_layers(n: int) -> int:
    N = math.ceil(math.log2(max(n, 2)))
    return N * (N + 1) // 2


def _difftopk_bitonic(n: int, k: int, B: int, dev: str, sparse: bool, mem_budget: float):
    try:
        import difftopk
    except ImportError:
        return None, "difftopk not installed"
    # per layer the dense path keeps W_min, W_max (B, n, c) plus (B, n, k) products, and the network
    # itself is 4 dense (c, n) float64 matrices per layer built in numpy
    c = n // 2 + 1
    need = _bitonic_layers(n) * (B * n * c * 4 * 4 + 4 * c * n * 8) if not sparse else 0
    if need > mem_budget:
        return None, f"skip: ~{need / 1e9:.0f} GB predicted"
    net = _quiet(lambda: difftopk.DiffTopkNet("bitonic", n, k, sparse=sparse, device=dev, steepness=TOPK_KW["beta"],
                                              art_lambda=TOPK_KW["art_lambda"], distribution=TOPK_KW["sigmoid"]))
    return (lambda s: net(s)[1]), None


def _difftopk_splitter(n: int, k: int, dev: str):
    try:
        import difftopk
        import torch_sparse  # noqa: F401
    except ImportError:
        return None
    net = _quiet(lambda: difftopk.DiffTopkNet("splitter_selection", n, k, sparse=True, device=dev,
                                              steepness=TOPK_KW["beta"], art_lambda=TOPK_KW["art_lambda"],
                                              distribution=TOPK_KW["sigmoid"]))
    return lambda s: net(s)[1]


def _diffsort(kind: str, n: int, dev: str):
    import diffsort

    net = diffsort.DiffSortNet(kind, n, device=dev, steepness=SORT_KW["beta"], distribution=SORT_KW["sigmoid"])
    return lambda s: net(s)[1]


def _has_torch_sparse() -> bool:
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        return False
    return True


def _reference_measurements(ref_fn, why: str | None, xp: torch.Tensor, n: int, dev: str, args):
    """``(forward+backward, forward)`` of the difftopk bitonic reference on ``xp``: a skip note when it was
    predicted too heavy, None when difftopk is absent."""
    if ref_fn is None:
        skipped = why is not None and why.startswith("skip")
        r_bwd = r_fwd = Measurement(float("nan"), float("nan"), error=why) if skipped else None
        return r_bwd, r_fwd
    reps = 1 if n >= 1000 else 3
    r_bwd = measure(fwd_bwd(ref_fn, xp), dev, repeats=reps, warmup=0 if n >= 1000 else 1,
                    max_seconds=args.max_seconds)
    with torch.no_grad():
        r_fwd = measure(lambda f=ref_fn, x=xp: f(x), dev, repeats=reps, warmup=0 if n >= 1000 else 1,
                        max_seconds=args.max_seconds)
    return r_bwd, r_fwd


def _topk_rows(n: int, args, ours_bit, ours_ssn, sparse: bool, mem_budget: float) -> tuple[list[dict], list[dict]]:
    """The rows of size ``n`` of the two top-k tables (forward+backward, forward only): ours bitonic and
    splitter against difftopk, at a smaller batch for both when difftopk's dense network does not fit at B."""
    B, k, dev = args.batch, args.k, args.device
    topk_bwd, topk_fwd = [], []
    kk = min(k, n)
    x = torch.randn(B, n, device=dev)
    def fn_bit(s, kk=kk):
        """Top-``kk`` rows of the bitonic top-k network for scores ``s`` ``(B, n)``."""
        return ours_bit(s, k=kk)

    def fn_ssn(s, kk=kk):
        """Top-``kk`` rows of the splitter selection network for scores ``s`` ``(B, n)``."""
        return ours_ssn.topk_rows(s, kk)

    fn_bit(x), fn_ssn(x)  # build and cache the networks outside the measurement, like the peers'
    m_bit = measure(fwd_bwd(fn_bit, x), dev, max_seconds=args.max_seconds)
    m_ssn = measure(fwd_bwd(fn_ssn, x), dev, max_seconds=args.max_seconds)
    with torch.no_grad():
        f_bit = measure(lambda f=fn_bit, x=x: f(x), dev, max_seconds=args.max_seconds)
        f_ssn = measure(lambda f=fn_ssn, x=x: f(x), dev, max_seconds=args.max_seconds)
    ref_fn, why = _difftopk_bitonic(n, kk, B, dev, sparse, mem_budget)
    Bp, xp = B, x
    if ref_fn is None and why and why.startswith("skip") and n <= 1000:
        # too heavy at B: compare both at a smaller batch instead of dropping the cell
        for Bp in (32, 16, 8):
            ref_fn, why = _difftopk_bitonic(n, kk, Bp, dev, sparse, mem_budget)
            if ref_fn is not None:
                break
        xp = x[:Bp].contiguous()
        m_bit = measure(fwd_bwd(fn_bit, xp), dev, max_seconds=args.max_seconds)
        with torch.no_grad():
            f_bit = measure(lambda f=fn_bit, x=xp: f(x), dev, max_seconds=args.max_seconds)
    ref_name = f"difftopk bitonic {'sparse' if sparse else 'dense'}" + (f" (B={Bp} both)" if Bp != B else "")
    r_bwd, r_fwd = _reference_measurements(ref_fn, why, xp, n, dev, args)
    params = {"n": n, "k": kk}
    topk_bwd.append(compare_row("ours bitonic top-k", params, m_bit, r_bwd, ref_name))
    topk_fwd.append(compare_row("ours bitonic top-k", params, f_bit, r_fwd, ref_name))
    ssn_ref = _difftopk_splitter(n, kk, dev)
    if ssn_ref is not None:
        r2 = measure(fwd_bwd(ssn_ref, x), dev, repeats=1 if n >= 1000 else 3, max_seconds=args.max_seconds)
        topk_bwd.append(compare_row("ours splitter top-k", params, m_ssn, r2, "difftopk splitter sparse"))
    else:
        m2 = m_ssn if Bp == B else measure(fwd_bwd(fn_ssn, xp), dev, max_seconds=args.max_seconds)
        topk_bwd.append(compare_row("ours splitter top-k", params, m2, r_bwd, ref_name + " (no torch-sparse)"))
    if Bp != B:
        with torch.no_grad():
            f_ssn = measure(lambda f=fn_ssn, x=xp: f(x), dev, max_seconds=args.max_seconds)
    topk_fwd.append(compare_row("ours splitter top-k", params, f_ssn, r_fwd, ref_name))
    return topk_bwd, topk_fwd


def _full_p_rows(args) -> list[dict]:
    """The full-P table: ours odd-even and bitonic against ``diffsort.DiffSortNet``, n = 16, 32, 100."""
    B, dev = args.batch, args.device
    full = []
    # n = 1000: ours needs one saved (B, n, n) float32 difference per layer (14 GB bitonic, 256 GB odd-even)
    full_sizes = [16, 32, 100]
    for kind, name in (("odd_even", "diffsort_odd_even"), ("bitonic", "diffsort_bitonic")):
        ours = load(name, **SORT_KW).to(dev)
        for n in full_sizes:
            x = torch.randn(B, n, device=dev)
            L = n if kind == "odd_even" else _bitonic_layers(n)
            if L * B * n * n * 4 > 8e9:  # one saved (B, n, n) difference per layer
                m = _skip(f"~{L * B * n * n * 4 / 1e9:.0f} GB")
            else:
                ours(x[:1])
                m = measure(fwd_bwd(lambda s, op=ours: op(s), x), dev, repeats=1 if n >= 1000 else 3,
                            max_seconds=args.max_seconds)
            if n >= 1000:
                r = _skip("O(L·B·n³) matmuls; odd-even construction ~16 GB")
            else:
                ref = _diffsort(kind, n, dev)
                r = measure(fwd_bwd(ref, x), dev, repeats=1 if n >= 100 else 5, max_seconds=args.max_seconds)
            full.append(compare_row(f"ours {kind} full P", {"n": n}, m, r, f"diffsort {kind}"))
    return full


def run(args) -> list[tuple[str, list[dict]]]:
    """Three tables: top-k fwd+bwd, top-k forward only, full P fwd+bwd (see the module docstring)."""
    dev = args.device
    sizes = [16, 100] if args.quick else [16, 100, 1000, 10000]
    mem_budget = 20e9
    topk_bwd, topk_fwd = [], []
    ours_bit = load("difftopk_bitonic", **TOPK_KW).to(dev)
    ours_ssn = load("difftopk_splitter", **TOPK_KW).to(dev)
    sparse = _has_torch_sparse()
    for n in sizes:
        bwd, fwd = _topk_rows(n, args, ours_bit, ours_ssn, sparse, mem_budget)
        topk_bwd += bwd
        topk_fwd += fwd
    full = _full_p_rows(args)
    return [("top-k rows of P, forward+backward", topk_bwd), ("top-k rows of P, forward only", topk_fwd),
            ("full P (sorting), forward+backward", full)]
