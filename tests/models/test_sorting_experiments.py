"""The sorting benchmark end to end: the CNNs, every experiment config (compose + paper key), fast_dev_run."""

from __future__ import annotations

import pytest
import torch

from conftest import options
from diffrank import reference
from diffrank.models.sorting import MultiDigitCNN, RankingSupervisionModule
from diffrank.train import train

EXPERIMENTS = [e for e in options("experiment") if e.startswith("sort_")]
SMALL = ["data=digits_sort", "data.batch_size=8", "data.val_sets=8", "data.test_sets=8", "data.eval_batch_size=8"]
SMALL_SVHN = ["data.batch_size=4", "data.eval_batch_size=4"]  # + paths.data_dir=<tiny files>
# one per operator family / loss / network, and the extreme n
REPRESENTATIVE = ["sort_mnist_t3_7_oe_cauchy_n5", "sort_mnist_t3_3_bi_art_n4", "sort_mnist_t3_7_sinkhorn_n3",
                  "sort_mnist_t3_7_fast_soft_sort_n5", "sort_mnist_lapsum_t4_n5", "sort_mnist_t7_3_softsort_n10",
                  "sort_mnist_t3_7_bi_reciprocal_n32", "sort_svhn_t3_4_bi_art_n8",
                  "sort_mnist_t3_5_bi_l04_n64_b4"]


@pytest.fixture(scope="module")
def svhn_root(tmp_path_factory):
    """Tiny SVHN files in the official format (random pixels, labels = house numbers)."""
    from diffrank.data.svhn_sort import SVHN_FILES

    root = tmp_path_factory.mktemp("svhn")
    (root / "SVHNMultiDigit").mkdir()
    g = torch.Generator().manual_seed(0)
    for name, size in zip(SVHN_FILES.values(), (300, 100, 100)):
        images = torch.randint(0, 256, (size, 3, 64, 64), generator=g, dtype=torch.uint8)
        torch.save((images, torch.randint(1, 10000, (size,), generator=g)), root / "SVHNMultiDigit" / name)
    return root


def _small(name, svhn_root):
    return [*SMALL_SVHN, f"paths.data_dir={svhn_root}"] if name.startswith("sort_svhn") else SMALL


def test_mnist_and_svhn_nets_have_the_papers_sizes():
    net = MultiDigitCNN((1, 28, 112), (32, 64), 64)
    assert net.num_features == 12544 and net(torch.zeros(3, 1, 28, 112)).shape == (3,)
    svhn = MultiDigitCNN((3, 54, 54), (32, 64, 128, 256), 64)
    assert svhn.num_features == 2304 and svhn(torch.zeros(2, 3, 54, 54)).shape == (2,)
    assert MultiDigitCNN((1, 8, 32)).num_features == 64 * 2 * 8
    with pytest.raises(ValueError, match="too small"):
        MultiDigitCNN((1, 8, 8), (32, 64, 128, 256))


def test_module_scores_each_image_independently():
    net = MultiDigitCNN((1, 8, 32))
    m = RankingSupervisionModule(net, loss=lambda s, v: s.sum(), optimizer=torch.optim.Adam)
    x = torch.rand(2, 4, 1, 8, 32)
    s = m(x)
    assert s.shape == (2, 4)
    assert torch.allclose(m(x.flip(1)), s.flip(1), atol=1e-6)
    with pytest.raises(ValueError, match="B, n, C, H, W"):
        m(torch.rand(4, 1, 8, 32))


def test_experiment_count_and_paper_keys():
    assert len(EXPERIMENTS) >= 180 and set(REPRESENTATIVE) <= set(EXPERIMENTS)
    from omegaconf import OmegaConf

    from conftest import CONFIGS

    for name in EXPERIMENTS:
        cfg = OmegaConf.to_container(OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml"), resolve=True)
        rows = reference.match(cfg["paper"])
        metrics = [r["metric"] for r in rows]
        assert rows and len(metrics) == len(set(metrics)), name  # one reference row per metric
        assert cfg["data"]["n"] == int(cfg["paper"]["n"]) and cfg["task_name"] == name


@pytest.mark.parametrize("names", [
    pytest.param(REPRESENTATIVE, id="representative"),
    pytest.param(EXPERIMENTS, id="all", marks=pytest.mark.slow)])
def test_experiments_compose(compose_train, names):
    for name in names:
        cfg = compose_train([f"experiment={name}"], fast=False)
        assert cfg.optimized_metric == "val/em5" and cfg.trainer.max_steps >= 1e4


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_fast_dev_run_representative(compose_train, svhn_root, name):
    metrics, objects = train(compose_train([f"experiment={name}", *_small(name, svhn_root)]))
    assert {"test/em", "test/ew", "test/em5"} <= set(metrics)
    assert all(0 <= metrics[k] <= 1 for k in ("test/em", "test/ew", "test/em5"))
    assert objects["results"]["paper"]["n"] == objects["datamodule"].n


@pytest.mark.slow
@pytest.mark.parametrize("name", [e for e in EXPERIMENTS if e not in REPRESENTATIVE])
def test_fast_dev_run_all(compose_train, svhn_root, name):
    metrics, _ = train(compose_train([f"experiment={name}", *_small(name, svhn_root)]))
    assert {"test/em", "test/ew", "test/em5"} <= set(metrics)


def test_short_training_learns_to_rank_digits(compose_train):
    """A few hundred steps on real digits beat chance (EW of random order is 1/n) by far."""
    cfg = compose_train(["experiment=sort_mnist_t3_7_oe_cauchy_n5", "data=digits_sort", "data.n=3",
                         "data.batch_size=16", "data.val_sets=50", "data.test_sets=100", "trainer.max_steps=80",
                         "trainer.val_check_interval=40", "model.optimizer.lr=0.002", "callbacks=none",
                         "operator.beta=45.6"], fast=False)
    cfg.trainer.enable_progress_bar = False
    cfg.trainer.enable_model_summary = False
    metrics, _ = train(cfg)
    assert metrics["test/ew"] > 0.6 and metrics["test/em"] > 0.3


def test_table_3_5_beta_sweep_matches_each_cell(compose_train):
    """The paper key interpolates β, so every job of the β sweep matches its own published cell."""
    from omegaconf import OmegaConf

    for beta, value in (("30", "75.88"), ("32.5", "75.59"), ("40", "74.67")):
        cfg = compose_train(["experiment=sort_mnist_t3_5_bi_l04_n64_b4", f"operator.beta={beta}"], fast=False)
        rows = reference.match(OmegaConf.to_container(cfg.paper, resolve=True))
        assert [(r["metric"], r["value"]) for r in rows] == [("EM5", value)]
    rows = reference.match({"table": "3.5", "n": 1024, "setting": "lambda=0.4;batch=4;beta=30;steps=1e4;half=both"})
    assert len(rows) == 1  # the column printed twice is reported once


def test_em5_from_the_5_chunks_of_large_sets():
    net = MultiDigitCNN((1, 8, 32))
    m = RankingSupervisionModule(net, loss=lambda s, v: s.sum(), optimizer=torch.optim.Adam)
    values = torch.arange(12).view(1, 12)  # chunks [0..4], [5..9]; items 10, 11 unused
    scores = values.float().clone()
    scores[0, 7] = -1.0  # breaks the second chunk only
    m.forward = lambda images: scores
    m.log = lambda *a, **k: None
    m._eval_step("val", (torch.zeros(1, 12, 1, 8, 32), values))
    assert m.metrics["val_em5"].compute().item() == 0.5 and m.metrics["val_em"].compute().item() == 0.0
