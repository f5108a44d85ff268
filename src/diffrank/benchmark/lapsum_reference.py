"""The official LapSum CPU extension (Struski et al. 2025, MIT), JIT-compiled from the shared peer folder.

The project never vendors the official code: ``make lapsum-reference`` (``python -m
diffrank.benchmark.lapsum_reference --build``) compiles ``lapsum/topk/cpu/soft_topk.cpp`` of the
checkout named by ``DIFFRANK_LAPSUM_OFFICIAL`` (default ``<repo>/../shared/peers/lapsum_official``) with
``torch.utils.cpp_extension.load`` into ``~/.cache/diffrank/lapsum_official`` (``DIFFRANK_LAPSUM_BUILD``);
the benchmark then loads the built module without compiling (:func:`official_topk` with ``build=False``)
and its rows skip when there is none.

Calling convention of the extension (its ``topk/extension/soft_topk.py``): ``forward(x (B, n), k (B, m),
alpha) -> (thresholds (B, m), prob (B, m, n))`` with ``alpha < 0`` for the largest; ``vjp(x, thresholds,
grad_prob (B, m, n), alpha) -> (grad_x, grad_k, grad_alpha)``. ``alpha`` is a C++ ``float``: α = -1/β is
rounded to float32 (β = 1, 2, 0.5 are exact).
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path

import torch

NAME = "lapsum_official_soft_topk_cpu"
_CACHE: dict = {}


def source_dir() -> Path:
    """The official checkout: ``DIFFRANK_LAPSUM_OFFICIAL``, else ``<repo>/../shared/peers/lapsum_official`` (the main
    checkout), else ``<repo>/../../shared/…`` (a worktree one level further down)."""
    env = os.environ.get("DIFFRANK_LAPSUM_OFFICIAL")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    near = repo.parent / "shared" / "peers" / "lapsum_official"
    return near if near.exists() else repo.parent.parent / "shared" / "peers" / "lapsum_official"


def build_dir() -> Path:
    """Where the compiled module lives (``DIFFRANK_LAPSUM_BUILD`` or ``~/.cache/diffrank/lapsum_official``)."""
    return Path(os.environ.get("DIFFRANK_LAPSUM_BUILD", Path.home() / ".cache" / "diffrank" / "lapsum_official"))


def load_extension(build: bool = False):
    """The compiled extension module, or None when it is not built (and ``build`` is False) or cannot be.

    Args:
        build: compile it when missing (a minute or two on 2 cores; needs a C++ compiler and ninja).

    Returns:
        The module with ``forward`` / ``vjp`` or None.

    Raises:
        FileNotFoundError: ``build=True`` and the official source is not there.
    """
    if "ext" in _CACHE:
        return _CACHE["ext"]
    src = source_dir() / "lapsum" / "topk" / "cpu" / "soft_topk.cpp"
    out = build_dir()
    if not build and not glob.glob(str(out / f"{NAME}*.so")):
        return None
    if not src.exists():
        if build:
            raise FileNotFoundError(f"official LapSum source not found: {src} (set DIFFRANK_LAPSUM_OFFICIAL)")
        return None
    from torch.utils.cpp_extension import load

    out.mkdir(parents=True, exist_ok=True)
    ext = load(name=NAME, sources=[str(src)], build_directory=str(out), extra_cflags=["-O3"], verbose=build)
    _CACHE["ext"] = ext
    return ext


class _OfficialTopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k, alpha, ext):
        thr, prob = ext.forward(x.contiguous(), k.contiguous(), alpha)
        ctx.save_for_backward(x, thr)
        ctx.alpha, ctx.ext = alpha, ext
        return prob

    @staticmethod
    def backward(ctx, g):
        x, thr = ctx.saved_tensors
        gx, _, _ = ctx.ext.vjp(x.contiguous(), thr, g.contiguous(), ctx.alpha)
        return gx, None, None, None


def official_topk(build: bool = False):
    """``f(x (B, n), k: int | float, beta) -> (B, n)``: the official soft top-k (largest first, α = -1/β) with
    its own VJP, or None when the extension is not built."""
    ext = load_extension(build)
    if ext is None:
        return None

    def f(x: torch.Tensor, k: float, beta: float) -> torch.Tensor:
        """Soft top-k membership of the official extension, ``(B, n)``, differentiable in x."""
        kk = torch.full((x.shape[0], 1), float(k), dtype=x.dtype)
        return _OfficialTopK.apply(x, kk, -1.0 / beta, ext)[:, 0]

    return f


def main(argv: list[str] | None = None) -> None:
    """``--build``: compile the extension (``make lapsum-reference``); without: report whether it is built."""
    p = argparse.ArgumentParser(prog="python -m diffrank.benchmark.lapsum_reference")
    p.add_argument("--build", action="store_true")
    args = p.parse_args(argv)
    if args.build and not (source_dir() / "lapsum").exists():
        print(f"[lapsum-reference] skipped: no official source at {source_dir()} (set DIFFRANK_LAPSUM_OFFICIAL)")
        return
    ext = load_extension(build=args.build)
    print(f"[lapsum-reference] {'built' if ext is not None else 'not built'}: {build_dir()}")


if __name__ == "__main__":
    main()
