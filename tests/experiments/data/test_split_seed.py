"""``split_seed`` fixes the data, ``seed`` the training order: a seed sweep keeps the splits and evaluation sets.

Also the training samplers: their order is a pure function of ``(seed, epoch)``, read when iteration
starts (a resumed run creates its iterator before Lightning sets the epoch), and they can skip ahead.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffrank.experiments.data.digits import DigitsDataModule
from diffrank.experiments.data.mnist_sort import MultiDigitSortDataModule
from diffrank.experiments.data.samplers import EpochSampler
from helpers import options

PAIRS = dict(pairs=True, n_train=256, n_val=64, n_test=64, batch_size=32)


def _digits(**kw):
    dm = DigitsDataModule(**{**PAIRS, **kw})
    dm.setup()
    return dm


def _tensors(dm, split):
    return dm.splits[split].tensors


def test_seed_changes_the_training_order_not_the_data():
    a, b = _digits(seed=0), _digits(seed=1)
    for split in ("train", "val", "test"):
        assert all(torch.equal(x, y) for x, y in zip(_tensors(a, split), _tensors(b, split))), split
    assert {k: v.tolist() for k, v in a.source_indices.items()} == {k: v.tolist() for k, v in b.source_indices.items()}
    first_a, first_b = next(iter(a.train_dataloader()))[1], next(iter(b.train_dataloader()))[1]
    assert not torch.equal(first_a, first_b)


def test_split_seed_changes_the_data():
    a, b = _digits(split_seed=0), _digits(split_seed=1)
    assert not torch.equal(_tensors(a, "test")[1], _tensors(b, "test")[1])
    assert a.source_indices["test"].tolist() != b.source_indices["test"].tolist()


def test_training_order_is_a_function_of_seed_and_epoch():
    dm = _digits(seed=5)
    loader = dm.train_dataloader()
    epoch0 = [y for _, y in loader]
    assert len(epoch0) == 256 // 32  # last partial batch dropped
    assert [torch.equal(u, v) for u, v in zip(epoch0, [y for _, y in dm.train_dataloader()])] == [True] * 8
    loader.sampler.set_epoch(1)
    epoch1 = [y for _, y in loader]
    assert not torch.equal(torch.cat(epoch0), torch.cat(epoch1))
    assert sorted(torch.cat(epoch0).tolist()) == sorted(torch.cat(epoch1).tolist())  # a permutation each epoch
    # drawing from torch's global generator does not change the order (a resumed run restores that generator)
    torch.manual_seed(123)
    loader.sampler.set_epoch(1)
    assert torch.equal(torch.cat([y for _, y in loader]), torch.cat(epoch1))


def test_samplers_read_the_epoch_when_iteration_starts_and_skip_ahead():
    s = EpochSampler(10, seed=0)
    it = iter(s)  # Lightning creates the iterator, then sets the epoch
    s.set_epoch(3)
    assert list(it) == s.permutation(3).tolist()
    s.set_start(4)
    assert list(s) == s.permutation(3)[4:].tolist()
    assert list(s) == s.permutation(3).tolist()  # the skip applies to one pass only
    b = EpochSampler(5, keys=True)
    it = iter(b)
    b.set_epoch(2)
    assert list(it) == [(2, i) for i in range(5)]
    b.set_start(3)
    assert list(b) == [(2, 3), (2, 4)] and len(b) == 5


def test_one_sampler_keeps_each_data_module_s_order():
    """The orders of the three samplers it replaced: digits (stream 1, items), Warcraft (stream 3, index batches,
    the last one smaller; in order without a seed)."""
    import numpy as np

    s = EpochSampler(10, seed=7, stream=1)
    s.set_epoch(2)
    assert list(s) == np.random.default_rng([7, 1, 2]).permutation(10).tolist()
    w = EpochSampler(10, seed=7, stream=3, batch_size=4)
    w.set_epoch(1)
    perm = np.random.default_rng([7, 3, 1]).permutation(10)
    assert [b.tolist() for b in w] == [perm[:4].tolist(), perm[4:8].tolist(), perm[8:].tolist()] and len(w) == 3
    w.set_start(2)  # a resumed pass skips whole yields
    assert [b.tolist() for b in w] == [perm[8:].tolist()]
    assert [b.tolist() for b in EpochSampler(5, None, batch_size=2)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="keys"):
        EpochSampler(5, keys=True, batch_size=2)


def test_digits_sort_evaluation_sets_fixed_across_seeds():
    kw = dict(n=3, source="digits", batch_size=8, train_sets=32, val_sets=16, test_sets=16)
    a, b = MultiDigitSortDataModule(seed=0, **kw), MultiDigitSortDataModule(seed=1, **kw)
    c = MultiDigitSortDataModule(seed=0, split_seed=1, **kw)
    for dm in (a, b, c):
        dm.setup()
    for split in ("val", "test"):
        assert np.array_equal(a.datasets[split].idx, b.datasets[split].idx)
        assert not np.array_equal(a.datasets[split].idx, c.datasets[split].idx)
    assert torch.equal(a.pools["test"].source_indices, b.pools["test"].source_indices)
    assert not torch.equal(a.datasets["train"][(0, 0)][1], b.datasets["train"][(0, 0)][1])


# data whose train / val / test files are the distribution's own: nothing is drawn, so no split_seed
FIXED_SPLITS = {"warcraft"}


@pytest.mark.parametrize("data", options("data"))
def test_every_data_config_fixes_its_split(compose_train, data):
    """``seed=7`` reaches the data module's ``seed``; its ``split_seed`` stays the fixed default."""
    cfg = compose_train([f"data={data}", "seed=7"])
    assert cfg.data.seed == 7
    if data in FIXED_SPLITS:
        assert "split_seed" not in cfg.data
    else:
        assert cfg.data.split_seed == 0
