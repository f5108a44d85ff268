"""Convert the paper's released embedding pickles (or a cache of ours) into the memory-mapped cache format.

Petersen et al. (ICML 2022, §5.1) release the frozen-backbone embeddings as ``torch.save`` dicts (difftopk
README "(code)"), one file per backbone, with three key schemes:

- ``train_embeddings`` / ``train_labels`` / ``test_embeddings`` / ``test_labels`` (ResNeXt-101 WSL, ImageNet-1K);
- ``imagenet21k_{train,val}_{embeddings,labels}`` (ImageNet-21K-P, float16);
- ``{train,val}_{embeddings,labels}`` (Noisy-Student EfficientNet-L2, ImageNet-1K, float16).

Their ``val`` is ImageNet's official validation set: our ``test`` split. The output is the format of
:mod:`diffrank.experiments.data.embeddings` (``index.json`` + ``<split>_{embeddings,labels}.npy``).

Memory: the file is opened with ``torch.load(mmap=True)`` (zip format, PyTorch >= 1.6: tensors stay on disk
and are paged in per chunk), so the 50 GB ImageNet-21K-P file converts in bounded memory; a legacy
(non-zip) file cannot be memory-mapped and is loaded whole, with a warning. ``weights_only=True`` is tried
first; a pickle that needs arbitrary code (e.g. numpy arrays inside) needs ``--unsafe-pickle``. Each key is
written in chunks of ``--chunk-rows`` rows.

Examples::

    python -m diffrank.experiments.tools.convert_embeddings \\
        ImageNet_embeddings_labels_train_test_IGAM_Resnext101_32x48d_320.p \\
        --out data/embeddings/imagenet1k_resnext101_32x48d_wsl_320 --model resnext101_32x48d_wsl --img-size 320
    # ours -> ours, another dtype
    python -m diffrank.experiments.tools.convert_embeddings data/embeddings/a --out data/embeddings/b --dtype float32
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from diffrank.experiments.data.embedding_cache import INDEX, EmbeddingCacheWriter, open_split, paper_key_scheme

# What the file names of the released pickles say (model, input size): the defaults of --model / --img-size.
KNOWN_FILES = {
    "Resnext101_32x48d_320": ("resnext101_32x48d.fb_wsl_ig1b_ft_in1k", 320),
    "Resnext101_32x32d_320": ("resnext101_32x32d.fb_wsl_ig1b_ft_in1k", 320),
    "Resnext101_32x16d_320": ("resnext101_32x16d.fb_wsl_ig1b_ft_in1k", 320),
    "Resnext101_32x8d_320": ("resnext101_32x8d.fb_wsl_ig1b_ft_in1k", 320),
    "Resnext101_32x48d_224": ("resnext101_32x48d.fb_wsl_ig1b_ft_in1k", 224),
    "tf_efficientnet_l2_ns_timm_transform_800": ("tf_efficientnet_l2.ns_jft_in1k", 800),
}


def load_pickle(path: str | Path, unsafe: bool = False) -> dict[str, Any]:
    """``torch.load`` a released file, memory-mapped where possible.

    Args:
        path: the ``.p`` file written by ``torch.save``.
        unsafe: allow ``weights_only=False`` (runs the pickle's code: only for files you trust).

    Returns:
        The dict of tensors (or arrays).

    Raises:
        FileNotFoundError: no such file. TypeError: the file holds no dict.
        RuntimeError: the file needs ``weights_only=False`` and ``unsafe`` is false (says to pass --unsafe-pickle).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (the released files are listed in docs/topk_imagenet.md)")
    try:
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=not unsafe)
    except RuntimeError as err:
        if "mmap" not in str(err) and "zip" not in str(err):
            raise
        warnings.warn(f"{path} is not in torch.save's zip format and cannot be memory-mapped: loading it whole "
                      f"({path.stat().st_size / 2**30:.1f} GiB into memory)", stacklevel=2)
        obj = torch.load(path, map_location="cpu", weights_only=not unsafe)
    except Exception as err:  # pickle.UnpicklingError from weights_only; its text says which global is refused
        if unsafe:
            raise
        raise RuntimeError(f"{path}: torch.load(weights_only=True) refused it ({str(err).splitlines()[0][:200]}). "
                           "If you trust the file, rerun with --unsafe-pickle") from err
    if not isinstance(obj, dict):
        raise TypeError(f"{path} holds a {type(obj).__name__}, expected a dict of embeddings and labels")
    return obj


def _rows(array: Any, start: int, stop: int) -> np.ndarray:
    part = array[start:stop]
    return part.numpy() if isinstance(part, torch.Tensor) else np.asarray(part)


def _check(name: str, emb: Any, lab: Any) -> None:
    if len(emb.shape) != 2 or len(lab.shape) != 1 or emb.shape[0] != lab.shape[0]:
        raise ValueError(f"split {name}: embeddings {tuple(emb.shape)} and labels {tuple(lab.shape)}: "
                         "need (N, D), (N,)")
    ldt = lab.dtype
    integer = not (ldt.is_floating_point or ldt.is_complex) if isinstance(ldt, torch.dtype) else \
        np.issubdtype(ldt, np.integer)
    if not integer:
        raise ValueError(f"split {name}: labels of dtype {ldt}, expected integers")


def convert(source: str | Path, out: str | Path, model: str | None = None, img_size: int | None = None,
            dtype: str = "float16", chunk_rows: int = 16384, overwrite: bool = False,
            unsafe: bool = False) -> dict[str, Any]:
    """Write ``source`` (a released pickle, or a cache folder of ours) into the cache folder ``out``.

    Returns:
        The written index.

    Raises:
        FileNotFoundError / RuntimeError / TypeError: from :func:`load_pickle` or an incomplete cache of ours.
        KeyError: the pickle's keys fit no known scheme. ValueError: inconsistent shapes or integer labels missing.
    """
    source = Path(source)
    if source.is_dir():  # a cache of ours: copy it (another dtype, or a consolidated copy)
        meta_in = json.loads((source / INDEX).read_text()) if (source / INDEX).is_file() else None
        if meta_in is None:
            raise FileNotFoundError(f"{source / INDEX} missing: {source} is not an embedding cache")
        arrays = {s: open_split(source, s) for s in meta_in["splits"]}
        meta = {k: meta_in.get(k) for k in ("model", "img_size", "weights")}
        meta["source"] = meta_in.get("source")
    else:
        data = load_pickle(source, unsafe=unsafe)
        scheme, keys = paper_key_scheme(list(data))
        arrays = {s: (data[e], data[l]) for s, (e, l) in keys.items()}
        guess = next((v for k, v in KNOWN_FILES.items() if k in source.name), (None, None))
        meta = {"model": model or guess[0] or "unknown", "img_size": img_size or guess[1],
                "weights": "pretrained", "source": f"{source.name} ({scheme} keys)"}
    if model:
        meta["model"] = model
    if img_size:
        meta["img_size"] = img_size
    for s, (e, lab) in arrays.items():
        _check(s, e, lab)
    dims = {int(e.shape[1]) for e, _ in arrays.values()}
    if len(dims) != 1:
        raise ValueError(f"splits of different widths {sorted(dims)}")
    meta.update(dim=dims.pop(), dtype=dtype)
    writer = EmbeddingCacheWriter(out, meta, {s: int(e.shape[0]) for s, (e, _) in arrays.items()}, overwrite=overwrite)
    for s, (e, lab) in arrays.items():
        n = int(e.shape[0])
        for a in range(writer.rows_done(s), n, chunk_rows):
            b = min(a + chunk_rows, n)
            writer.write(s, _rows(e, a, b), _rows(lab, a, b).astype(np.int64))
        print(f"{s}: {n} rows x {meta['dim']} -> {out}")
    return writer.index


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m diffrank.experiments.tools.convert_embeddings",
                                description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("source", help="a released .p file, or a cache folder of ours (round trip / dtype change)")
    p.add_argument("--out", required=True, help="the cache folder to write")
    p.add_argument("--model", default=None, help="backbone name for index.json (default: from the file name)")
    p.add_argument("--img-size", type=int, default=None, help="input size for index.json (default: file name)")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    p.add_argument("--chunk-rows", type=int, default=16384)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--unsafe-pickle", action="store_true", help="allow torch.load(weights_only=False)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 on success, 2 when the input is missing or refused."""
    args = parse_args(argv)
    try:
        convert(args.source, args.out, args.model, args.img_size, args.dtype, args.chunk_rows, args.overwrite,
                args.unsafe_pickle)
    except (FileNotFoundError, RuntimeError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
