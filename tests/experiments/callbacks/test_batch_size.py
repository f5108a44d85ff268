"""batch_size: the sample count that ThroughputMonitor logs (samples/s, sets/s for the sorting benchmark)."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.callbacks.batch_size import batch_size


def test_batch_size_of_the_batches_we_produce():
    assert batch_size((torch.zeros(7, 1, 8, 16), torch.zeros(7, dtype=torch.long))) == 7  # classification
    sets = (torch.zeros(3, 5, 1, 28, 112), torch.zeros(3, 5), torch.zeros(3, 5, 1, 28, 112), torch.zeros(3, 5))
    assert batch_size(sets) == 3  # sorting: a sample is a set of n images
    assert batch_size({"name": "x", "emb": torch.zeros(4, 2)}) == 4
    assert batch_size([["id"], torch.zeros(2)]) == 2


@pytest.mark.parametrize("bad", [torch.tensor(1.0), ("a", "b"), {}, 3])
def test_batch_size_rejects_batches_without_a_sample_dimension(bad):
    with pytest.raises(TypeError):
        batch_size(bad)
