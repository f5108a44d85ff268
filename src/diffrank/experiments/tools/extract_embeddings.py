"""Extract penultimate embeddings of a timm backbone into a resumable, memory-mapped cache.

The frozen-backbone protocol of Petersen et al. (ICML 2022, §5.1; difftopk README "(code)") trains a linear
head on pre-computed embeddings. This module computes them: a timm model by name with its classifier removed
(``num_classes=0``: the pooled penultimate features), its own evaluation transform
(``timm.data.resolve_data_config`` + ``create_transform``; ``--img-size`` overrides the input size), over an
image folder (torchvision ``ImageFolder`` layout) or a Hugging Face ``datasets`` dataset, into the cache format
of :mod:`diffrank.experiments.data.embeddings` (float16 ``.npy`` files + ``index.json``).

Examples::

    # ImageNet-1K in ImageFolder layout (<root>/train/<wnid>/*.JPEG, <root>/val/<wnid>/*.JPEG), 320 px
    python -m diffrank.experiments.tools.extract_embeddings \\
        --model resnext101_32x48d.fb_wsl_ig1b_ft_in1k --pretrained \\
        --img-size 320 --image-folder /data/imagenet --out data/embeddings/imagenet1k_resnext101_32x48d_wsl_320
    # a local weight file, a Hugging Face dataset saved with save_to_disk
    python -m diffrank.experiments.tools.extract_embeddings \\
        --model tf_efficientnet_l2.ns_jft_in1k --checkpoint l2.pth \\
        --hf-dataset /data/imagenet-1k-hf --split train=train --split test=validation --out ...

Resumable: every ``--chunk-batches`` batches the rows are flushed and ``rows_done`` in ``index.json`` advances
atomically; rerunning the same command after a kill continues at ``rows_done`` (the order is deterministic:
sorted file list or the dataset's row order, no shuffling). ``--max-batches`` stops early on purpose (tests).

Weights: ``--pretrained`` (timm / Hugging Face cache; needs them cached when offline), ``--checkpoint PATH``
(a local state dict), or ``--random-weights`` (timing and tests only; recorded in the index). Missing weights
exit with status 2 and a message naming the file and how to provide it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from diffrank.experiments.data.embedding_cache import EmbeddingCacheWriter


class WeightsMissing(RuntimeError):
    """Pretrained weights are neither cached nor given as a local file (the message says how to provide them)."""


def build_model(name: str, pretrained: bool, checkpoint: str | None) -> torch.nn.Module:
    """A timm model with its classifier removed: ``model(images (B, 3, H, W)) -> (B, num_features)``.

    Raises:
        WeightsMissing: ``pretrained`` weights not in the cache / unreachable, or ``checkpoint`` absent.
        RuntimeError: unknown model name (timm's message).
    """
    import timm

    if not timm.is_model(name):
        raise RuntimeError(f"timm has no model {name!r} (timm.list_models('{name.split('.')[0]}*') lists near names)")
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file():
            raise WeightsMissing(f"checkpoint file {path} does not exist: pass the path of a state dict for {name}")
        model = timm.create_model(name, pretrained=False)
        timm.models.load_checkpoint(model, str(path), strict=True)
        model.reset_classifier(0)
        return model.eval()
    if not pretrained:
        return timm.create_model(name, pretrained=False, num_classes=0).eval()
    try:
        return timm.create_model(name, pretrained=True, num_classes=0).eval()
    except Exception as err:  # huggingface_hub / urllib / torch.hub raise unrelated types for "not available"
        cfg = timm.create_model(name, pretrained=False, num_classes=0).pretrained_cfg
        where = (f"the file model.safetensors (or pytorch_model.bin) of the Hugging Face repo {cfg['hf_hub_id']} in "
                 "the HF cache ($HF_HOME/hub, default ~/.cache/huggingface/hub)") if cfg.get("hf_hub_id") else \
            f"{cfg.get('file') or cfg.get('url')} in the torch hub cache (~/.cache/torch/hub/checkpoints)"
        fetch = (f"`huggingface-cli download {cfg['hf_hub_id']}` on a machine online, then copy the cache folder "
                 "here") if cfg.get("hf_hub_id") else f"download {cfg.get('url')}"
        raise WeightsMissing(f"pretrained weights for {name} not found: timm looks for {where} ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:200]}). Provide them: {fetch}; or pass --checkpoint PATH "
                             "to a local weight file") from err


def eval_transform(model: torch.nn.Module, img_size: int | None):
    """The model's own evaluation transform (its test input size unless ``img_size`` is given).

    Returns:
        ``(transform: PIL image -> (3, S, S) float32, data_config dict)``.
    """
    from timm.data import create_transform, resolve_data_config

    config = resolve_data_config({"img_size": img_size} if img_size else {}, model=model, use_test_size=True)
    return create_transform(**config, is_training=False), config


class HFImages(torch.utils.data.Dataset):
    """Rows of a Hugging Face dataset as ``(transformed image, label)`` (decoded lazily, row order kept)."""

    def __init__(self, ds, transform, image_column: str, label_column: str) -> None:
        missing = [c for c in (image_column, label_column) if c not in ds.column_names]
        if missing:
            raise KeyError(f"columns {missing} not in the dataset (columns: {ds.column_names}); set --image-column / "
                           "--label-column")
        self.ds, self.transform, self.image_column, self.label_column = ds, transform, image_column, label_column

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        row = self.ds[int(i)]
        return self.transform(row[self.image_column].convert("RGB")), int(row[self.label_column])


def open_splits(args, transform) -> dict[str, torch.utils.data.Dataset]:
    """Our split name -> dataset of ``(image (3, S, S) float32, label int)`` in a deterministic order.

    Raises:
        FileNotFoundError: an image folder split is missing. ValueError: splits' classes differ.
    """
    pairs = [s.split("=", 1) if "=" in s else [s, s] for s in args.split] if args.split else \
        [["train", "train"], ["test", "val" if args.image_folder else "validation"]]
    out = {}
    if args.image_folder:
        from torchvision.datasets import ImageFolder

        classes = None
        for ours, sub in pairs:
            folder = Path(args.image_folder) / sub
            if not folder.is_dir():
                raise FileNotFoundError(f"image folder {folder} (split {ours}) does not exist: the ImageFolder layout "
                                        f"is <root>/<split>/<class>/<image>; map names with --split {ours}=<folder>")
            ds = ImageFolder(str(folder), transform=transform)  # samples sorted by class, then file name
            if classes is not None and ds.classes != classes:
                raise ValueError(f"{folder} has other classes than the first split ({len(ds.classes)} vs "
                                 f"{len(classes)}): the label indices would disagree")
            classes = ds.classes
            out[ours] = ds
        return out
    import datasets

    source = Path(args.hf_dataset)
    loaded = datasets.load_from_disk(str(source)) if source.exists() else None
    for ours, name in pairs:
        if loaded is None:
            ds = datasets.load_dataset(args.hf_dataset, split=name)
        elif isinstance(loaded, datasets.DatasetDict):
            if name not in loaded:
                raise KeyError(f"{source} has no split {name!r} (splits: {list(loaded)}); "
                               f"map with --split {ours}=<name>")
            ds = loaded[name]
        else:
            if len(pairs) > 1:
                raise ValueError(f"{source} holds a single Dataset: give one --split {ours}")
            ds = loaded
        out[ours] = HFImages(ds, transform, args.image_column, args.label_column)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m diffrank.experiments.tools.extract_embeddings",
                                description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="timm model name, e.g. resnext101_32x48d.fb_wsl_ig1b_ft_in1k")
    w = p.add_mutually_exclusive_group()
    w.add_argument("--pretrained", action="store_true", help="timm's pretrained weights (the default)")
    w.add_argument("--checkpoint", help="a local weight file (state dict) for --model")
    w.add_argument("--random-weights", action="store_true", help="untrained weights (timing and tests only)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--image-folder", help="root of an ImageFolder layout: <root>/<split>/<class>/<image>")
    src.add_argument("--hf-dataset", help="a Hugging Face dataset name, or a folder written by save_to_disk")
    p.add_argument("--split", action="append", default=[],
                   help="OURS[=SOURCE], repeatable; default train=train test=val (folder) / test=validation (HF)")
    p.add_argument("--image-column", default="image")
    p.add_argument("--label-column", default="label")
    p.add_argument("--out", required=True, help="the cache folder (index.json + .npy files)")
    p.add_argument("--img-size", type=int, default=None, help="input size (default: the model's test size)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--chunk-batches", type=int, default=20, help="batches per flushed, resumable chunk")
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--overwrite", action="store_true", help="discard a cache already in --out")
    p.add_argument("--max-batches", type=int, default=None, help="stop after this many batches (tests)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="torch seed before the model is built (--random-weights)")
    return p.parse_args(argv)


def extract(args: argparse.Namespace) -> dict[str, float]:
    """Run the extraction; returns ``{"images": count, "seconds": wall time, "images_per_s": rate}``.

    Raises:
        WeightsMissing, FileNotFoundError, KeyError, ValueError: as the helpers above.
    """
    from tqdm import tqdm

    weights = f"random:seed={args.seed}" if args.random_weights else \
        f"checkpoint:{Path(args.checkpoint).name}" if args.checkpoint else "pretrained"
    torch.manual_seed(args.seed)  # --random-weights: the same weights in a resumed process
    model = build_model(args.model, pretrained=weights == "pretrained", checkpoint=args.checkpoint)
    transform, config = eval_transform(model, args.img_size)
    splits = open_splits(args, transform)
    device = torch.device(args.device)
    model = model.to(device)
    meta = {"model": args.model, "dim": int(model.num_features), "img_size": int(config["input_size"][-1]),
            "dtype": args.dtype, "weights": weights,
            "source": str(Path(args.image_folder).resolve()) if args.image_folder else args.hf_dataset}
    writer = EmbeddingCacheWriter(args.out, meta, {s: len(ds) for s, ds in splits.items()}, overwrite=args.overwrite)
    images, batches, t0 = 0, 0, time.perf_counter()
    for name, ds in splits.items():
        start = writer.rows_done(name)
        if start == len(ds):
            continue
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, range(start, len(ds))),
                                             batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers,
                                             pin_memory=device.type == "cuda")
        feats, labels = [], []
        bar = tqdm(total=len(ds), initial=start, desc=f"{name}", unit="img", disable=args.no_progress)
        for x, y in loader:
            with torch.inference_mode(), torch.autocast(device.type, dtype=torch.float16,
                                                        enabled=device.type == "cuda"):
                f = model(x.to(device, non_blocking=True))
            feats.append(f.float().cpu())
            labels.append(y)
            images, batches = images + len(y), batches + 1
            bar.update(len(y))
            stop = args.max_batches is not None and batches >= args.max_batches
            if len(feats) >= args.chunk_batches or stop:
                writer.write(name, torch.cat(feats), torch.cat(labels))
                feats, labels = [], []
            if stop:
                bar.close()
                return _rate(images, t0, stopped=True)
        if feats:
            writer.write(name, torch.cat(feats), torch.cat(labels))
        bar.close()
    return _rate(images, t0)


def _rate(images: int, t0: float, stopped: bool = False) -> dict[str, float]:
    seconds = time.perf_counter() - t0
    rate = images / seconds if seconds > 0 else float("nan")
    print(f"{images} images in {seconds:.1f} s: {rate:.1f} images/s{' (stopped at --max-batches)' if stopped else ''}")
    return {"images": images, "seconds": seconds, "images_per_s": rate}


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 on success, 2 when weights or input files are missing."""
    args = parse_args(argv)
    if args.batch_size < 1 or args.chunk_batches < 1:
        print("error: --batch-size and --chunk-batches must be >= 1", file=sys.stderr)
        return 2
    try:
        extract(args)
    except (WeightsMissing, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
