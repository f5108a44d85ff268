"""The official LapSum extensions (Struski et al. 2025, MIT), JIT-compiled from a checkout of gmum/LapSum.

The project never vendors the official code: ``make lapsum-reference`` (``python -m
diffrank.benchmark.lapsum_reference --build``) compiles ``lapsum/topk/cpu/soft_topk.cpp`` of the
checkout named by ``DIFFRANK_LAPSUM_OFFICIAL`` (``git clone https://github.com/gmum/LapSum``) with
``torch.utils.cpp_extension.load`` into ``~/.cache/diffrank/lapsum_official`` (``DIFFRANK_LAPSUM_BUILD``);
the benchmark and the parity tests then load the built module as it is (no source needed; :func:`official_topk`
with ``build=False``) and their rows skip when there is none. ``--cuda`` builds the CUDA extension
(``lapsum/topk/cuda/soft_topk.cu`` and ``soft_topk_cuda.cpp``, needs ``nvcc``) beside it, which
:func:`official_topk` uses for CUDA tensors (``device="cuda"``). The sources are compiled from copies in the build
folder with ``.type()`` read as ``.scalar_type()``, the edit the official ``setup.py`` makes in place for
PyTorch >= 2.6.

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

NAMES = {"cpu": "lapsum_official_soft_topk_cpu", "cuda": "lapsum_official_soft_topk_cuda"}
SOURCES = {"cpu": ("cpu/soft_topk.cpp",), "cuda": ("cuda/soft_topk.cu", "cuda/soft_topk_cuda.cpp")}
_CACHE: dict = {}


def source_dir() -> Path | None:
    """The official checkout named by ``DIFFRANK_LAPSUM_OFFICIAL``, or None when the variable is not set."""
    env = os.environ.get("DIFFRANK_LAPSUM_OFFICIAL")
    return Path(env) if env else None


def build_dir() -> Path:
    """Where the compiled module lives (``DIFFRANK_LAPSUM_BUILD`` or ``~/.cache/diffrank/lapsum_official``)."""
    return Path(os.environ.get("DIFFRANK_LAPSUM_BUILD", Path.home() / ".cache" / "diffrank" / "lapsum_official"))


def load_extension(build: bool = False, device: str = "cpu"):
    """The compiled extension module, or None when it is not built (and ``build`` is False) or cannot be.

    Args:
        build: compile it when missing (a minute or two on 2 cores; needs a C++ compiler and ninja, and
            ``nvcc`` for CUDA).
        device: ``"cpu"`` or ``"cuda"``: which of the two extensions.

    Returns:
        The module with ``forward`` / ``vjp`` or None.

    Raises:
        FileNotFoundError: ``build=True`` and the official source is not there.
    """
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if kind in _CACHE:
        return _CACHE[kind]
    out = build_dir() / kind if kind == "cuda" else build_dir()
    built = sorted(glob.glob(str(out / f"{NAMES[kind]}*.so")))
    if not build:
        if not built:
            return None
        # the built module as it is: loading it needs neither the source nor a compiler
        loader = importlib.machinery.ExtensionFileLoader(NAMES[kind], built[0])
        ext = importlib.util.module_from_spec(importlib.util.spec_from_loader(NAMES[kind], loader))
        loader.exec_module(ext)
        _CACHE[kind] = ext
        return ext
    root = source_dir()
    # DIFFRANK_LAPSUM_OFFICIAL names the package folder (<checkout>/lapsum) or the checkout itself
    bases = [] if root is None else [b for b in (root / "lapsum" / "topk", root / "lapsum" / "lapsum" / "topk")
                                     if b.is_dir()]
    srcs = [bases[0] / f for f in SOURCES[kind]] if bases else []
    if not srcs or not all(p.exists() for p in srcs):
        raise FileNotFoundError(f"official LapSum source not found ({srcs or 'DIFFRANK_LAPSUM_OFFICIAL is not set'}): "
                                "set DIFFRANK_LAPSUM_OFFICIAL to a checkout of https://github.com/gmum/LapSum")
    from torch.utils.cpp_extension import load

    out.mkdir(parents=True, exist_ok=True)
    copies = []
    for src in srcs:  # PyTorch >= 2.6 removed Tensor::type() in dispatch macros: the official setup.py's own edit
        dst = out / src.name
        dst.write_text(src.read_text().replace(".type()", ".scalar_type()"))
        copies.append(str(dst))
    flags = {"extra_cuda_cflags": ["-O2", "--expt-relaxed-constexpr"]} if kind == "cuda" else {}
    ext = load(name=NAMES[kind], sources=copies, build_directory=str(out), extra_cflags=["-O3"], verbose=build,
               **flags)
    _CACHE[kind] = ext
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


def official_topk(build: bool = False, device: str = "cpu"):
    """``f(x (B, n), k: int | float, beta) -> (B, n)``: the official soft top-k (largest first, α = -1/β) with
    its own VJP, for tensors on ``device`` (its CPU or its CUDA extension), or None when that extension is not
    built."""
    ext = load_extension(build, device)
    if ext is None:
        return None

    def f(x: torch.Tensor, k: float, beta: float) -> torch.Tensor:
        """Soft top-k membership of the official extension, ``(B, n)``, differentiable in x."""
        kk = torch.full((x.shape[0], 1), float(k), dtype=x.dtype, device=x.device)
        return _OfficialTopK.apply(x, kk, -1.0 / beta, ext)[:, 0]

    return f


def main(argv: list[str] | None = None) -> None:
    """``--build``: compile the extension (``make lapsum-reference``; ``--cuda``: the CUDA one); without: report
    whether it is built."""
    p = argparse.ArgumentParser(prog="python -m diffrank.benchmark.lapsum_reference")
    p.add_argument("--build", action="store_true")
    p.add_argument("--cuda", action="store_true", help="the CUDA extension (needs nvcc) instead of the CPU one")
    args = p.parse_args(argv)
    device = "cuda" if args.cuda else "cpu"
    if args.build and (source_dir() is None or not (source_dir() / "lapsum").exists()):
        print(f"[lapsum-reference] skipped: no official source at {source_dir()} (set DIFFRANK_LAPSUM_OFFICIAL to a "
              "checkout of https://github.com/gmum/LapSum)")
        return
    ext = load_extension(build=args.build, device=device)
    print(f"[lapsum-reference] {device} {'built' if ext is not None else 'not built'}: {build_dir()}")


if __name__ == "__main__":
    main()
