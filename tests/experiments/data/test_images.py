"""MNIST / Fashion-MNIST / CIFAR-10 / CIFAR-100 readers on tiny files written in the official formats; the offline
error; the on-device augmentation of the CIFAR-100 protocol."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.data.image_readers import load_image_arrays
from diffrank.experiments.data.images import ImageDataModule, MultiPassSampler, crop_flip, random_crop_flip
from experiments.data.image_files import write_cifar10, write_cifar100, write_mnist
from helpers import DATA, real_data


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_mnist(root, "MNIST")
    write_mnist(root, "FashionMNIST", seed=1)
    write_cifar10(root)
    write_cifar100(root, n_train=200, n_test=50)
    return root


@pytest.mark.parametrize("name,shape,n_train", [("mnist", (1, 28, 28), 300), ("fashion_mnist", (1, 28, 28), 300),
                                                 ("cifar10", (3, 32, 32), 300)])
def test_readers_return_the_files_pixels_and_labels(root, name, shape, n_train):
    x, y = load_image_arrays(name, root, train=True)
    assert x.dtype == torch.uint8 and x.shape == (n_train, *shape) and y.dtype == torch.int64
    assert y.tolist() == [i % 10 for i in range(n_train)] or name == "cifar10"  # the fixture's labels
    assert sorted(set(y.tolist())) == list(range(10))
    if name == "cifar10":  # CHW on disk, NHWC in torchvision, CHW again here
        import pickle

        first = pickle.loads((root / "cifar-10-batches-py" / "data_batch_1").read_bytes())[b"data"][0]
        assert torch.equal(x[0].flatten(), torch.from_numpy(first))


def test_module_splits_are_disjoint_seeded_and_normalised(root):
    dm = ImageDataModule("mnist", str(root), val_size=50, batch_size=20, passes_per_epoch=2, seed=3)
    dm.setup()
    train, val, test = (dm.splits[s].tensors for s in ("train", "val", "test"))
    assert (len(train[0]), len(val[0]), len(test[0])) == (250, 50, 60)
    raw, _ = load_image_arrays("mnist", root, train=True)
    rows = {tuple(r) for r in raw.flatten(1).tolist()}
    assert len(rows) == 300  # random images: each image identifies its file position
    norm = (raw.float() / 255 - 0.1307) / 0.3081
    keys = lambda t: {tuple(r) for r in torch.round(t.flatten(1) * 1e4).tolist()}  # noqa: E731
    assert keys(train[0]).isdisjoint(keys(val[0])) and keys(train[0]) | keys(val[0]) == keys(norm)
    again = ImageDataModule("mnist", str(root), val_size=50, seed=9)
    again.setup()
    assert torch.equal(again.splits["val"].tensors[0], val[0])  # split_seed, not seed, fixes the split
    batches = list(dm.train_dataloader())
    assert len(batches) == 2 * (250 // 20) and all(len(b[1]) == 20 for b in batches)
    assert all(len(keys(b[0])) == 20 for b in batches)  # no image twice within a batch


def test_multipass_sampler_is_whole_passes_of_whole_batches():
    s = MultiPassSampler(103, seed=0, passes=3, batch_size=10)
    order = list(s)
    assert len(order) == len(s) == 300
    for p in range(3):
        chunk = order[100 * p:100 * (p + 1)]
        assert len(set(chunk)) == 100 and set(chunk) <= set(range(103))
    s.set_epoch(1)
    assert list(s) != order
    with pytest.raises(ValueError, match="batch_size"):
        MultiPassSampler(5, 0, 1, 6)


def test_missing_files_name_the_file_and_the_source(tmp_path):
    write_mnist(tmp_path, "MNIST")
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=r"t10k-labels-idx1-ubyte.*data\.download=true"):
        load_image_arrays("mnist", tmp_path, train=True)
    dm = ImageDataModule("cifar10", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"cifar-10-batches-py/data_batch_1.*cifar-10-python\.tar\.gz"):
        dm.setup()


def test_bad_arguments():
    with pytest.raises(ValueError, match="dataset must be one of"):
        ImageDataModule("svhn")
    with pytest.raises(ValueError, match="num_classes"):
        ImageDataModule("mnist", num_classes=100)
    with pytest.raises(ValueError, match="image_shape"):
        ImageDataModule("cifar10", image_shape=[1, 28, 28])


@pytest.mark.parametrize("val_size", [0, 300])
def test_val_size_must_leave_training_images(root, val_size):
    with pytest.raises(ValueError, match="val_size"):
        ImageDataModule("mnist", str(root), val_size=val_size).setup()


def test_gzipped_idx_files_are_named_for_gunzip(tmp_path):
    import gzip

    write_mnist(tmp_path, "MNIST")
    for p in (tmp_path / "MNIST" / "raw").iterdir():
        p.with_name(p.name + ".gz").write_bytes(gzip.compress(p.read_bytes()))
        p.unlink()
    with pytest.raises(FileNotFoundError, match="gunzip"):
        load_image_arrays("mnist", tmp_path, train=False)


def test_cifar100_reader_uses_the_fine_labels(root):
    import pickle

    x, y = load_image_arrays("cifar100", root, train=True)
    assert x.dtype == torch.uint8 and x.shape == (200, 3, 32, 32) and y.dtype == torch.int64
    assert y.tolist() == [i % 100 for i in range(200)]  # fine, not coarse (i // 5 % 20)
    first = pickle.loads((root / "cifar-100-python" / "train").read_bytes())[b"data"][0]
    assert torch.equal(x[0].flatten(), torch.from_numpy(first))  # CHW rows
    tx, ty = load_image_arrays("cifar100", root, train=False)
    assert tx.shape == (50, 3, 32, 32) and len(ty) == 50


def test_cifar100_missing_file_names_folder_and_source(tmp_path):
    write_cifar100(tmp_path, n_train=10, n_test=5)
    (tmp_path / "cifar-100-python" / "test").unlink()
    dm = ImageDataModule("cifar100", str(tmp_path), val_size=2)
    with pytest.raises(FileNotFoundError, match=r"cifar-100-python/test.*cifar-100-python\.tar\.gz.*download=true"):
        dm.setup()


def test_crop_flip_is_torchvisions_crop_and_flip():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 3, 8, 6), generator=g, dtype=torch.uint8)
    offsets = torch.tensor([[2, 2], [0, 4], [4, 1]])
    flips = torch.tensor([False, True, False])
    out = crop_flip(x, offsets, flips, padding=2)
    assert out.shape == x.shape and out.dtype == torch.uint8
    assert torch.equal(out[0], x[0])  # offset = padding: the image itself
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    assert torch.equal(out[1], padded[1, :, 0:8, 4:10].flip(-1))
    assert torch.equal(out[2], padded[2, :, 4:12, 1:7])
    assert int(out[2, :, -2:].max()) == 0  # rows below the image come from the zero padding
    with pytest.raises(ValueError, match="offsets"):
        crop_flip(x, offsets + 3, flips, padding=2)
    with pytest.raises(ValueError, match="offsets \\(B, 2\\)"):
        crop_flip(x, offsets[:2], flips, padding=2)


def test_random_crop_flip_is_seeded():
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    a, b = random_crop_flip(x, (0, 4, 0, 1, 7)), random_crop_flip(x, (0, 4, 0, 1, 7))
    assert torch.equal(a, b) and a.dtype == torch.uint8 and a.shape == x.shape
    assert not torch.equal(a, random_crop_flip(x, (0, 4, 0, 1, 8)))  # another step, other crops
    assert not torch.equal(a, x)


def test_augmenting_module_keeps_uint8_and_normalises_after_transfer(root):
    dm = ImageDataModule("cifar100", str(root), val_size=10, batch_size=16, augment=True, num_classes=100)
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and x.shape == (16, 3, 32, 32) and len(dm.splits["val"]) == 10

    class _Trainer:  # what on_after_batch_transfer reads of the trainer
        training, global_rank, current_epoch, global_step = True, 0, 0, 5

    dm.trainer = _Trainer()
    out, same_y = dm.on_after_batch_transfer((x, y), 0)
    assert out.dtype == torch.float32 and out.shape == x.shape and torch.equal(same_y, y)
    again, _ = dm.on_after_batch_transfer((x, y), 0)
    assert torch.equal(out, again)  # a pure function of (seed, rank, epoch, step)
    _Trainer.training = False  # validation / test: normalised, not augmented
    plain, _ = dm.on_after_batch_transfer((x, y), 0)
    mean = torch.tensor((0.5071, 0.4865, 0.4409)).view(1, 3, 1, 1)
    std = torch.tensor((0.2673, 0.2564, 0.2762)).view(1, 3, 1, 1)
    assert torch.allclose(plain, (x.float() / 255 - mean) / std) and not torch.allclose(plain, out)


def _copy(root, tmp_path, folder):
    import shutil

    shutil.copytree(root / folder, tmp_path / folder)
    return tmp_path / folder


def test_truncated_mnist_idx_file_is_named(root, tmp_path):
    """A truncated idx file ended in torchvision's reshape error, the file not named."""
    raw = _copy(root, tmp_path, "MNIST")
    path = raw / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.*cannot be read as idx.*truncated"):
        load_image_arrays("mnist", tmp_path, train=True)
    load_image_arrays("mnist", tmp_path, train=False)  # the test split's files are fine


def test_mnist_labels_out_of_range_are_refused(root, tmp_path):
    """Labels out of range failed at validation, in a raw scatter_add_ index error."""
    import numpy as np

    from experiments.data.image_files import write_idx

    raw = _copy(root, tmp_path, "MNIST") / "raw"
    write_idx(raw / "t10k-labels-idx1-ubyte", np.full(60, 12))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte.*60 of 60 labels outside 0\.\.9"):
        load_image_arrays("mnist", tmp_path, train=False)


def test_garbage_cifar100_pickle_is_named(root, tmp_path):
    folder = _copy(root, tmp_path, "cifar-100-python")
    (folder / "train").write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match=r"cifar-100-python/train: cannot be read as a CIFAR python-version batch"):
        load_image_arrays("cifar100", tmp_path, train=True)


def test_cifar100_rows_of_the_wrong_width_are_named(root, tmp_path):
    import pickle

    import numpy as np

    folder = _copy(root, tmp_path, "cifar-100-python")
    split = pickle.loads((folder / "test").read_bytes())
    split[b"data"] = np.zeros((50, 1000), dtype=np.uint8)
    (folder / "test").write_bytes(pickle.dumps(split))
    with pytest.raises(ValueError, match=r"cifar-100-python/test: b'data' has shape \(50, 1000\), expected "
                                         r"\(N, 3072\)"):
        load_image_arrays("cifar100", tmp_path, train=False)


def test_gzip_file_under_the_uncompressed_name_is_named(root, tmp_path):
    """A .gz archive saved as train-images-idx3-ubyte gave torchvision's bare AssertionError."""
    import gzip

    for folder, name, train in (("MNIST", "mnist", True), ("cifar-100-python", "cifar100", False)):
        target = _copy(root, tmp_path, folder)
        path = target / "raw" / "train-images-idx3-ubyte" if name == "mnist" else target / "test"
        path.write_bytes(gzip.compress(path.read_bytes()))
        with pytest.raises(ValueError, match=rf"{path.name}: is gzip-compressed.*gunzip {path}.gz"):
            load_image_arrays(name, tmp_path, train=train)


def test_canonical_size_file_with_zeroed_pixels_is_refused(tmp_path):
    """An MNIST train-images file of the right size with zeroed pixels trained to 9.70 % and was
    recorded as done. A file of the canonical size is compared with the canonical md5; another data set's file is
    named as such; a constant image set of any size is refused."""
    import numpy as np

    from diffrank.experiments.data.image_readers import CANONICAL_MD5
    from experiments.data.image_files import write_idx

    write_mnist(tmp_path, "MNIST", n_train=60, n_test=60)
    raw = tmp_path / "MNIST" / "raw"
    write_idx(raw / "train-images-idx3-ubyte", np.zeros((60000, 28, 28)))  # 47 040 016 bytes, as the real one
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte: has the size of the canonical mnist file but md5 "
                                         rf"\w+, not {CANONICAL_MD5['mnist']['train-images-idx3-ubyte']}: it is "
                                         r"corrupt or altered"):
        load_image_arrays("mnist", tmp_path, train=True)
    write_idx(raw / "t10k-images-idx3-ubyte", np.zeros((60, 28, 28)))  # not the canonical size: no md5
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.*every pixel of all 60 images is 0"):
        load_image_arrays("mnist", tmp_path, train=False)


@real_data("MNIST", "raw")
@real_data("FashionMNIST", "raw")
def test_real_files_match_the_canonical_md5_and_swapped_sets_are_named(tmp_path):
    """The real files pass the check; Fashion-MNIST's labels under MNIST/raw are named as Fashion-MNIST's."""
    import shutil

    for name in ("mnist", "fashion_mnist"):
        load_image_arrays(name, DATA, train=False)
    raw = tmp_path / "MNIST" / "raw"
    shutil.copytree(DATA / "MNIST" / "raw", raw)
    shutil.copy(DATA / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte", raw / "t10k-labels-idx1-ubyte")
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte: .* it is fashion_mnist's file"):
        load_image_arrays("mnist", tmp_path, train=False)
