"""Warcraft shortest-path data: the generator's files load through the real reader, labels are exact shortest
paths, normalisation, missing-file and shape errors, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffrank.experiments.algorithms.dijkstra import shortest_paths
from diffrank.experiments.data.warcraft import MapBatch, WarcraftDataModule
from diffrank.experiments.data.warcraft_like import main as warcraft_like_main
from diffrank.experiments.data.warcraft_like import tile_costs
from diffrank.experiments.data.warcraft_maps import MARKER, REAL_ROOT, SPLITS, SYNTHETIC_ROOT, split_files
from experiments.data.warcraft_files import write_warcraft

SIZES = (20, 5, 5)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """Generated sets: k = 12 and k = 4 in the synthetic folder, and k = 4 under the real folder name."""
    root = tmp_path_factory.mktemp("warcraft")
    write_warcraft(root, 12, SIZES, seed=0)
    write_warcraft(root, 4, SIZES, seed=0)
    write_warcraft(root, 4, SIZES, seed=0, synthetic=False)
    return root


@pytest.mark.parametrize("grid", [12, 4])
def test_generated_files_load_through_the_reader(sets, grid):
    dm = WarcraftDataModule(sets, grid=grid, root_name=SYNTHETIC_ROOT, batch_size=7, eval_batch_size=4)
    assert dm.synthetic and dm.synthetic_info["grid"] == grid and dm.synthetic_info["tile_costs"] == tile_costs()
    assert dm.grid == grid and dm.num_cells == grid * grid and dm.image_shape == (3, 8 * grid, 8 * grid)
    dm.setup("fit")
    assert [len(dm.datasets[s]) for s in SPLITS] == list(SIZES)
    batches = list(dm.train_dataloader())
    assert [len(b[0]) for b in batches] == [7, 7, 6]
    maps, weights, paths = batches[0]
    assert maps.shape == (7, 3, 8 * grid, 8 * grid) and maps.dtype == torch.float32
    assert weights.shape == paths.shape == (7, grid, grid)
    assert weights.dtype == paths.dtype == torch.float32
    assert set(paths.unique().tolist()) == {0.0, 1.0}
    assert [len(b[0]) for b in dm.val_dataloader()] == [4, 1]
    assert sum(len(b[0]) for b in dm.test_dataloader()) == SIZES[2]
    # normalisation: the training maps' per-channel statistics, applied to every split
    x = torch.cat([b[0] for b in batches])
    assert torch.allclose(x.mean((0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(x.std((0, 2, 3), unbiased=False), torch.ones(3), atol=1e-4)
    raw = np.load(dm.folder / "train_maps.npy").astype(np.float64)
    np.testing.assert_allclose(dm.mean, raw.mean((0, 1, 2)), rtol=1e-10)
    np.testing.assert_allclose(dm.std, raw.std((0, 1, 2)), rtol=1e-8)
    val_raw = np.load(dm.folder / "val_maps.npy")[:4].astype(np.float64)
    want = (val_raw - dm.mean) / dm.std
    got = next(iter(dm.val_dataloader()))[0].permute(0, 2, 3, 1).double().numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("grid", [12, 4])
def test_labels_are_exact_shortest_paths(sets, grid):
    folder = sets / SYNTHETIC_ROOT / f"{grid}x{grid}"
    for split in SPLITS:
        _, wname, pname = split_files(split)
        weights, paths = np.load(folder / wname), np.load(folder / pname)
        assert weights.dtype == np.float32 and paths.dtype == np.uint8
        assert torch.equal(shortest_paths(torch.from_numpy(weights)), torch.from_numpy(paths).float())
        assert paths[:, 0, 0].all() and paths[:, -1, -1].all()
    # vertex costs: every type's cost times a factor within the jitter
    costs = np.array(sorted(tile_costs().values()))
    jitter = json.loads((folder / MARKER).read_text())["cost_jitter"]
    w = np.load(folder / "train_vertex_weights.npy").ravel()
    nearest = costs[np.abs(w[:, None] / costs[None] - 1).argmin(1)]
    assert np.all(np.abs(w / nearest - 1) <= jitter + 1e-6)


def test_real_layout_is_the_default_and_not_synthetic(sets):
    dm = WarcraftDataModule(sets, grid=4)
    assert dm.folder == sets / REAL_ROOT / "4x4" and not dm.synthetic and dm.synthetic_info is None


def test_missing_files_are_named(tmp_path, sets):
    with pytest.raises(FileNotFoundError) as err:
        WarcraftDataModule(tmp_path, grid=12)
    msg = str(err.value)
    for split in SPLITS:
        for name in split_files(split):
            assert str(tmp_path / REAL_ROOT / "12x12" / name) in msg
    assert "warcraft_maps.tar" in msg and "paths.data_dir" in msg
    assert "python -m diffrank.experiments.data.warcraft_like --out" in msg
    # a generated set next door is pointed at
    with pytest.raises(FileNotFoundError, match="data.root_name=warcraft_like_synthetic"):
        WarcraftDataModule(sets, grid=12)


def test_grid_mismatch_is_a_clear_error(tmp_path):
    folder = write_warcraft(tmp_path, 4, (3, 2, 2))
    folder.rename(folder.parent / "5x5")
    dm = WarcraftDataModule(tmp_path, grid=5, root_name=SYNTHETIC_ROOT)
    with pytest.raises(ValueError, match="data.grid = 5"):
        dm.setup()


def test_generator_is_deterministic(tmp_path, sets):
    a = write_warcraft(tmp_path / "a", 4, SIZES, seed=0)
    c = write_warcraft(tmp_path / "c", 4, SIZES, seed=1)
    ref = sets / SYNTHETIC_ROOT / "4x4"
    for split in SPLITS:
        for name in split_files(split):
            assert np.array_equal(np.load(a / name), np.load(ref / name)), name
        assert not np.array_equal(np.load(c / f"{split}_maps.npy"), np.load(ref / f"{split}_maps.npy"))
    # the splits are different draws
    assert not np.array_equal(np.load(ref / "val_maps.npy")[:5], np.load(ref / "train_maps.npy")[:5])


def test_training_order_and_limits(sets):
    dm = WarcraftDataModule(sets, grid=4, root_name=SYNTHETIC_ROOT, batch_size=6, seed=3, limit_train=12,
                            limit_eval=3)
    dm.setup()
    assert len(dm.datasets["train"]) == 12 and len(dm.datasets["val"]) == 3 and len(dm.datasets["test"]) == 3
    loader = dm.train_dataloader()
    order = [list(idx) for idx in loader.sampler]
    assert sorted(sum(order, [])) == list(range(12))
    assert order == [list(idx) for idx in loader.sampler]  # same epoch, same order
    loader.sampler.set_epoch(1)
    assert order != [list(idx) for idx in loader.sampler]
    # a batch holds exactly the maps of its indices
    weights = np.load(dm.folder / "train_vertex_weights.npy")
    first = next(iter(dm.train_dataloader()))[1].numpy()
    assert sorted(map(bytes, first)) == sorted(map(bytes, weights[order[0]]))


def test_device_resident_batches_equal_host_batches(sets):
    host = WarcraftDataModule(sets, grid=4, root_name=SYNTHETIC_ROOT, batch_size=5)
    res = WarcraftDataModule(sets, grid=4, root_name=SYNTHETIC_ROOT, batch_size=5, device_resident=True)
    host.setup()
    res.setup()
    for a, key in zip(host.val_dataloader(), res.val_dataloader()):
        assert isinstance(key, MapBatch)
        b = res.transfer_batch_to_device(key, torch.device("cpu"), 0)
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_bad_options(sets):
    with pytest.raises(ValueError):
        WarcraftDataModule(sets, grid=4, root_name=SYNTHETIC_ROOT, batch_size=0)
    with pytest.raises(ValueError):
        WarcraftDataModule(sets, grid=4, root_name=SYNTHETIC_ROOT, limit_train=0)
    with pytest.raises(ValueError):
        WarcraftDataModule(sets, grid=4, root_name=SYNTHETIC_ROOT, device_resident="sometimes")


def test_command_line_and_config(tmp_path, compose_train):
    warcraft_like_main(["--out", str(tmp_path), "--grid", "4", "--n-train", "6", "--n-val", "2", "--n-test", "2",
                 "--seed", "5", "--no-md5"])
    marker = json.loads((tmp_path / SYNTHETIC_ROOT / "4x4" / MARKER).read_text())
    assert marker["synthetic"] and marker["seed"] == 5 and marker["splits"]["train"]["maps"] == 6
    from hydra.utils import instantiate

    cfg = compose_train(["data=warcraft", f"paths.data_dir={tmp_path}", "data.grid=4",
                         f"data.root_name={SYNTHETIC_ROOT}"])
    dm = instantiate(cfg.data)
    assert isinstance(dm, WarcraftDataModule) and dm.synthetic and dm.batch_size == 70


def test_verify_md5_rejects_other_files(tmp_path):
    write_warcraft(tmp_path, 12, (2, 1, 1), synthetic=False)
    dm = WarcraftDataModule(tmp_path, grid=12, verify_md5=True)
    with pytest.raises(ValueError, match="MD5 mismatch"):
        dm.setup()


def test_truncated_npy_file_is_named(tmp_path):
    """numpy's "mmap length is greater than file size", the file not named."""
    folder = write_warcraft(tmp_path, 4, (3, 2, 2))
    path = folder / split_files("train")[0]
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ValueError, match=r"train_maps\.npy: cannot be read as a \.npy array.*truncated"):
        WarcraftDataModule(tmp_path, grid=4, root_name=SYNTHETIC_ROOT).setup()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_non_finite_or_negative_vertex_costs_are_refused(tmp_path, bad):
    """A NaN vertex weight in the test split gave test/cost_ratio nan %, status done."""
    folder = write_warcraft(tmp_path, 4, (3, 2, 2))
    path = folder / split_files("test")[1]
    weights = np.load(path)
    weights[1, 2, 3] = bad
    np.save(path, weights)
    with pytest.raises(ValueError, match=r"test_vertex_weights\.npy: 1 of 2 weight grids .*first: map 1"):
        WarcraftDataModule(tmp_path, grid=4, root_name=SYNTHETIC_ROOT).setup()
