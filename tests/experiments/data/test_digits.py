"""The offline digits / digits100 data modules."""

from __future__ import annotations

import numpy as np
import pytest

from diffrank.experiments.data.digits import DigitsDataModule, compose_pairs, load_digits_arrays


def test_digits10_splits_are_disjoint_and_cover():
    dm = DigitsDataModule(pairs=False, seed=1)
    dm.setup()
    pools = dm.source_indices
    all_idx = np.concatenate(list(pools.values()))
    assert len(all_idx) == 1797 == len(np.unique(all_idx))
    x, y = dm.splits["train"].tensors
    assert x.shape[1:] == (1, 8, 8) and float(x.min()) >= 0 and float(x.max()) <= 1
    assert set(y.tolist()) == set(range(10))


def test_digits100_labels_match_the_composed_images():
    images, labels = load_digits_arrays()
    x, y = compose_pairs(images[:600], labels[:600], 300, seed=0)
    assert x.shape == (300, 8, 16)
    assert np.bincount(y, minlength=100).tolist() == [3] * 100  # class balanced
    # every composed half is one of the pool's images, of the digit the label says
    pool = {d: images[:600][labels[:600] == d] for d in range(10)}
    for img, lab in zip(x[:50], y[:50]):
        for half, digit in ((img[:, :8], lab // 10), (img[:, 8:], lab % 10)):
            assert np.abs(pool[digit] - half).reshape(len(pool[digit]), -1).sum(1).min() == 0


def test_digits100_no_source_image_across_splits():
    dm = DigitsDataModule(pairs=True, n_train=500, n_val=200, n_test=200, seed=0)
    dm.setup()
    images, _ = load_digits_arrays()
    owner = {}
    for split, idx in dm.source_indices.items():
        for i in idx:
            owner[images[i].tobytes()] = owner.get(images[i].tobytes(), set()) | {split}
    for split, ds in dm.splits.items():
        x = ds.tensors[0].numpy()[:, 0]
        halves = [owner[np.ascontiguousarray(h).tobytes()] for img in x for h in (img[:, :8], img[:, 8:])]
        assert all(split in o for o in halves)  # every half comes from its own split's pool
        # and (but for the few pixel-identical digits in the source set) from no other pool
        assert sum(o == {split} for o in halves) >= 0.95 * len(halves)
    assert dm.num_classes == 100 and dm.splits["train"].tensors[0].shape[1:] == (1, 8, 16)


def test_deterministic_from_seed():
    a, b = DigitsDataModule(pairs=True, n_train=64, seed=3), DigitsDataModule(pairs=True, n_train=64, seed=3)
    a.setup()
    b.setup()
    assert (a.splits["train"].tensors[1] == b.splits["train"].tensors[1]).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="fractions"):
        DigitsDataModule(fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="num_classes"):
        DigitsDataModule(pairs=True, num_classes=10)
