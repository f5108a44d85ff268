"""diffrank.experiments.tools.convert_embeddings, .extract_embeddings and the ImageNet head protocols on tiny caches.

Conversion: each released key scheme (a dict written with torch.save, zip and legacy formats) and our own
format round-trip. Extraction: a tiny ImageFolder of 32x32 PNGs through a random-weight timm ``resnet10t``,
interrupted after one chunk and resumed, equals an uninterrupted run; missing weights exit with status 2 and a
message saying which file and how to provide it. Protocols: ``topk/imagenet*`` under ``fast_dev_run`` on caches
with the real widths and class counts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffrank.experiments.data.embedding_cache import open_split
from diffrank.experiments.tools import convert_embeddings, extract_embeddings
from experiments.data.embedding_files import FOLDERS, PAPER_KEYS, write_embedding_cache, write_paper_pickle


def _read(root) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    index = json.loads((root / "index.json").read_text())
    return {s: tuple(np.array(a) for a in open_split(root, s)) for s in index["splits"]}


# --- conversion ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", sorted(PAPER_KEYS))
def test_paper_pickle_converts_and_round_trips(tmp_path, scheme):
    src = tmp_path / "ImageNet_embeddings_labels_train_test_IGAM_Resnext101_32x48d_320.p"
    data = write_paper_pickle(src, scheme, n_train=40, n_test=20, dim=8)
    assert convert_embeddings.main([str(src), "--out", str(tmp_path / "a"), "--chunk-rows", "7"]) == 0
    got = _read(tmp_path / "a")
    for split, (e_key, l_key) in PAPER_KEYS[scheme].items():
        emb, lab = got[split]
        assert emb.dtype == np.float16 and lab.dtype == np.int64
        assert np.array_equal(emb, data[e_key].to(torch.float16).numpy())
        assert np.array_equal(lab, data[l_key].numpy())
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert index["dim"] == 8 and index["img_size"] == 320 and index["model"].startswith("resnext101_32x48d")
    assert convert_embeddings.main([str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 0  # ours -> ours
    again = _read(tmp_path / "b")
    assert all(np.array_equal(got[s][i], again[s][i]) for s in got for i in (0, 1))


def test_legacy_pickle_loads_whole_with_a_warning(tmp_path):
    src = tmp_path / "legacy.p"
    data = write_paper_pickle(src, "imagenet21kp", dtype=torch.float16, zip_format=False)
    with pytest.warns(UserWarning, match="cannot be memory-mapped"):
        convert_embeddings.convert(src, tmp_path / "out", model="x", img_size=224)
    emb, _ = open_split(tmp_path / "out", "test")
    assert np.array_equal(emb, data["imagenet21k_val_embeddings"].numpy())


def test_pickles_needing_code_and_unknown_keys_are_refused(tmp_path, capsys):
    torch.save({"train_embeddings": np.zeros((4, 2)), "train_labels": np.arange(4)}, tmp_path / "np.p")
    assert convert_embeddings.main([str(tmp_path / "np.p"), "--out", str(tmp_path / "o")]) == 2
    assert "--unsafe-pickle" in capsys.readouterr().err
    assert convert_embeddings.main([str(tmp_path / "np.p"), "--out", str(tmp_path / "o"), "--unsafe-pickle"]) == 0
    assert open_split(tmp_path / "o", "train")[0].shape == (4, 2)
    torch.save({"features": torch.zeros(2, 2)}, tmp_path / "odd.p")
    assert convert_embeddings.main([str(tmp_path / "odd.p"), "--out", str(tmp_path / "p")]) == 2
    assert "no known key scheme" in capsys.readouterr().err
    assert convert_embeddings.main([str(tmp_path / "absent.p"), "--out", str(tmp_path / "q")]) == 2


# --- extraction ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 5), ("val", 2)):
        for c in ("cat", "dog"):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")
    return root


def _extract(folder, out, *extra):
    return extract_embeddings.main(["--model", "resnet10t", "--random-weights", "--image-folder", str(folder),
                                    "--out", str(out), "--img-size", "32", "--batch-size", "3", "--chunk-batches",
                                    "1", "--num-workers", "0", "--no-progress", *extra])


def test_extraction_resumes_without_duplicates(image_folder, tmp_path, capsys):
    assert _extract(image_folder, tmp_path / "full") == 0
    assert "images/s" in capsys.readouterr().out
    assert _extract(image_folder, tmp_path / "cut", "--max-batches", "1") == 0
    index = json.loads((tmp_path / "cut" / "index.json").read_text())
    assert index["splits"]["train"] == {"rows": 10, "rows_done": 3} and index["splits"]["test"]["rows_done"] == 0
    # a kill after writing rows but before the index advanced: the garbage is overwritten on resume
    emb = np.load(tmp_path / "cut" / "train_embeddings.npy", mmap_mode="r+")
    emb[3:6] = 7
    emb.flush()
    del emb
    assert _extract(image_folder, tmp_path / "cut") == 0
    full, cut = _read(tmp_path / "full"), _read(tmp_path / "cut")
    index = json.loads((tmp_path / "cut" / "index.json").read_text())
    assert index["splits"] == {"train": {"rows": 10, "rows_done": 10}, "test": {"rows": 4, "rows_done": 4}}
    assert index["dim"] == 512 and index["img_size"] == 32 and index["dtype"] == "float16"
    for s in ("train", "test"):
        assert np.array_equal(full[s][0], cut[s][0]) and np.array_equal(full[s][1], cut[s][1])
        assert np.isfinite(full[s][0]).all() and np.abs(full[s][0]).sum() > 0
    assert full["train"][1].tolist() == [0] * 5 + [1] * 5  # ImageFolder order: sorted classes, then files


def test_extraction_refuses_another_cache_in_the_folder(image_folder, tmp_path):
    assert _extract(image_folder, tmp_path / "o", "--max-batches", "1") == 0
    with pytest.raises(ValueError, match="another cache"):
        _extract(image_folder, tmp_path / "o", "--seed", "1")


def test_missing_weights_say_which_file_and_how(tmp_path, capsys, image_folder):
    base = ["--model", "resnet10t", "--image-folder", str(image_folder), "--out", str(tmp_path / "o"), "--no-progress"]
    assert extract_embeddings.main(base) == 2  # --pretrained is the default; offline (HF_HUB_OFFLINE in conftest)
    err = capsys.readouterr().err
    assert "timm/resnet10t" in err and "--checkpoint" in err and "huggingface-cli download" in err
    assert extract_embeddings.main([*base, "--checkpoint", str(tmp_path / "w.pth")]) == 2
    assert "w.pth does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_checkpoint_file_is_loaded(tmp_path, image_folder):
    import timm

    torch.manual_seed(5)
    torch.save(timm.create_model("resnet10t").state_dict(), tmp_path / "w.pth")
    assert _extract(image_folder, tmp_path / "a", "--max-batches", "1") == 0
    args = ["--model", "resnet10t", "--checkpoint", str(tmp_path / "w.pth"), "--image-folder", str(image_folder),
            "--out", str(tmp_path / "b"), "--img-size", "32", "--batch-size", "3", "--num-workers", "0",
            "--no-progress", "--max-batches", "1"]
    assert extract_embeddings.main(args) == 0
    index = json.loads((tmp_path / "b" / "index.json").read_text())
    assert index["weights"] == "checkpoint:w.pth"
    a, b = np.load(tmp_path / "a" / "train_embeddings.npy")[:3], np.load(tmp_path / "b" / "train_embeddings.npy")[:3]
    assert not np.array_equal(a, b)  # other weights than the seed-0 random ones


@pytest.mark.slow
def test_extraction_from_a_saved_hf_dataset(tmp_path):
    import datasets
    from PIL import Image

    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)) for _ in range(5)]
    ds = datasets.Dataset.from_dict({"img": images, "y": [0, 1, 2, 1, 0]}).cast_column("img", datasets.Image())
    datasets.DatasetDict({"train": ds, "validation": ds.select(range(2))}).save_to_disk(str(tmp_path / "hf"))
    assert extract_embeddings.main(["--model", "resnet10t", "--random-weights", "--hf-dataset", str(tmp_path / "hf"),
                                    "--image-column", "img", "--label-column", "y", "--out", str(tmp_path / "o"),
                                    "--img-size", "32", "--batch-size", "2", "--num-workers", "0",
                                    "--no-progress"]) == 0
    got = _read(tmp_path / "o")
    assert got["train"][1].tolist() == [0, 1, 2, 1, 0] and got["test"][0].shape == (2, 512)


# --- protocols -------------------------------------------------------------------------------------------------

PROTOCOLS = {"topk/imagenet1k": ("imagenet1k", 2048, 1000), "topk/imagenet21kp": ("imagenet21kp", 2048, 10450),
             "topk/imagenet1k_effnet_l2": ("imagenet1k_effnet_l2", 5504, 1000)}


@pytest.fixture(scope="module")
def embedding_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedding_caches")
    for key, dim, classes in PROTOCOLS.values():
        write_embedding_cache(root / FOLDERS[key], n_train=600, n_test=500, dim=dim, num_classes=classes)
    return root


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "topk/imagenet1k" else pytest.mark.slow)
                                  for n in PROTOCOLS])
def test_protocol_fast_dev_run(train_built, compose_train, embedding_root, name):
    cfg = compose_train([f"experiment={name}", f"paths.data_dir={embedding_root}", "data.val_size=100"])
    _, dim, classes = PROTOCOLS[name]
    assert cfg.data.batch_size == 500 and cfg.model.net.in_features == dim and cfg.data.num_classes == classes
    record, objects = train_built(cfg)
    metrics = record.metrics
    ks = [1, 5, 10, 20] if name == "topk/imagenet21kp" else [1, 5]
    assert all(0 <= metrics[f"test/top{k}"] <= 1 for k in ks)
    assert objects["loss"].m == (50 if name == "topk/imagenet21kp" else 16)
    lr = objects["model"].hparams.optimizer.keywords["lr"]
    assert lr == pytest.approx(1e-4 if name == "topk/imagenet21kp" else 10 ** -4.5)
