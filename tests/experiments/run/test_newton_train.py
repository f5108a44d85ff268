"""The newton group end to end: newton=<variant> wraps the run's loss and the record names the choice."""

from __future__ import annotations

import pytest

from diffrank.losses.newton import NewtonLoss, wrap_newton
from helpers import options

SMALL = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64"]


def test_every_newton_option_composes_and_names_its_variant(compose_train):
    assert options("newton") == ["elementwise_hessian", "fisher", "hessian", "none"]
    for opt in options("newton"):
        cfg = compose_train([f"newton={opt}"])
        assert cfg.hydra.runtime.choices["newton"] == opt and cfg.newton.variant == opt
        assert cfg.newton._target_ == f"{wrap_newton.__module__}.{wrap_newton.__name__}"


def test_fast_dev_run_with_fisher_newton_loss(train_built, compose_train):
    cfg = compose_train(["newton=fisher", "newton.tikhonov=1", "operator=softsort", *SMALL])
    record, objects = train_built(cfg)
    metrics = record.metrics
    loss = objects["loss"]
    assert isinstance(loss, NewtonLoss) and loss.variant == "fisher" and loss.tikhonov == 1.0
    assert objects["operator"] is loss.loss.operator  # the record still sees the wrapped loss's operator
    rec = record.to_dict()
    assert rec["choices"]["newton"] == "fisher" and rec["choices"]["operator"] == "softsort"
    assert "newton.tikhonov=1" in rec["overrides"]
    assert 0 <= metrics["test/top1"] <= metrics["test/top5"] <= 1


def test_default_is_no_newton_loss(train_built, compose_train):
    cfg = compose_train(["loss=softmax_ce", *SMALL])
    record, objects = train_built(cfg)
    assert not isinstance(objects["loss"], NewtonLoss)
    assert record.choices["newton"] == "none"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["hessian", "elementwise_hessian"])
def test_fast_dev_run_hessian_variants_on_softmax_ce(train_built, compose_train, variant):
    record, objects = train_built(compose_train([f"newton={variant}", "loss=softmax_ce", *SMALL]))
    assert isinstance(objects["loss"], NewtonLoss) and record.choices["newton"] == variant


def test_fast_dev_run_sorting_with_hessian_newton_loss(train_built, compose_train):
    """The sorting model's loss (d = n) wrapped by the empirical-Hessian Newton loss."""
    record, objects = train_built(compose_train(["model=sorting", "data=digits_sort", "operator=neuralsort",
                                            "newton=hessian"]))
    assert isinstance(objects["loss"], NewtonLoss) and record.choices["newton"] == "hessian"
    assert record.choices["operator"] == "neuralsort"
