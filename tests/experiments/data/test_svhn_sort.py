"""SVHN sorting sets on small files written in the official on-disk format (torch.save'd (images, labels))."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.data.svhn_sort import SVHN_FILES, SVHNSortDataModule, crop_normalize, load_svhn_split


def _files(root, sizes=(60, 20, 30)):
    folder = root / "SVHNMultiDigit"
    folder.mkdir(parents=True)
    offset = 0
    for name, size in zip(SVHN_FILES.values(), sizes):
        images = torch.zeros(size, 3, 64, 64, dtype=torch.uint8)
        images[:, 0] = torch.arange(64, dtype=torch.uint8).view(1, 1, 64)  # channel 0 encodes the column
        images[:, 1] = torch.arange(64, dtype=torch.uint8).view(1, 64, 1)  # channel 1 encodes the row
        images[:, 2] = (torch.arange(size) + offset).to(torch.uint8).view(size, 1, 1)  # channel 2: image id
        torch.save((images, torch.arange(size) + 1000 * (offset + 1)), folder / name)
        offset += size
    return root


def test_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="SVHNMultiDigit/svhn-multi-digit-3x64x64_train.p"):
        load_svhn_split(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="3x64x64_train.p.*3x64x64_val.p.*3x64x64_test.p"):
        SVHNSortDataModule(data_dir=tmp_path)  # at construction, every missing file
    with pytest.raises(ValueError, match="split"):
        load_svhn_split(tmp_path, "extra")


def test_crop_normalize():
    img = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4).expand(2, 3, 4, 4).contiguous()
    out = crop_normalize(img, torch.tensor([0, 2]), torch.tensor([1, 0]), 2)
    assert out.shape == (2, 3, 2, 2)
    expected0 = (torch.tensor([[1.0, 2], [5, 6]]) / 255 - 0.5) / 0.5
    expected1 = (torch.tensor([[8.0, 9], [12, 13]]) / 255 - 0.5) / 0.5
    assert torch.allclose(out[0, 0], expected0) and torch.allclose(out[1, 2], expected1)


@pytest.mark.parametrize("n", [3, 5])
def test_sets_values_crops_and_splits(tmp_path, n):
    dm = SVHNSortDataModule(n=n, data_dir=_files(tmp_path), batch_size=4, eval_batch_size=3, seed=1)
    dm.setup()
    x, v = next(iter(dm.train_dataloader()))
    assert x.shape == (4, n, 3, 54, 54) and v.shape == (4, n) and float(x.min()) >= -1 and float(x.max()) <= 1
    ids = torch.round((x[:, :, 2, 0, 0] * 0.5 + 0.5) * 255).long()
    assert torch.equal(v, ids + 1000) and len(set(ids.flatten().tolist())) == 4 * n  # one shuffle: no repeats
    assert int(ids.max()) < 60
    top = torch.round((x[:, :, 1, 0, 0] * 0.5 + 0.5) * 255)
    assert int(top.max()) <= 10  # a 54 crop of 64 starts at row 0..10
    for split, lo in (("val", 60), ("test", 80)):
        batch = next(iter(getattr(dm, f"{split}_dataloader")()))
        ids = torch.round((batch[0][:, :, 2, 0, 0] * 0.5 + 0.5) * 255).long()
        assert torch.equal(batch[1], ids - lo + 1000 * (lo + 1))
        assert ids[0].tolist() == list(range(lo, lo + n))  # consecutive images in file order
        assert len(batch) == (2 if n == 5 else 4)
    again = SVHNSortDataModule(n=n, data_dir=tmp_path, batch_size=4, eval_batch_size=3, seed=1)
    again.setup()
    assert torch.equal(next(iter(again.val_dataloader()))[0], next(iter(dm.val_dataloader()))[0])  # fixed crops


def test_bad_file_content(tmp_path):
    folder = tmp_path / "SVHNMultiDigit"
    folder.mkdir()
    torch.save(torch.zeros(3), folder / SVHN_FILES["val"])
    with pytest.raises(ValueError, match="tuple"):
        load_svhn_split(tmp_path, "val")
