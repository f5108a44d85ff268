"""Deep kNN end to end: the module, every experiment config (fast_dev_run on tiny files in the official
formats), the rows' paper keys, the digits smoke run."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from diffrank import reference
from diffrank.experiments.models.autoencoder import ConvAutoEncoder
from diffrank.experiments.models.knn import KNNClassifier
from diffrank.experiments.models.nets import CifarResNet18, PCAFeatures, TwoLayerConvNet
from diffrank.experiments.run.train import train
from diffrank.losses.knn import NeighbourLoss
from diffrank.operators import load
from experiments.data.image_files import write_cifar10, write_mnist
from helpers import CONFIGS, DATA, options, real_data

CONFIGS_KNN = [e for e in options("experiment") if e.startswith("knn/")]
PROTOCOLS = ["knn/mnist", "knn/fashion_mnist", "knn/cifar10"]
ROWS = [e for e in CONFIGS_KNN if e not in PROTOCOLS]
SAMPLE = ["knn/mnist", "knn/soft_topk_t1/mnist_soft_topk", "knn/soft_topk_t1/mnist_pca",
          "knn/soft_topk_t1/mnist_ce_cnn", "knn/lapsum_t3/mnist_lapsum", "knn/fashion_mnist/neuralsort",
          "knn/soft_topk_t1/cifar10_pixels", "knn/soft_topk_t1/mnist_ae"]


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("knn_images")
    write_mnist(root, "MNIST", n_train=120, n_test=30)
    write_mnist(root, "FashionMNIST", n_train=120, n_test=30, seed=1)
    write_cifar10(root, per_batch=16, n_test=20)  # 80 - 20 held out >= PCA-50
    return root


def _small(name: str, root) -> list[str]:
    cifar = "cifar10" in name
    return [f"paths.data_dir={root}", "data.val_size=20", "data.eval_batch_size=50",
            *(["data.batch_size=20", "model.num_queries=10"] if cifar
              else ["data.batch_size=40", "model.num_queries=20"])]


def test_sample_covers_every_table_and_dataset():
    assert set(SAMPLE) <= set(CONFIGS_KNN)
    assert {"knn/soft_topk_t1", "knn/lapsum_t3", "knn/fashion_mnist"} <= {n.rsplit("/", 1)[0] for n in ROWS}


def test_rows_carry_their_paper_keys():
    for name in ROWS:
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        if name.startswith("knn/fashion_mnist/"):
            assert cfg.paper is None, name
            continue
        rows = reference.match(OmegaConf.to_container(cfg.paper, resolve=True))
        assert [r["metric"] for r in rows] == ["top1"], name
        assert rows[0]["dataset"] == name.rsplit("/", 1)[1].split("_")[0], name
        if "paper_method" in cfg:
            assert rows[0]["operator"] == cfg.paper_method, name


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in SAMPLE else pytest.mark.slow) for n in CONFIGS_KNN])
def test_fast_dev_run(train_built, compose_train, image_root, name):
    record, objects = train_built(compose_train([f"experiment={name}", *_small(name, image_root)]))
    metrics = record.metrics
    assert 0 <= metrics["test/top1"] <= 1 and "val/top1" in metrics
    model = objects["model"]
    assert isinstance(model, KNNClassifier)
    rec = record.to_dict()
    assert (rec["paper"] is None) == (name in PROTOCOLS or name.startswith("knn/fashion_mnist/"))
    if "ce_cnn" in name or "pretrained_cnn" in name:
        assert model.head is not None and {"test/knn_top1", "test/head_top1"} & set(metrics)
    if name.endswith("_lapsum") or name == "knn/fashion_mnist/lapsum":
        assert "train/beta" in metrics
    if name.endswith("_ae"):
        assert model.autoencoder and isinstance(model.net, ConvAutoEncoder) and model.head is None
        assert rec["paper"]["method"] == "kNN+AE"


def test_digits_runs_in_seconds(compose_train):
    metrics = train(compose_train(["model=knn", "data=digits", "operator=lapsum", "data.batch_size=60",
                                      "model.num_queries=30", "model.net.padding=2"])).metrics
    assert metrics["test/top1"] > 0


def test_module_checks_its_arguments():
    net, opt = TwoLayerConvNet(), torch.optim.SGD
    loss = NeighbourLoss(load("lapsum"), k=3)
    with pytest.raises(ValueError, match="no head"):
        KNNClassifier(net, loss, opt, 10, head=torch.nn.Linear(500, 10))
    with pytest.raises(ValueError, match="needs a head"):
        KNNClassifier(net, torch.nn.CrossEntropyLoss(), opt, 10)
    with pytest.raises(ValueError, match="primary"):
        KNNClassifier(net, loss, opt, 10, primary="both")
    with pytest.raises(ValueError, match="decode"):
        KNNClassifier(net, torch.nn.MSELoss(), opt, 10, autoencoder=True)
    with pytest.raises(ValueError, match="no head"):
        KNNClassifier(ConvAutoEncoder(), loss, opt, 10, autoencoder=True)


def test_autoencoder_shapes_and_reconstruction_step():
    """The MNIST and CIFAR-10 autoencoders map images to codes and back to the image shape; one reconstruction
    step through KNNClassifier lowers the error on its batch (the decoder is what the loss trains)."""
    ae = ConvAutoEncoder((1, 28, 28), (32, 64), 64)
    x = torch.randn(4, 1, 28, 28)
    assert ae(x).shape == (4, 64) and ae.decode(ae(x)).shape == x.shape
    big = ConvAutoEncoder((3, 32, 32), (32, 64, 128), 256)
    assert big(torch.zeros(2, 3, 32, 32)).shape == (2, 256) and big.decode(torch.zeros(2, 256)).shape == (2, 3, 32, 32)
    with pytest.raises(ValueError, match="divisible"):
        ConvAutoEncoder((1, 30, 30), (32, 64), 64)
    with pytest.raises(ValueError, match="codes must be"):
        ae.decode(torch.zeros(2, 5))
    torch.manual_seed(0)
    grid = torch.linspace(0, 3.14, 28)
    x = torch.randn(4, 1, 1, 1) * (grid[:, None].sin() * grid[None].cos())  # four smooth images
    model = KNNClassifier(ae, torch.nn.MSELoss(), lambda params: torch.optim.Adam(params, lr=1e-3), 10,
                          autoencoder=True)
    opt = model.configure_optimizers()
    opt = opt["optimizer"] if isinstance(opt, dict) else opt
    y = torch.zeros(4, dtype=torch.long)
    before = model.training_step((x, y), 0).item()
    for _ in range(40):
        opt.zero_grad()
        model.training_step((x, y), 0).backward()
        opt.step()
    assert model.training_step((x, y), 0).item() < 0.5 * before


def test_feature_nets_have_the_papers_sizes():
    net = TwoLayerConvNet()
    assert net.fc[0].in_features == 4 * 4 * 50 and net(torch.zeros(2, 1, 28, 28)).shape == (2, 500)
    assert CifarResNet18()(torch.zeros(2, 3, 32, 32)).shape == (2, 512)
    with pytest.raises(ValueError, match="too small"):
        TwoLayerConvNet((1, 8, 8))
    pca = PCAFeatures((1, 4, 4), n_components=3)
    with pytest.raises(RuntimeError, match="fit"):
        pca(torch.zeros(1, 1, 4, 4))
    x = torch.randn(50, 1, 4, 4)
    pca.fit(x)
    z = pca(x)
    assert z.shape == (50, 3) and torch.allclose(z.mean(0), torch.zeros(3), atol=1e-5)


@real_data("MNIST", "raw")
def test_real_mnist_pixels_baseline_matches_its_published_range(compose_train):
    """kNN (k = 9) on raw pixels of the real MNIST: Grover et al. report 97.2 %; test on the first 1 000
    test images only (limit_test_batches) to stay fast."""
    cfg = compose_train(["experiment=knn/soft_topk_t1/mnist_pixels", f"paths.data_dir={DATA}",
                         "trainer.limit_val_batches=1", "trainer.limit_test_batches=1"], fast=False)
    cfg.trainer.enable_progress_bar = False
    cfg.callbacks = {k: v for k, v in cfg.callbacks.items() if k != "rich_progress_bar"}
    metrics = train(cfg).metrics
    assert 0.95 < metrics["test/top1"] < 0.99


@pytest.mark.slow  # ~8 s each on 2 cores
@pytest.mark.parametrize("name", ["sparse_soft_topk", "dftopk"])
def test_the_sparse_topk_operators_train_the_knn_protocol(compose_train, name):
    """The sparse soft top-k and DFTopK through the deep kNN protocol with ``fast_dev_run``."""
    record = train(compose_train(["model=knn", "data=digits", f"operator={name}", "data.batch_size=60",
                                  "model.num_queries=30", "model.net.padding=2", "trainer.fast_dev_run=true"]))
    metrics = record.metrics
    assert 0 <= metrics["test/top1"] <= 1
