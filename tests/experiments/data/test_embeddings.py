"""The embedding cache: format, writer (resume, atomic index), the DataModule's splits and batches, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffrank.experiments.data.embedding_cache import EmbeddingCacheWriter, open_split, paper_key_scheme, read_index
from diffrank.experiments.data.embeddings import DEFAULT_FOLDERS, EmbeddingDataModule, SortedBatchSampler
from experiments.data.embedding_files import FOLDERS, write_embedding_cache

DIM, CLASSES = 16, 10


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("emb")
    write_embedding_cache(root / "c", n_train=600, n_test=500, dim=DIM, num_classes=CLASSES)
    return root


def _dm(root, **kw):
    args = dict(data_dir=str(root), folder="c", num_classes=CLASSES, dim=DIM, val_size=100, batch_size=50,
                eval_batch_size=100)
    dm = EmbeddingDataModule(**{**args, **kw})
    dm.setup()
    return dm


def test_default_folders_match_the_fixture_names():
    assert DEFAULT_FOLDERS == FOLDERS


def test_split_sizes_disjoint_and_complete(cache):
    dm = _dm(cache)
    train, val, test = (dm.splits[s].rows for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (500, 100, 500)
    assert not set(train) & set(val)
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(600))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(val) > 0)  # file order: forward reads


def test_split_is_a_function_of_split_seed_only(cache):
    a, b, c = _dm(cache, seed=1), _dm(cache, seed=2), _dm(cache, split_seed=1)
    assert np.array_equal(a.splits["val"].rows, b.splits["val"].rows)
    assert not np.array_equal(a.splits["val"].rows, c.splits["val"].rows)


def test_batches_are_float32_casts_of_the_file(cache):
    dm = _dm(cache)
    emb, lab = open_split(cache / "c", "train")
    x, y = next(iter(dm.val_dataloader()))
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape == (100, DIM)
    rows = dm.splits["val"].rows[:100]
    assert torch.equal(x, torch.from_numpy(np.asarray(emb[rows], dtype=np.float32)))
    assert torch.equal(y, torch.from_numpy(np.asarray(lab[rows])))
    xt, _ = next(iter(dm.test_dataloader()))
    assert torch.equal(xt, torch.from_numpy(np.load(cache / "c" / "test_embeddings.npy")[:100].astype(np.float32)))


def test_training_batches_cover_the_split_once_per_epoch(cache):
    dm = _dm(cache)
    seen = []
    for x, y in dm.train_dataloader():
        assert x.shape == (50, DIM) and y.shape == (50,)
        seen.append(x)
    assert len(seen) == 10
    allx = torch.cat(seen)
    expected = np.load(cache / "c" / "train_embeddings.npy")[dm.splits["train"].rows].astype(np.float32)
    rows = {tuple(r) for r in allx.tolist()}
    assert len(rows) == len(allx) == len(expected) and rows == {tuple(r) for r in expected.tolist()}


def test_sampler_sorted_batches_seeded_by_seed_and_epoch():
    s = SortedBatchSampler(103, seed=3, batch_size=10)
    order = np.array(list(s))
    assert len(order) == len(s) == 100 and len(set(order)) == 100
    assert all(np.all(np.diff(b) > 0) for b in order.reshape(10, 10))
    assert np.array_equal(order, list(SortedBatchSampler(103, seed=3, batch_size=10)))
    s.set_epoch(1)
    assert not np.array_equal(order, list(s))
    s.set_start(30)
    assert list(s) == s.permutation(1)[30:].tolist()
    with pytest.raises(ValueError):
        SortedBatchSampler(5, seed=0, batch_size=6)


def test_missing_cache_names_the_files_and_the_scripts(tmp_path):
    dm = EmbeddingDataModule(str(tmp_path), "nothing", CLASSES, DIM)
    hint = ("run python -m diffrank.experiments.tools.extract_embeddings or "
            "python -m diffrank.experiments.tools.convert_embeddings")
    with pytest.raises(FileNotFoundError, match=hint) as err:
        dm.setup()
    assert "index.json" in str(err.value) and "train_embeddings.npy" in str(err.value)
    root = write_embedding_cache(tmp_path / "c", dim=DIM, num_classes=CLASSES)
    (root / "test_labels.npy").unlink()
    with pytest.raises(FileNotFoundError, match="test_labels.npy"):
        _dm(tmp_path)


@pytest.mark.parametrize("change, match", [
    ({"dim": 32}, "data.dim=32"),
    ({"num_classes": 5}, "outside"),
    ({"val_size": 600}, "val_size"),
    ({"val_size": 560}, "fewer than one batch"),
])
def test_bad_settings_raise(cache, change, match):
    with pytest.raises(ValueError, match=match):
        _dm(cache, **change)


def test_incomplete_cache_raises(tmp_path):
    write_embedding_cache(tmp_path / "c", dim=DIM, num_classes=CLASSES, rows_done={"train": 300})
    with pytest.raises(ValueError, match="incomplete.*300 of 600"):
        _dm(tmp_path)


def test_writer_resumes_at_rows_done_and_checks_metadata(tmp_path):
    meta = {"model": "m", "dim": 4, "img_size": 8, "dtype": "float16", "source": "s", "weights": "random"}
    w = EmbeddingCacheWriter(tmp_path, meta, {"train": 5, "test": 2})
    assert w.write("train", np.ones((3, 4)), np.arange(3)) == 3
    assert not list(tmp_path.glob(".*.tmp"))  # the index was replaced, not left half-written
    assert json.loads((tmp_path / "index.json").read_text())["splits"]["train"]["rows_done"] == 3
    w2 = EmbeddingCacheWriter(tmp_path, meta, {"train": 5, "test": 2})  # a restarted writer
    assert w2.rows_done("train") == 3 and w2.rows_done("test") == 0
    w2.write("train", torch.full((2, 4), 2.0), torch.tensor([3, 4]))
    w2.write("test", np.zeros((2, 4), dtype=np.float32), np.array([0, 1]))
    emb, lab = open_split(tmp_path, "train")
    assert emb.dtype == np.float16 and np.array_equal(emb[:, 0], [1, 1, 1, 2, 2]) and np.array_equal(lab, range(5))
    with pytest.raises(ValueError, match="model"):
        EmbeddingCacheWriter(tmp_path, {**meta, "model": "other"}, {"train": 5, "test": 2})
    with pytest.raises(ValueError, match="exceed"):
        EmbeddingCacheWriter(tmp_path, meta, {"train": 6}, overwrite=True).write("train", np.ones((7, 4)), np.arange(7))
    with pytest.raises(ValueError, match="non-finite"):
        EmbeddingCacheWriter(tmp_path, meta, {"train": 6}, overwrite=True).write("train", np.full((1, 4), 1e6),
                                                                                 np.zeros(1))
    assert read_index(tmp_path, ["train"], complete=False)["splits"]["train"]["rows_done"] == 0


def test_paper_key_schemes():
    assert paper_key_scheme(["train_embeddings", "train_labels", "test_embeddings", "test_labels"])[0] == "resnext_1k"
    name, keys = paper_key_scheme(["train_embeddings", "train_labels", "val_embeddings", "val_labels"])
    assert name == "effnet_l2" and keys["test"] == ("val_embeddings", "val_labels")
    name, keys = paper_key_scheme([f"imagenet21k_{s}_{k}" for s in ("train", "val") for k in ("embeddings", "labels")])
    assert name == "imagenet21kp" and set(keys) == {"train", "test"}
    with pytest.raises(KeyError, match="no known key scheme"):
        paper_key_scheme(["features", "targets"])


def test_nan_rows_name_the_file_and_rows(tmp_path):
    """NaN rows reached the operator ("scores contain non-finite values"), the data not named."""
    root = write_embedding_cache(tmp_path / "c", n_train=600, n_test=500, dim=DIM, num_classes=CLASSES)
    emb = np.load(root / "test_embeddings.npy")
    emb[7, 3] = np.nan
    np.save(root / "test_embeddings.npy", emb)
    dm = _dm(tmp_path)
    with pytest.raises(ValueError, match=r"test_embeddings\.npy: rows \[7\] hold NaN or infinite embeddings"):
        next(iter(dm.test_dataloader()))
