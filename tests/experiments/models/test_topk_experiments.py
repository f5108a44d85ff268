"""Top-k classification (Petersen et al. 2022, Tables 1-6; LapSum, Struski et al. 2025, Tables 1-2) end to end: the
CIFAR-100 protocol and every table row (generated = committed, paper keys, fast_dev_run on a tiny CIFAR-100 folder in
the official pickle layout), the CIFAR ResNet-18 head and the test-at-best-validation-epoch selection."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from diffrank import reference
from diffrank.experiments.models.classifier import TopKClassifier
from diffrank.experiments.models.nets import CifarResNet18
from diffrank.experiments.rows import topk as gen
from diffrank.experiments.run.train import train
from experiments.data.image_files import write_cifar100
from helpers import CONFIGS, options

TOPK = [e for e in options("experiment") if e.startswith("topk/")]
ROWS = [e for e in TOPK if e.startswith("topk/icml2022_t")]
LAPSUM_ROWS = [e for e in TOPK if e.startswith("topk/lapsum_t")]
CIFAR = ["topk/cifar100", *(e for e in ROWS + LAPSUM_ROWS
                            if e.startswith(("topk/icml2022_t1/", "topk/icml2022_t4/", "topk/lapsum_t1/")))]
IMAGENET = [e for e in ROWS + LAPSUM_ROWS if e not in CIFAR]
# the default suite: a top-k operator row, a baseline-loss row and a LapSum row
SAMPLE = ["topk/icml2022_t1/dsn_uniform5", "topk/icml2022_t1/softmax_ce", "topk/lapsum_t1/lapsum_uniform5"]
IMAGENET_PROTOCOLS = ("topk/imagenet1k", "topk/imagenet21kp", "topk/imagenet1k_effnet_l2")


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar100")
    write_cifar100(root, n_train=96, n_test=24)
    return root


def _small(root) -> list[str]:
    return [f"paths.data_dir={root}", "data.val_size=16", "data.batch_size=8", "data.eval_batch_size=12"]


def test_every_table_cell_has_one_row_and_keys_match_one_reference_row_per_metric():
    assert set(SAMPLE) <= set(ROWS + LAPSUM_ROWS)
    covered = set()
    for name in ROWS:
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        rows = reference.match(OmegaConf.to_container(cfg.paper, resolve=True))
        metrics = [r["metric"] for r in rows]
        assert rows and len(metrics) == len(set(metrics)), name
        assert f"icml2022_t{cfg.paper.table}/" in name, name
        expected = {"1": {"top1", "top5"}, "4": {"top1", "top5"}, "6": {"top1", "top5", "top10", "top20"}}
        assert set(metrics) == expected.get(str(cfg.paper.table), {"top1", "top5"}), name
        op = {r["operator"] for r in rows}
        assert len(op) == 1, name
        op = op.pop()
        if op in ("softmax_ce", "smooth_topk"):
            assert cfg.paper_method is None and {"override /loss": op} in OmegaConf.to_container(cfg.defaults)
        else:
            assert {"override /operator": cfg.paper_method} in OmegaConf.to_container(cfg.defaults), name
            assert cfg.paper_method == {"dsn": "difftopk_bitonic"}.get(op, op), name
        covered.update((r["table"], r["dataset"], r["model"], r["method"], r["pk"], r["metric"]) for r in rows)
    # every published number of Tables 1-6 but Table 5's literature rows belongs to one row
    published = {(r["table"], r["dataset"], r["model"], r["method"], r["pk"], r["metric"])
                 for t in range(1, 7) for r in reference.load_table(f"topk_icml2022_table{t}")
                 if r["method"] != "literature"}
    assert covered == published


def _cell(r: dict[str, str]) -> tuple[str, ...]:
    return tuple(r[c] for c in ("paper", "table", "dataset", "model", "method", "pk", "metric"))


def test_every_lapsum_cell_belongs_to_exactly_one_row():
    """LapSum Tables 1-2: each Lap-Top-k cell is run by one lapsum_t<N> row; each copied baseline cell
    (copy_of=petersen_difftopk_icml2022:<N>) is run by the one icml2022_t<N> row of its original, never by a LapSum
    config; the copies print the originals rounded to two decimals (one known slip, noted in the CSV)."""
    owners: dict[tuple[str, ...], list[str]] = {}
    for name in ROWS + LAPSUM_ROWS:
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        for r in reference.match(OmegaConf.to_container(cfg.paper, resolve=True)):
            owners.setdefault(_cell(r), []).append(name)
    published = [r for t in (1, 2) for r in reference.load_table(f"lapsum_icml2025_table{t}")]
    assert len(published) == 22 + 44
    copies = 0
    for r in published:
        original = reference.copy_source(r)
        if original is None:
            assert r["operator"] == "lapsum"
            assert owners.get(_cell(r), []) == [f"topk/lapsum_t{r['table']}/" + owners[_cell(r)][0].rsplit("/", 1)[1]]
            continue
        copies += 1
        run_by = owners.get(_cell(original), [])
        assert len(run_by) == 1 and run_by[0].startswith(f"topk/icml2022_t{r['table']}/"), (r["method"], run_by)
        assert _cell(r) not in owners  # no config runs the copy itself
        if r["value"] and "rounding slip" not in r["note"]:
            assert float(r["value"]) == round(float(original["value"]), 2), (r["method"], r["metric"])
    assert copies == 18 + 36


def test_lapsum_rows_compose_with_table5_settings(compose_train):
    """Table 5's α (as β = −1/α), batch and epochs reach the composed config; the lr is the ICML protocol's."""
    want = {"topk/lapsum_t1/lapsum_top5": (-1.5, 100, 200, 1e-3),
            "topk/lapsum_t2/in1k_lapsum_half_top5": (-1.5, 500, 100, 10 ** -4.5),
            "topk/lapsum_t2/in21kp_lapsum_top5": (-1.0, 500, 40, 1e-4)}
    for name, (alpha, batch, epochs, lr) in want.items():
        cfg = compose_train([f"experiment={name}"], fast=False)
        assert cfg.hydra.runtime.choices.operator == "lapsum" and cfg.operator.beta == pytest.approx(-1 / alpha)
        assert (cfg.data.batch_size, cfg.trainer.max_epochs) == (batch, epochs), name
        assert cfg.model.optimizer.lr == pytest.approx(lr), name
    for protocol, (batch, epochs) in gen.PROTOCOL_BATCH_EPOCHS.items():
        cfg = compose_train([f"experiment={protocol}"], fast=False)
        assert (cfg.data.batch_size, cfg.trainer.max_epochs) == (batch, epochs), protocol


def test_readme_temperatures():
    def op(name):
        return OmegaConf.load(CONFIGS / "experiment" / f"topk/{name}.yaml").get("operator")

    assert dict(op("icml2022_t1/dsn_top5")) == {"beta": 0.5, "sigmoid": "logistic_phi", "art_lambda": 0.5}
    assert op("icml2022_t4/neuralsort_half_top5").beta == op("icml2022_t1/softsort_uniform5").beta == 0.0625
    assert dict(op("icml2022_t2/in1k_dsn_top5")) == {"beta": 1.0, "sigmoid": "logistic_phi", "art_lambda": 0.5}
    assert op("icml2022_t3/in21kp_softsort_tenth_top5").beta == 0.5
    assert op("icml2022_t6/in21kp_neuralsort_half_top20").beta == 0.5
    assert dict(op("icml2022_t5/effnet_dsn_quarter_top5")) == {"beta": 0.5, "sigmoid": "logistic"}
    assert dict(op("icml2022_t5/in1k_dsn_uniform5")) == {"beta": 1.0, "sigmoid": "logistic_phi", "art_lambda": 0.5}
    t6 = OmegaConf.load(CONFIGS / "experiment" / "topk/icml2022_t6/in21kp_dsn_tenth_top20.yaml")
    assert list(t6.pk.weights) == [0.1, *[0.0] * 18, 0.9]


def test_cifar_resnet18_head_and_features():
    head = CifarResNet18(num_classes=100, maxpool=True)
    assert head(torch.zeros(2, 3, 32, 32)).shape == (2, 100)
    assert not isinstance(head.net.maxpool, torch.nn.Identity) and head.net.fc.out_features == 100
    feats = CifarResNet18()  # the kNN feature net is unchanged: no max-pool, no fc
    assert feats(torch.zeros(2, 3, 32, 32)).shape == (2, 512) and isinstance(feats.net.maxpool, torch.nn.Identity)
    with pytest.raises(ValueError, match="num_classes"):
        CifarResNet18(num_classes=1)


def test_protocol_composes_as_the_code_runs_it(compose_train):
    cfg = compose_train(["experiment=topk/cifar100"], fast=False)
    assert cfg.data.dataset == "cifar100" and cfg.data.batch_size == 128 and cfg.data.val_size == 2500
    assert cfg.data.augment and cfg.trainer.max_epochs == 200 and cfg.trainer.check_val_every_n_epoch == 1
    assert cfg.model.optimizer.lr == 1e-3 and cfg.model.optimizer.weight_decay == 0 and cfg.model.scheduler is None
    assert cfg.loss.m is None and cfg.loss.top1_mode == "eq4" and cfg.model.test_each_epoch
    assert cfg.model.net._target_.endswith("CifarResNet18") and cfg.model.net.maxpool
    assert cfg.optimized_metric == "val/top1"
    base = compose_train(["experiment=topk/icml2022_t1/smooth_topk"], fast=False)
    assert base.loss._target_.endswith("SmoothTopKLoss") and set(base.loss) == {"_target_", "k", "tau"}


def test_protocol_topk_loss_settings_reach_topk_ce_only(compose_train):
    """topk_loss: {m, top1_mode} of a protocol sets loss=topk_ce's m-subset and top-1 term; a baseline row's loss
    gets none of it; the command line's loss.m still wins."""
    cells = {"topk/icml2022_t1/neuralsort_top5": (None, "eq4"),
             "topk/icml2022_t2/in1k_neuralsort_half_top5": (16, "sm"),
             "topk/icml2022_t2/in21kp_neuralsort_half_top5": (50, "sm"),
             "topk/fashion_pairs/lapsum_half_top5": (None, "eq4")}
    for name, (m, mode) in cells.items():
        cfg = compose_train([f"experiment={name}"], fast=False)
        assert (cfg.loss.m, cfg.loss.top1_mode) == (m, mode), name
    assert compose_train(["experiment=topk/icml2022_t1/neuralsort_top5", "loss.m=8"], fast=False).loss.m == 8
    base = compose_train(["experiment=topk/icml2022_t2/in21kp_softmax_ce"], fast=False)
    assert set(base.loss) == {"_target_"} and base.topk_loss.m == 50


def _run(train_built, compose_train, name, root, extra=(), fast=True):
    """``(record, objects)`` of a small run of ``experiment=name`` (``objects``: what the run built)."""
    return train_built(compose_train([f"experiment={name}", *_small(root), *extra], fast=fast))


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in SAMPLE else pytest.mark.slow) for n in CIFAR])
def test_cifar_fast_dev_run(train_built, compose_train, cifar_root, name):
    record, objects = _run(train_built, compose_train, name, cifar_root)
    metrics = record.metrics
    assert 0 <= metrics["test/top1"] <= metrics["test/top5"] <= 1 and "val/top1" in metrics
    rec = record.to_dict()
    assert (rec["paper"] is None) == (name == "topk/cifar100")
    if rec["paper"]:
        assert reference.match(rec["paper"])
    assert isinstance(objects["model"], TopKClassifier) and objects["model"].test_each_epoch


@pytest.mark.slow
def test_test_metrics_come_from_the_best_validation_epoch_per_metric(train_built, compose_train, cifar_root):
    """Three epochs: test/top{k} is the history's entry at the best val/top{k} epoch (ties: the later one), and
    test/top1 equals the tested checkpoint's (the best val/top1 checkpoint, same tie rule)."""
    record, objects = _run(train_built, compose_train, "topk/icml2022_t1/softmax_ce", cifar_root,
                           ["trainer.max_epochs=3", "trainer.num_sanity_val_steps=0", "trainer.limit_train_batches=2",
                            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"], fast=False)
    metrics, model = record.metrics, objects["model"]
    assert len(model.history) == 3
    for k in (1, 5):
        best = max(model.history[::-1], key=lambda h: h[f"val/top{k}"])  # the later one on ties
        assert metrics[f"test/top{k}"] == pytest.approx(best[f"test/top{k}"])
        assert metrics[f"selected_epoch/top{k}"] == best["epoch"]
    assert metrics["test/top1"] == pytest.approx(metrics["test_checkpoint/top1"])


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) for n in IMAGENET])
def test_imagenet_rows_compose(compose_train, name):
    protocol = {"icml2022_t5/effnet_": "topk/imagenet1k_effnet_l2", "/in21kp_": "topk/imagenet21kp"}
    wanted = next((p for frag, p in protocol.items() if frag in name), "topk/imagenet1k")
    if wanted not in TOPK:
        pytest.skip(f"the protocol config {wanted} is not there yet (written beside these rows)")
    cfg = compose_train([f"experiment={name}"], fast=False)
    assert cfg.paper is not None and cfg.hydra.runtime.choices.experiment == name
    if cfg.paper_method:
        assert cfg.hydra.runtime.choices.operator == cfg.paper_method


@pytest.fixture(scope="module")
def embedding_root(tmp_path_factory):
    """Tiny 16-d embedding caches in the three protocols' folders (10 450 classes for 21K-P)."""
    from experiments.data.embedding_files import FOLDERS, write_embedding_cache

    root = tmp_path_factory.mktemp("embeddings")
    for name, folder in FOLDERS.items():
        write_embedding_cache(root / folder, n_train=80, n_test=40, dim=16,
                              num_classes=10450 if name == "imagenet21kp" else 1000)
    return root


IMAGENET_SAMPLE = ["topk/icml2022_t2/in1k_dsn_half_top5", "topk/lapsum_t2/in21kp_lapsum_top5"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in IMAGENET_SAMPLE else pytest.mark.slow)
                                  for n in IMAGENET])
def test_imagenet_fast_dev_run(compose_train, embedding_root, name):
    protocol = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml").defaults[0].lstrip("/")
    if protocol.removeprefix("experiment/") not in TOPK:
        pytest.skip(f"the protocol config {protocol} is not there yet (written beside these rows)")
    record = train(compose_train([f"experiment={name}", f"paths.data_dir={embedding_root}", "data.dim=16",
                                  "data.val_size=20", "data.batch_size=20", "data.eval_batch_size=20"]))
    metrics = record.metrics
    assert 0 <= metrics["test/top1"] <= metrics["test/top5"] <= 1
    if "/in21kp_" in name:
        assert metrics["test/top5"] <= metrics["test/top10"] <= metrics["test/top20"] <= 1
    assert record.paper == OmegaConf.to_container(
        OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml").paper)


def test_imagenet_protocol_names_are_the_rows():
    used = {OmegaConf.load(CONFIGS / "experiment" / f"{n}.yaml").defaults[0].lstrip("/").removeprefix("experiment/")
            for n in IMAGENET}
    assert used == set(IMAGENET_PROTOCOLS)
