"""The MovieLens-100K reader and RecBole's per-user random 8:1:1 split, on a tiny .inter file inside a zip."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch

from diffrank.experiments.data.movielens import (
    MovieLensDataModule,
    read_interactions,
    split_by_user,
    split_sizes,
    wheel_path,
)
from experiments.data.movielens_files import COUNTS, write_ml100k


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ml")
    write_ml100k(root)
    return root


def test_the_reader_numbers_tokens_in_sorted_order_from_the_zip(root):
    data = read_interactions(wheel_path(root))
    assert (data.num_users, data.num_items) == (len(COUNTS), 30)
    assert np.bincount(data.users).tolist()[:-1] == list(COUNTS[:-1])
    assert set(data.items.tolist()) == set(range(30))


def test_split_sizes_follow_recboles_rounding():
    # floor(total / 10) for val and test, the rest trains; a part whose share is in (0, 1) takes one from train
    assert [split_sizes(n) for n in (1, 2, 3, 9, 10, 19, 20, 29, 100)] == [
        [1, 0, 0], [1, 0, 1], [1, 1, 1], [7, 1, 1], [8, 1, 1], [17, 1, 1], [16, 2, 2], [25, 2, 2], [80, 10, 10]]
    assert split_sizes(0) == [0, 0, 0]
    with pytest.raises(ValueError):
        split_sizes(5, (0.8, 0.0, 0.2))


def test_the_split_per_user_is_disjoint_complete_sized_and_fixed_by_its_seed(root):
    data = read_interactions(wheel_path(root))
    parts = split_by_user(data.users, seed=3)
    joined = np.concatenate(parts)
    assert len(joined) == len(data.users) == len(np.unique(joined))
    for u in range(data.num_users):
        sizes = [int((data.users[p] == u).sum()) for p in parts]
        assert sizes == split_sizes(int((data.users == u).sum())), u
    assert all((a == b).all() for a, b in zip(parts, split_by_user(data.users, seed=3)))
    assert any(not np.array_equal(a, b) for a, b in zip(parts, split_by_user(data.users, seed=4)))


def test_batches_are_users_with_known_positives_left_out_of_the_ranking(root):
    dm = MovieLensDataModule(root, batch_size=4, eval_batch_size=5, split_seed=1, num_users=12, num_items=30)
    dm.setup()
    users, train = next(iter(dm.train_dataloader()))
    assert users.dtype == torch.int64 and train.shape == (4, 30) and bool((train.sum(1) > 0).all())
    for split in ("val", "test"):
        loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
        for _, train, targets, candidates in loader:
            assert candidates.dtype == torch.bool and bool((targets.sum(1) > 0).all())
            assert not bool((train.bool() & candidates).any())  # the training positives are never ranked
            assert not bool((targets.bool() & ~candidates).any())  # the split's positives always are
    val, test = dm.splits["val"].tensors, dm.splits["test"].tensors
    # test leaves out the validation positives as well
    val_of = dict(zip(val[0].tolist(), val[2]))
    for u, cand in zip(test[0].tolist(), test[3]):
        if u in val_of:
            assert not bool((val_of[u].bool() & cand).any())
    # users with one rating train only; with two they test but do not validate
    assert 7 not in val[0].tolist() and 7 not in test[0].tolist() and 6 in test[0].tolist() and 6 not in val[0].tolist()


def test_the_training_order_follows_seed_and_the_split_split_seed(root):
    def first(seed, split_seed):
        dm = MovieLensDataModule(root, batch_size=4, seed=seed, split_seed=split_seed)
        dm.setup()
        return next(iter(dm.train_dataloader()))[0].tolist(), dm.parts["test"].tolist()

    assert first(0, 0) == first(0, 0)
    assert first(0, 0)[1] == first(1, 0)[1] and first(0, 0)[0] != first(1, 0)[0]
    assert first(0, 0)[1] != first(0, 1)[1]


def test_a_missing_wheel_names_the_file_and_the_make_target(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        MovieLensDataModule(tmp_path)
    assert str(wheel_path(tmp_path)) in str(e.value) and "make data-ml100k" in str(e.value)
    path = wheel_path(tmp_path)
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("other.txt", "x")
    with pytest.raises(FileNotFoundError, match=r"has no recbole/dataset_example/ml-100k/ml-100k\.inter"):
        read_interactions(path)


def test_counts_that_disagree_with_the_file_are_refused(root):
    dm = MovieLensDataModule(root, num_items=1682)
    with pytest.raises(ValueError, match=r"data.num_items=1682 does not match"):
        dm.setup()
