"""The official LapSum CPU extension (Struski et al. 2025, MIT), JIT-compiled from a checkout of gmum/LapSum.

The project never vendors the official code: ``make lapsum-reference`` (``python -m
diffrank.benchmark.lapsum_reference --build``) compiles ``lapsum/topk/cpu/soft_topk.cpp`` of the
checkout named by ``DIFFRANK_LAPSUM_OFFICIAL`` (``git clone https://github.com/gmum/LapSum``) with
``torch.utils.cpp_extension.load`` into ``~/.cache/diffrank/lapsum_official`` (``DIFFRANK_LAPSUM_BUILD``);
the benchmark and the parity tests then load the built module as it is (no source needed; :func:`official_topk`
with ``build=False``) and their rows skip when there is none.

Calling convention of the extension (its ``topk/extension/soft_topk.py``): ``forward(x (B, n), k (B, m),
alpha) -> (thresholds (B, m), prob (B, m, n))`` with ``alpha < 0`` for the largest; ``vjp(x, thresholds,
grad_prob (B, m, n), alpha) -> (grad_x, grad_k, grad_alpha)``. ``alpha`` is a C++ ``float``: α = -1/β is
rounded to float32 (β = 1, 2, 0.5 are exact).
"""

from __future__ import annotations

import argparse
import glob
import importlib.machinery
import importlib.util
import os
from pathlib import Path

import torch

NAME = "lapsum_official_soft_topk_cpu"
_CACHE: dict = {}


def source_dir() -> Path | None:
    """The official checkout named by ``DIFFRANK_LAPSUM_OFFICIAL``, or None when the variable is not set."""
    env = os.environ.get("DIFFRANK_LAPSUM_OFFICIAL")
    return Path(env) if env else None


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
    out = build_dir()
    built = sorted(glob.glob(str(out / f"{NAME}*.so")))
    if not build:
        if not built:
            return None
        # the built module as it is: loading it needs neither the source nor a compiler
        loader = importlib.machinery.ExtensionFileLoader(NAME, built[0])
        ext = importlib.util.module_from_spec(importlib.util.spec_from_loader(NAME, loader))
        loader.exec_module(ext)
        _CACHE["ext"] = ext
        return ext
    root = source_dir()
    src = None if root is None else root / "lapsum" / "topk" / "cpu" / "soft_topk.cpp"
    if src is None or not src.exists():
        raise FileNotFoundError(f"official LapSum source not found ({src or 'DIFFRANK_LAPSUM_OFFICIAL is not set'}): "
                                "set DIFFRANK_LAPSUM_OFFICIAL to a checkout of https://github.com/gmum/LapSum")
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
    if args.build and (source_dir() is None or not (source_dir() / "lapsum").exists()):
        print(f"[lapsum-reference] skipped: no official source at {source_dir()} (set DIFFRANK_LAPSUM_OFFICIAL to a "
              "checkout of https://github.com/gmum/LapSum)")
        return
    ext = load_extension(build=args.build)
    print(f"[lapsum-reference] {'built' if ext is not None else 'not built'}: {build_dir()}")


if __name__ == "__main__":
    main()
