"""The sorting benchmark end to end: the CNNs, the protocols with every full-P operator, every table row
(generated = committed, compose + paper key, fast_dev_run), a row refuses another operator."""

from __future__ import annotations

import statistics

import pytest
import torch
from omegaconf import OmegaConf

from diffrank import reference
from diffrank.experiments.models.sorting import (
    MultiDigitCNN,
    RankingSupervisionModule,
    RowStochasticModule,
    RowStochasticNet,
)
from diffrank.experiments.rows import sorting as sorting_rows
from diffrank.experiments.run.composition import row_newton, row_protocol
from diffrank.experiments.run.train import train
from diffrank.losses.newton import NewtonLoss
from diffrank.losses.resgro import ResgroLoss, kendall_tau_objective
from diffrank.operators import load
from diffrank.registry import config_dir, list_options, load_yaml
from helpers import CONFIGS, options

PROTOCOLS = ["sorting/mnist", "sorting/svhn"]
ROWS = [e for e in options("experiment") if e.startswith("sorting/") and e not in PROTOCOLS]
FULL_P = [n for n in options("operator") if "permutation" in load(n).capabilities]
SMALL = ["data=digits_sort", "data.batch_size=8", "data.val_sets=8", "data.test_sets=8", "data.eval_batch_size=8"]
SMALL_SVHN = ["data.batch_size=4", "data.eval_batch_size=4"]  # + paths.data_dir=<tiny files>
# one per operator family / loss / network / table / dataset, and the extreme n
REPRESENTATIVE = ["sorting/thesis_t3_7/odd_even_cauchy_n5", "sorting/thesis_t3_3/bitonic_art_n4",
                  "sorting/thesis_t3_7/sinkhorn_n3", "sorting/thesis_t3_7/fast_soft_sort_n5",
                  "sorting/lapsum_t4/lapsum_n5", "sorting/thesis_t7_3/softsort_n10",
                  "sorting/thesis_t3_7/bitonic_reciprocal_n32", "sorting/thesis_t3_4/svhn_bitonic_art_n8",
                  "sorting/thesis_t3_5/bitonic_lambda04_n64_b4", "sorting/thesis_t2_1/relaxed_bubble_sort_n5",
                  "sorting/thesis_t7_2/resgro_n5", "sorting/thesis_t7_3/neuralsort_n5_hessian",
                  "sorting/thesis_t7_3/odd_even_cauchy_n10_fisher", "sorting/lapsum_t4/row_stochastic_n3",
                  "sorting/lapsum_t4/sinkhorn_n5", "sorting/lapsum_t4/gumbel_sinkhorn_n3",
                  "sorting/thesis_t3_3/neuralsort_stochastic_n5"]
# LapSum Table 4 has no EM5 column: its rows draw no 5-sets and select on the validation EM at n (authors' code)
T4 = "sorting/lapsum_t4/"
# Table 7.3's Hessian rows of the sorting networks: the fused network has no double backward, so they run the
# network in plain autograd ops (operator.twice_differentiable)
DSN_HESSIAN = [f"sorting/thesis_t7_3/odd_even_{sig}_n{n}_hessian" for sig in ("cauchy", "logistic") for n in (5, 10)]


@pytest.fixture(scope="module")
def svhn_root(tmp_path_factory):
    """Tiny SVHN files in the official format (random pixels, labels = house numbers)."""
    from diffrank.experiments.data.svhn_sort import SVHN_FILES

    root = tmp_path_factory.mktemp("svhn")
    (root / "SVHNMultiDigit").mkdir()
    g = torch.Generator().manual_seed(0)
    for name, size in zip(SVHN_FILES.values(), (300, 100, 100)):
        images = torch.randint(0, 256, (size, 3, 64, 64), generator=g, dtype=torch.uint8)
        torch.save((images, torch.randint(1, 10000, (size,), generator=g)), root / "SVHNMultiDigit" / name)
    return root


def _small(name, svhn_root):
    return [*SMALL_SVHN, f"paths.data_dir={svhn_root}"] if "/svhn_" in name else SMALL


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


def _method_override(cfg) -> dict:
    """The defaults entry that selects a row's method: its operator, or its loss for a row without one (RESGRO,
    LapSum Table 4's vanilla row-stochastic network)."""
    group = "loss" if cfg.paper.get("method") in ("RESGRO", "Vanilla (row-stochastic)") else "operator"
    return {f"override /{group}": cfg.paper_method}


def _metrics(name: str) -> set[str]:
    """The test metrics a row's run logs: EM5 too, except on LapSum Table 4's rows without 5-sets (n < 5; the
    vanilla network, tied to its n, at any n but 5)."""
    n = int(name.rsplit("_n", 1)[1]) if name.startswith(T4) else 5
    five = n == 5 or (n > 5 and "/row_stochastic_" not in name)
    return {"test/em", "test/ew", *(["test/em5"] if five else [])}


def test_row_stochastic_net_maps_a_set_to_rank_by_item_logits():
    net = RowStochasticNet(3, (1, 8, 32))
    m = RowStochasticModule(net, loss=lambda s, v: s.sum(), optimizer=torch.optim.Adam)
    x = torch.rand(2, 3, 1, 8, 32)
    logits = m(x)
    assert logits.shape == (2, 3, 3) and net.cnn.outputs == 3 and len(net.mlp) == 3
    # one net sees the whole set: permuting the items changes every row, not only the columns' order
    assert not torch.allclose(m(x.flip(1)), logits.flip(2))
    with pytest.raises(ValueError, match="n = 3, got n = 4"):
        m(torch.rand(2, 4, 1, 8, 32))
    with pytest.raises(ValueError, match="B, n, C, H, W"):
        m(torch.rand(3, 1, 8, 32))
    with pytest.raises(ValueError, match="n must be >= 2"):
        RowStochasticNet(1)
    values = torch.tensor([[10, 30, 20]])
    m.forward = lambda images: torch.eye(3)[[1, 2, 0]].unsqueeze(0)  # the true order, row by row
    m.log = lambda *a, **k: None
    m._eval_step("val", (torch.zeros(1, 3, 1, 8, 32), values))
    assert m.metrics["val_em"].compute().item() == 1.0 and m.metrics["val_em5"].update_count == 0


def test_rows_are_short_and_carry_their_paper_keys():
    assert set(REPRESENTATIVE) <= set(ROWS) and set(DSN_HESSIAN) <= set(ROWS)
    lengths = [len((CONFIGS / "experiment" / f"{name}.yaml").read_text().splitlines()) for name in ROWS]
    assert statistics.median(lengths) <= 15
    for name in ROWS:
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        rows = reference.match(OmegaConf.to_container(cfg.paper, resolve=True))
        metrics = [r["metric"] for r in rows]
        assert rows and len(metrics) == len(set(metrics)), name  # one reference row per metric
        assert cfg.data.n == int(cfg.paper.n), name
        assert _method_override(cfg) in OmegaConf.to_container(cfg.defaults), name


def test_every_cell_of_tables_7_2_and_7_3_has_exactly_one_row():
    """Each published number of Tables 7.2 / 7.3 belongs to one row, whose operator, Newton loss and n are the
    cell's."""
    newton = {"Regular": "none", "NL (Hessian)": "hessian", "NL (Fisher)": "fisher", "RESGRO": "none"}
    operator = {"dsn": "diffsort_odd_even", "neuralsort": "neuralsort", "softsort": "softsort", "resgro": "resgro"}
    covered = []
    for name in (r for r in ROWS if r.startswith(("sorting/thesis_t7_2/", "sorting/thesis_t7_3/"))):
        cfg = OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")
        rows = reference.match(OmegaConf.to_container(cfg.paper, resolve=True))
        assert sorted(r["metric"] for r in rows) == ["EM", "EW"], name
        for r in rows:
            assert row_newton(name) == newton[r["method"]] and cfg.paper_method == operator[r["operator"]], name
            # a row writes the sigmoid only where it differs from the operator config's (cauchy)
            sigmoid = OmegaConf.select(cfg, "operator.sigmoid", default="cauchy")
            assert cfg.data.n == int(r["n"]) and (not r["sigmoid"] or sigmoid == r["sigmoid"]), name
            covered.append(tuple(r[c] for c in reference.COLUMNS))
    published = [tuple(r[c] for c in reference.COLUMNS)
                 for r in reference.load_table("sorting_thesis_tables7_2_7_3_newton")]
    assert sorted(covered) == sorted(published)


def _cells(rows) -> list[tuple]:
    return sorted(tuple(r[c] for c in reference.COLUMNS) for r in rows)


def test_every_cell_of_lapsum_table_4_and_the_stochastic_neuralsort_rows_has_one_row():
    """The generator's listing (not a count) against the reference CSVs: each published cell of LapSum Table 4
    and each Stoch. NeuralSort cell of thesis Tables 2.1 / 3.3 is matched by exactly one generated row, whose
    method (operator, or the vanilla net's loss) and n are the cell's."""
    method = {"row_stochastic": "sort_rows_ce"}
    covered = {"4": [], "2.1": [], "3.3": []}
    for row in sorting_rows.rows():
        table = row.keys["paper"]["table"]
        if table not in covered or (table != "4" and row.keys["paper"].get("method") != "Stoch. NeuralSort"):
            continue
        cells = reference.match(row.keys["paper"])
        assert cells, row.name
        for r in cells:
            assert row.keys["paper_method"] == method.get(r["operator"], r["operator"]), row.name
            assert row.keys["data"]["n"] == int(r["n"]), row.name
        covered[table] += cells
    assert _cells(covered["4"]) == _cells(reference.load_table("lapsum_icml2025_table4"))
    for table, csv in (("2.1", "sorting_thesis_table2_1"), ("3.3", "sorting_thesis_table3_3")):
        published = [r for r in reference.load_table(csv) if r["method"] == "Stoch. NeuralSort"]
        assert published and _cells(covered[table]) == _cells(published), table


@pytest.mark.parametrize("names", [
    pytest.param(REPRESENTATIVE, id="representative"),
    pytest.param(ROWS, id="all", marks=pytest.mark.slow)])
def test_rows_compose(compose_train, names):
    for name in names:
        cfg = compose_train([f"experiment={name}"], fast=False)
        assert cfg.optimized_metric == ("val/em" if name.startswith(T4) else "val/em5"), name
        assert cfg.trainer.max_steps >= 1e4
        choices = cfg.hydra.runtime.choices
        assert (choices.operator or choices.loss) == cfg.paper_method and cfg.task_name == name
        assert choices.newton == row_newton(name), name


@pytest.mark.parametrize("operator", FULL_P)
def test_protocol_runs_with_every_full_p_operator(compose_train, operator):
    """experiment=sorting/mnist is the protocol without operator parameters: any full-P operator runs in it."""
    record = train(compose_train(["experiment=sorting/mnist", f"operator={operator}", "data.n=4", *SMALL]))
    metrics = record.metrics
    assert {"test/em", "test/ew", "test/em5", "val/em5"} <= set(metrics)
    rec = record.to_dict()
    assert rec["paper"] is None and rec["variant_of"] is None and rec["choices"]["operator"] == operator
    assert "pk" not in rec["choices"] and rec["config"]["pk"] is None  # a sorting run reads no P_K


def test_protocol_with_soft_rank_loss(train_built, compose_train):
    record, objects = train_built(compose_train(["experiment=sorting/mnist", "operator=fast_soft_sort",
                                            "loss=sort_rank_mse", *SMALL]))
    metrics = record.metrics
    assert {"test/em", "test/em5"} <= set(metrics)
    assert type(objects["loss"]).__name__ == "SoftRankMSELoss" and objects["operator"] is objects["loss"].operator


def test_protocol_without_permutation_names_the_loss(compose_train):
    with pytest.raises(ValueError, match="provides 'permutation'"):
        train(compose_train(["experiment=sorting/mnist", "operator=fast_soft_sort", *SMALL]))


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_fast_dev_run_representative(train_built, compose_train, svhn_root, name):
    record, objects = train_built(compose_train([f"experiment={name}", *_small(name, svhn_root)]))
    metrics = record.metrics
    assert _metrics(name) <= set(metrics)
    assert all(0 <= metrics[k] <= 1 for k in _metrics(name))
    rec = record.to_dict()
    assert rec["paper"]["n"] == objects["datamodule"].n and rec["variant_of"] is None
    assert rec["task_name"] == name and "pk" not in rec["choices"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [e for e in ROWS if e not in REPRESENTATIVE and e not in DSN_HESSIAN])
def test_fast_dev_run_all(compose_train, svhn_root, name):
    metrics = train(compose_train([f"experiment={name}", *_small(name, svhn_root)])).metrics
    assert _metrics(name) <= set(metrics)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == DSN_HESSIAN[0] else pytest.mark.slow)
                                  for n in DSN_HESSIAN])
def test_hessian_rows_of_sorting_networks_run_the_twice_differentiable_network(train_built, compose_train, name):
    record, objects = train_built(compose_train([f"experiment={name}", *SMALL]))
    metrics = record.metrics
    loss = objects["loss"]
    assert isinstance(loss, NewtonLoss) and loss.variant == "hessian" and loss.operator.twice_differentiable
    assert {"test/em", "test/ew"} <= set(metrics)
    # the fused network's double backward is exact too: the same row trains with it
    fused = train(compose_train([f"experiment={name}", "operator.twice_differentiable=false", *SMALL])).metrics
    assert {"test/em", "test/ew"} <= set(fused)


def test_newton_and_resgro_rows_train_what_they_name(train_built, compose_train):
    record, objects = train_built(compose_train(["experiment=sorting/thesis_t7_3/softsort_n5_fisher", *SMALL]))
    loss = objects["loss"]
    assert isinstance(loss, NewtonLoss) and loss.variant == "fisher" and type(loss.operator).__name__ == "SoftSort"
    assert record.choices["newton"] == "fisher"
    record, objects = train_built(compose_train(["experiment=sorting/thesis_t7_2/resgro_n10", *SMALL]))
    assert isinstance(objects["loss"], ResgroLoss) and objects["loss"].objective is kendall_tau_objective
    rec = record.to_dict()
    assert rec["choices"]["loss"] == "resgro" and rec["choices"].get("operator") is None and rec["paper"]["n"] == 10
    with pytest.raises(ValueError, match=r"row for loss=resgro.*operator=neuralsort"):
        train(compose_train(["experiment=sorting/thesis_t7_2/resgro_n5", "operator=neuralsort", *SMALL]))
    with pytest.raises(ValueError, match=r"row for newton=fisher: with newton=hessian"):
        train(compose_train(["experiment=sorting/thesis_t7_3/softsort_n5_fisher", "newton=hessian", *SMALL]))
    with pytest.raises(ValueError, match=r"row for newton=none: with newton=fisher"):
        train(compose_train(["experiment=sorting/thesis_t7_3/softsort_n5", "newton=fisher", *SMALL]))


def test_row_with_another_operator_is_refused(train_built, compose_train):
    """A row runs its own method: with another operator Hydra would merge the row's β / sigmoid into it, so the
    runner refuses before building anything and names the row's protocol, which runs that operator as asked."""
    row = "sorting/thesis_t3_7/odd_even_cauchy_n5"
    record, own = train_built(compose_train([f"experiment={row}", *SMALL]))
    assert own["operator"].beta == pytest.approx(51 * torch.pi) and record.paper["method"] == "Cauchy CDF"
    with pytest.raises(ValueError, match=r"row for operator=diffsort_odd_even.*Run experiment=sorting/mnist "
                                         r"operator=neuralsort"):
        train(compose_train([f"experiment={row}", "operator=neuralsort", *SMALL]))
    record, objects = train_built(compose_train(["experiment=sorting/mnist", "operator=lapsum", "operator.beta=2",
                                                 *SMALL]))
    assert type(objects["operator"]).__name__ == "LapSum" and objects["operator"].beta == 2.0
    assert record.paper is None


def test_every_row_names_a_protocol():
    """The refusal's advice exists for every row: each row's defaults start from a protocol that composes."""
    rows = [n for n in list_options("experiment", "*/*/*") if load_yaml("experiment", n).get("paper_method")]
    assert rows
    for name in rows:
        protocol = row_protocol(name)
        assert protocol and (config_dir() / "experiment" / f"{protocol}.yaml").is_file(), name


def test_short_training_learns_to_rank_digits(compose_train):
    """A few hundred steps on real digits beat chance (EW of random order is 1/n) by far."""
    cfg = compose_train(["experiment=sorting/thesis_t3_7/odd_even_cauchy_n5", "data=digits_sort", "data.n=3",
                         "data.batch_size=16", "data.val_sets=50", "data.test_sets=100", "trainer.max_steps=80",
                         "trainer.val_check_interval=40", "model.optimizer.lr=0.002", "callbacks=none",
                         "operator.beta=45.6"], fast=False)
    cfg.trainer.enable_progress_bar = False
    cfg.trainer.enable_model_summary = False
    metrics = train(cfg).metrics
    assert metrics["test/ew"] > 0.6 and metrics["test/em"] > 0.3


def test_table_3_5_beta_sweep_matches_each_cell(compose_train):
    """The paper key interpolates β, so every job of the β sweep matches its own published cell."""
    from omegaconf import OmegaConf

    for beta, value in (("30", "75.88"), ("32.5", "75.59"), ("40", "74.67")):
        cfg = compose_train(["experiment=sorting/thesis_t3_5/bitonic_lambda04_n64_b4", f"operator.beta={beta}"],
                            fast=False)
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
