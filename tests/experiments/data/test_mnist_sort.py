"""Multi-digit sorting data: numbers = the digits' labels, splits disjoint, deterministic, missing-file error."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from diffrank.experiments.data.mnist_sort import MultiDigitSortDataModule
from diffrank.experiments.data.number_sets import MNIST_FILES, load_mnist, number_values
from helpers import DATA, real_data

N_TRAIN, N_TEST = 60, 20


def _write_idx(path, array: np.ndarray) -> None:
    """torchvision's raw MNIST format: magic (0x08 = uint8, ndim), big-endian sizes, raw bytes."""
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def _tiny_mnist(root, n_train=N_TRAIN, n_test=N_TEST):
    """Images whose pixel (0, 0) is the source index (test images: N_TRAIN + i), label = index mod 10."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n, offset in (("train", n_train, 0), ("t10k", n_test, n_train)):
        img = np.zeros((n, 28, 28), np.uint8)
        img[:, 0, 0] = np.arange(n) + offset
        img[:, 5:20, 5:20] = 255
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", img)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", (np.arange(n) + offset) % 10)
    return root


def _source_ids(images: torch.Tensor, digits: int = 4) -> torch.Tensor:
    """Decode pixel (0, 0) of each digit tile: (..., 1, 28, 28·digits) -> (..., digits) source indices."""
    return torch.round(images[..., 0, 0, ::28] * 255).long()


def test_missing_files_name_them_and_where_to_put_them(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_mnist(tmp_path)
    msg = str(e.value)
    for f in MNIST_FILES:
        assert str(tmp_path / "MNIST" / "raw" / f) in msg
    assert "download=true" in msg
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):  # at construction, not at the first fit
        MultiDigitSortDataModule(data_dir=tmp_path)
    assert MultiDigitSortDataModule(data_dir=tmp_path, download=True).download  # download: fetched at setup


def test_number_values():
    assert number_values(torch.tensor([[0, 4, 0, 9], [9, 9, 9, 9]])).tolist() == [409, 9999]
    assert number_values(torch.tensor([[3, 1]])).tolist() == [31]


@pytest.mark.parametrize("n", [3, 5])
def test_tiny_mnist_values_are_the_numbers_and_splits_are_disjoint(tmp_path, n):
    root = _tiny_mnist(tmp_path)
    dm = MultiDigitSortDataModule(n=n, data_dir=root, val_pool=10, batch_size=8, train_sets=32, val_sets=12,
                                  test_sets=12, eval_batch_size=6, seed=3)
    dm.setup()
    allowed = {"train": set(range(0, 50)), "val": set(range(50, 60)), "test": set(range(60, 80))}
    batches = {"train": list(dm.train_dataloader()), "val": list(dm.val_dataloader()),
               "test": list(dm.test_dataloader())}
    assert len(batches["train"]) == 4 and len(batches["val"]) == 2
    for split, bs in batches.items():
        seen = set()
        for batch in bs:
            images, values = batch[0], batch[1]
            assert images.shape[1:] == (n, 1, 28, 112) and images.dtype == torch.float32
            assert float(images.min()) >= 0 and float(images.max()) <= 1
            ids = _source_ids(images)
            seen |= set(ids.flatten().tolist())
            # the value is the number spelled by the labels (label = source index mod 10)
            assert torch.equal(values, number_values(ids % 10))
            if split != "train":
                if n == 5:
                    assert len(batch) == 2  # the n-sets are the 5-sets
                else:
                    assert len(batch) == 4 and batch[2].shape[1:] == (5, 1, 28, 112)
                    ids5 = _source_ids(batch[2])
                    assert torch.equal(batch[3], number_values(ids5 % 10))
                    seen |= set(ids5.flatten().tolist())
        assert seen <= allowed[split], split


def test_sampling_is_seeded_and_fresh_per_epoch(tmp_path):
    root = _tiny_mnist(tmp_path)
    kw = dict(n=4, data_dir=root, val_pool=10, batch_size=4, train_sets=8, val_sets=6, test_sets=6)
    a, b, c = (MultiDigitSortDataModule(seed=s, split_seed=s, **kw) for s in (0, 0, 1))
    for dm in (a, b, c):
        dm.setup()
    va, vb, vc = (next(iter(dm.val_dataloader()))[1] for dm in (a, b, c))
    assert torch.equal(va, vb) and not torch.equal(va, vc)
    assert torch.equal(next(iter(a.val_dataloader()))[1], va)  # fixed collection: same sets every pass
    ds = a.datasets["train"]
    assert torch.equal(ds[(0, 1)][1], b.datasets["train"][(0, 1)][1])
    assert not torch.equal(ds[(0, 1)][1], ds[(1, 1)][1]) and not torch.equal(ds[(0, 0)][1], ds[(0, 1)][1])
    loader = a.train_dataloader()
    first = next(iter(loader))[1]
    loader.sampler.set_epoch(1)
    assert not torch.equal(first, next(iter(loader))[1])


def test_bad_arguments():
    with pytest.raises(ValueError, match="n = 2"):
        MultiDigitSortDataModule(n=1)
    with pytest.raises(ValueError, match="source"):
        MultiDigitSortDataModule(source="svhn")
    with pytest.raises(ValueError, match="image_shape"):
        MultiDigitSortDataModule(source="digits", image_shape=(1, 28, 112))


def test_digits_sort_pools_are_disjoint_and_values_match():
    dm = MultiDigitSortDataModule(n=3, source="digits", batch_size=16, train_sets=64, val_sets=32, test_sets=32)
    dm.setup()
    ids = [set(dm.pools[s].source_indices.tolist()) for s in ("train", "val", "test")]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert sum(map(len, ids)) == 1797
    x, v, x5, v5 = next(iter(dm.val_dataloader()))
    assert x.shape == (16, 3, 1, 8, 32) and x5.shape == (16, 5, 1, 8, 32)
    ds = dm.datasets["val"]
    pool = dm.pools["val"]
    assert torch.equal(v, number_values(pool.labels[ds.idx[:16]]))
    # the third tile of set 0, item 1 is the pool image the index says
    assert torch.allclose(x[0, 1, 0, :, 16:24], pool.images[ds.idx[0, 1, 2]].float())


@real_data("MNIST", "raw")
def test_real_mnist_splits_and_numbers():
    dm = MultiDigitSortDataModule(n=5, data_dir=DATA, val_sets=50, test_sets=50, batch_size=10)
    dm.setup()
    assert [len(dm.pools[s]) for s in ("train", "val", "test")] == [55000, 5000, 10000]
    assert int(dm.pools["train"].source_indices.max()) == 54999 and int(dm.pools["val"].source_indices.min()) == 55000
    for split in ("val", "test"):
        ds, pool = dm.datasets[split], dm.pools[split]
        x, v = ds[7]
        idx = ds.idx[7]
        assert torch.equal(v, number_values(pool.labels[idx]))
        tiles = x[:, 0].reshape(5, 28, 4, 28).permute(0, 2, 1, 3)
        assert torch.equal(tiles, pool.images[idx].float() / 255)
    x, v = next(iter(dm.train_dataloader()))
    assert x.shape == (10, 5, 1, 28, 112) and int(v.max()) <= 9999


# -- device-resident training sets (composed on the trainer's device; here on CPU tensors) -----------------
def _resident_dm(root, **kw):
    args = dict(n=5, data_dir=root, val_pool=10, batch_size=6, train_sets=24, val_sets=6, test_sets=6, seed=2,
                device_resident=True)
    dm = MultiDigitSortDataModule(**{**args, **kw})
    dm.setup()
    return dm


def test_resident_batches_are_numbers_from_the_train_pool_and_seeded(tmp_path):
    from diffrank.experiments.data.number_sets import SetKey

    dm = _resident_dm(_tiny_mnist(tmp_path))
    keys = list(dm.train_dataloader())
    assert keys == [SetKey(0, i) for i in range(4)]  # host ints only: nothing per sample on the host
    images, values = dm.transfer_batch_to_device(keys[1], torch.device("cpu"), 0)
    assert images.shape == (6, 5, 1, 28, 112) and images.dtype == torch.float32 and values.dtype == torch.int64
    assert float(images.min()) >= 0 and float(images.max()) <= 1
    ids = _source_ids(images)
    assert set(ids.flatten().tolist()) <= set(range(50))  # the training pool only
    assert torch.equal(values, number_values(ids % 10))
    again = dm.transfer_batch_to_device(SetKey(0, 1), torch.device("cpu"), 0)
    assert torch.equal(again[0], images) and torch.equal(again[1], values)
    other_epoch = dm.transfer_batch_to_device(SetKey(1, 1), torch.device("cpu"), 0)[1]
    other_index = dm.transfer_batch_to_device(SetKey(0, 2), torch.device("cpu"), 0)[1]
    assert not torch.equal(values, other_epoch) and not torch.equal(values, other_index)
    twin = _resident_dm(tmp_path)  # same seed, another module: the same sets
    assert torch.equal(twin.transfer_batch_to_device(SetKey(0, 1), torch.device("cpu"), 0)[1], values)
    # evaluation batches (tensors) are moved as usual
    x, v = next(iter(dm.val_dataloader()))
    moved = dm.transfer_batch_to_device([x, v], torch.device("cpu"), 0)
    assert torch.equal(moved[1], v)


def test_resident_draws_are_uniform_over_the_pool(tmp_path):
    from diffrank.experiments.data.number_sets import SetKey

    dm = _resident_dm(_tiny_mnist(tmp_path), batch_size=200)
    ids = _source_ids(dm.transfer_batch_to_device(SetKey(0, 0), torch.device("cpu"), 0)[0]).flatten()
    counts = torch.bincount(ids, minlength=50).float()  # 4 000 draws over 50 images: 80 expected each
    assert counts.min() > 40 and counts.max() < 130


def test_device_resident_option(tmp_path):
    root = _tiny_mnist(tmp_path)
    host = _resident_dm(root, device_resident="auto")
    assert not host.resident()  # auto without a CUDA trainer: the host path, unchanged
    assert isinstance(next(iter(host.train_dataloader())), list)
    assert _resident_dm(root, device_resident="false").device_resident is False
    with pytest.raises(ValueError, match="device_resident"):
        _resident_dm(root, device_resident="sometimes")


def test_resident_training_runs_through_lightning(tmp_path):
    import functools

    import lightning as L

    from diffrank.experiments.models.sorting import MultiDigitCNN, RankingSupervisionModule
    from diffrank.losses.sorting import SortingBCELoss
    from diffrank.operators import load

    dm = _resident_dm(_tiny_mnist(tmp_path))
    net = MultiDigitCNN((1, 28, 112), channels=(4, 8), hidden=8)
    model = RankingSupervisionModule(net, SortingBCELoss(load("neuralsort", beta=1.0)),
                                     optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
    seen = []

    class Spy(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(batch)

    trainer = L.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=1, logger=False, callbacks=[Spy()],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=dm)
    assert len(seen) == 2 and all(b[0].shape == (6, 5, 1, 28, 112) for b in seen)
