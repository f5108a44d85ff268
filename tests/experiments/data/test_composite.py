"""Composite MNIST / Fashion-MNIST tasks (diffrank.experiments.data.composite) on tiny files in the official idx
format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from diffrank.experiments.data.composite import (
    CompositeImageDataModule,
    compose_indices,
    composite_labels,
    slot_labels_of,
)
from diffrank.losses.softmax_ce import SoftmaxCrossEntropyLoss
from experiments.data.image_files import write_idx, write_mnist
from helpers import CONFIGS, options


def _write_distinct(root, folder: str, n_train: int = 300, n_test: int = 100) -> None:
    """Images whose pixel (0, 0..1) spell the image's index in its file and pixel (0, 2) its label, so that a
    composite's left / right halves tell which source image they came from."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = np.zeros((n, 28, 28), dtype=np.uint8)
        images[:, 0, 0], images[:, 0, 1] = np.arange(n) // 256, np.arange(n) % 256
        labels = (np.arange(n) * 7) % 10
        images[:, 0, 2] = labels
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("composite")
    _write_distinct(r, "FashionMNIST")
    write_mnist(r, "MNIST", n_train=200, n_test=50, seed=3)
    return r


def _module(root, **kw) -> CompositeImageDataModule:
    args = dict(data_dir=str(root), downscale=1, n_train=400, n_val=100, n_test=200, val_size=60, batch_size=32,
                eval_batch_size=64)
    args.update(kw)
    dm = CompositeImageDataModule(**args)
    dm.setup()
    return dm


def _decode(images: torch.Tensor, slot: int) -> tuple[np.ndarray, np.ndarray]:
    """(source index, source label) of slot ``slot`` of normalised fashion composites (B, 1, 28, 56)."""
    mean, std = 0.2860, 0.3530
    px = torch.round((images[:, 0, 0, 28 * slot:28 * slot + 3] * std + mean) * 255).long().numpy()
    return px[:, 0] * 256 + px[:, 1], px[:, 2]


def test_labels_compose_and_decompose():
    slots = np.array([[3, 7], [0, 0], [9, 9]])
    y = composite_labels(slots, (10, 10))
    assert y.tolist() == [37, 0, 99]
    assert composite_labels(np.array([[1, 2, 3]]), (10, 10, 10)).tolist() == [123]
    assert (slot_labels_of(y, (10, 10)) == slots).all()
    with pytest.raises(ValueError, match="slot 1"):
        composite_labels(np.array([[1, 10]]), (10, 10))


def test_composites_are_class_balanced_and_need_every_class():
    pool = np.arange(50) % 10
    idx, y = compose_indices([pool, pool], (10, 10), 250, seed=0)
    counts = np.bincount(y, minlength=100)
    assert counts.min() == 2 and counts.max() == 3 and counts.sum() == 250
    assert (pool[idx[:, 0]] * 10 + pool[idx[:, 1]] == y).all()
    with pytest.raises(ValueError, match=r"class\(es\) \[9\]"):
        compose_indices([pool, pool % 9], (10, 10), 10, seed=0)


def test_labels_match_the_source_images(root):
    dm = _module(root)
    assert dm.num_classes == 100 and dm.image_shape == (1, 28, 56)
    for split in ("train", "val", "test"):
        x, y = dm.splits[split].tensors
        assert x.shape[1:] == (1, 28, 56) and x.dtype == torch.float32 and y.dtype == torch.int64
        (li, ll), (ri, rl) = _decode(x, 0), _decode(x, 1)
        assert (torch.from_numpy(ll * 10 + rl) == y).all(), split
        # the recorded source indices are the images that fill the slots
        assert (dm.source_indices[split][0] == li).all() and (dm.source_indices[split][1] == ri).all(), split


def test_no_source_image_in_two_splits(root):
    dm = _module(root)
    train = set(np.concatenate(dm.source_indices["train"]).tolist())
    val = set(np.concatenate(dm.source_indices["val"]).tolist())
    assert train and val and not train & val
    assert len(val) <= 60  # only the held-out pool feeds validation
    # the test split reads the official test file: its indices stay below its 100 images and its pixels spell them
    assert max(np.concatenate(dm.source_indices["test"])) < 100


def test_deterministic_from_split_seed_not_seed(root):
    a, b = _module(root, seed=0), _module(root, seed=5)
    c = _module(root, split_seed=1)
    for split in ("train", "val", "test"):
        assert torch.equal(a.splits[split].tensors[0], b.splits[split].tensors[0])
        assert torch.equal(a.splits[split].tensors[1], b.splits[split].tensors[1])
    assert not torch.equal(a.splits["train"].tensors[1], c.splits["train"].tensors[1])
    order = [torch.cat([y for _, y in dm.train_dataloader()]) for dm in (a, b)]
    assert not torch.equal(order[0], order[1])  # seed orders the training batches


def test_splits_do_not_depend_on_the_dataset_registry(root, monkeypatch):
    from diffrank.experiments.data import composite, image_readers

    before = _module(root)
    extra = {"aaa_first": image_readers.IMAGE_SETS["mnist"], **image_readers.IMAGE_SETS}
    monkeypatch.setattr(composite, "IMAGE_SETS", extra)
    monkeypatch.setattr(image_readers, "IMAGE_SETS", extra)
    after = _module(root)
    for split in ("train", "val"):
        assert all((a == b).all() for a, b in zip(before.source_indices[split], after.source_indices[split]))


def test_downscale_and_mixed_sources(root):
    dm = _module(root, sources=["fashion_mnist", "mnist"], downscale=2, n_train=120, n_val=30, n_test=40)
    assert dm.image_shape == (1, 14, 28)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 1, 14, 28) and int(y.max()) < 100
    small = _module(root, downscale=4, n_train=120, n_val=30, n_test=40)
    x = small.splits["train"].tensors[0]
    assert small.image_shape == (1, 8, 16) and x.shape[1:] == (1, 8, 16)
    black = -0.2860 / 0.3530  # 7x7 items padded to 8x8 with the normalised black background
    assert torch.allclose(x[:, :, 7, :], torch.tensor(black)) and torch.allclose(x[:, :, :, 7], torch.tensor(black))
    assert not torch.allclose(x[:, :, :7, :7], torch.tensor(black))
    triple = _module(root, sources=["fashion_mnist"] * 3, downscale=2, n_train=1000, n_val=1000, n_test=1000)
    assert triple.num_classes == 1000 and triple.image_shape == (1, 14, 42)
    assert set(triple.splits["train"].tensors[1].tolist()) == set(range(1000))


def test_bad_arguments(root):
    with pytest.raises(ValueError, match="divide 28"):
        CompositeImageDataModule(downscale=3)
    with pytest.raises(ValueError, match="28x28 grey"):
        CompositeImageDataModule(sources=["cifar10", "mnist"])
    with pytest.raises(ValueError, match="at least 2"):
        CompositeImageDataModule(sources=["mnist"])
    with pytest.raises(ValueError, match="num_classes"):
        CompositeImageDataModule(num_classes=10)
    with pytest.raises(ValueError, match="image_shape"):
        CompositeImageDataModule(image_shape=[1, 28, 56])  # default downscale 2 gives 14x28
    with pytest.raises(ValueError, match="val_size"):
        _module(root, val_size=300)


def test_missing_file_names_it(tmp_path):
    dm = CompositeImageDataModule(data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"FashionMNIST/raw/train-images-idx3-ubyte"):
        dm.setup()


# --- the benchmark that uses it: configs/experiment/topk/fashion_pairs{.yaml,/} ----------------------------------

BENCH = "topk/fashion_pairs"
ROWS = [e for e in options("experiment") if e.startswith(BENCH + "/")]
SAMPLE = [f"{BENCH}/softmax_top1", f"{BENCH}/neuralsort_half_top5"]


def test_rows_cover_the_pk_grid():
    from diffrank.experiments.analysis.report_pk import canonical_pk, parse_pk

    cells = set()
    for name in ROWS:
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        b = cfg.paper  # the one key of a published table's cell: here a cell of its grid on another dataset
        assert b.benchmark == "fashion_pairs" and "benchmark" not in cfg, name
        pk_choice = next(v for d in cfg.defaults if not isinstance(d, str) for k, v in d.items() if k.endswith("/pk"))
        weights = OmegaConf.load(CONFIGS / "pk" / f"{pk_choice}.yaml").weights
        assert canonical_pk(weights) == canonical_pk(parse_pk(b.pk)), name
        cells.add((b.operator, canonical_pk(parse_pk(b.pk))))
    pks = {"[0,0,0,0,1]", "[.5,0,0,0,.5]", "[.25,0,0,0,.75]", "[.1,0,0,0,.9]", "[.2,.2,.2,.2,.2]"}
    assert cells == {("softmax_ce", "[1,0,0,0,0]")} | {(op, pk) for op in ("neuralsort", "softsort", "dsn", "lapsum")
                                                     for pk in pks} | {
        ("lapsum_alpha1", "[0,0,0,0,1]"), ("lapsum_alpha1", "[.5,0,0,0,.5]")}  # LapSum's α = -1 (its Table 5)
    assert len(cells) == len(ROWS), "two row configs of one cell of the grid"  # each cell once: no count to keep


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in SAMPLE else pytest.mark.slow) for n in ROWS])
def test_rows_run(train_built, compose_train, root, name):
    from diffrank.experiments.analysis.report_pk import run_from_record

    cfg = compose_train([f"experiment={name}", f"paths.data_dir={root}", "data.n_train=64", "data.n_val=32",
                         "data.n_test=32", "data.val_size=60", "data.batch_size=16"])
    assert cfg.data.downscale == 7
    if not name.endswith("softmax_top1"):
        assert cfg.loss.m is None and cfg.loss.top1_mode == "eq4"
    record, objects = train_built(cfg)
    metrics = record.metrics
    assert 0 <= metrics["test/top1"] <= metrics["test/top5"] <= 1
    run = run_from_record(record)
    assert run is not None and run.dataset == "fashion_pairs" and run.pk == cfg.paper.pk.replace(" ", "")
    assert record.paper["benchmark"] == "fashion_pairs"
    assert "benchmark" not in record.config
    if name.endswith("softmax_top1"):
        assert isinstance(objects["loss"], SoftmaxCrossEntropyLoss) and objects["operator"] is None
        assert "operator" not in record.choices
    else:
        assert record.choices["operator"] == cfg.paper_method


def test_temperatures_of_the_rows():
    def op(name):
        cfg = OmegaConf.load(CONFIGS / "experiment" / BENCH / f"{name}.yaml")
        return cfg.operator
    assert op("neuralsort_top5").beta == 0.0625 and op("softsort_uniform5").beta == 0.0625
    # LapSum at its published α (Struski et al. 2025, Table 5): -1.5 for the grid, -1 for the alpha1 rows
    assert op("lapsum_top5").beta == pytest.approx(1 / 1.5) and op("lapsum_alpha1_half_top5").beta == 1.0
    dsn = op("dsn_half_top5")
    assert (dsn.beta, dsn.sigmoid, dsn.art_lambda) == (0.5, "logistic_phi", 0.5)
    assert op("lapsum_tenth_top5").beta == pytest.approx(1 / 1.5)  # alpha = -1.5
