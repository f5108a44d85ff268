"""A run records the P_K it trained with: ``pk=half_top5 pk.weights=[…]`` is not recorded (``results.json``'s
``choices``, the W&B tags) as ``half_top5``."""

from __future__ import annotations

import pytest

from diffrank.experiments.callbacks.loggers import wandb_tags
from diffrank.experiments.run.build import build
from diffrank.experiments.run.choices import pk_as_run
from diffrank.experiments.run.process import hydra_job

SMALL = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64"]


@pytest.mark.parametrize(("overrides", "recorded"), [
    (["pk=half_top5"], "half_top5"),
    (["pk=half_top5", "pk.weights=[0.5,0,0,0,0.5]"], "half_top5"),        # the option's own weights
    (["pk=top1", "pk.weights=[1,0,0,0,0]"], "top1"),                      # trailing zeros: the same P_K
    (["pk=half_top5", "pk.weights=[0.25,0,0,0,0.75]"], "quarter_top5"),   # another option's weights
    (["pk=half_top5", "pk.weights=[0.3,0,0,0,0.7]"], "[.3,0,0,0,.7]"),    # no option's: the weights
])
def test_recorded_pk_is_what_ran(compose_train, overrides, recorded):
    cfg = compose_train([*overrides, *SMALL])
    built = build(cfg, hydra_job())
    assert built.choices["pk"] == recorded
    assert built.identity["choices"]["pk"] == recorded   # what a resume compares
    tags = wandb_tags(built.cfg, built.choices)
    assert f"pk:{recorded}" in tags and [t for t in tags if t.startswith("pk:")] == [f"pk:{recorded}"]


def test_row_with_its_own_weights(compose_train):
    """Table 6 rows set ``pk: {weights: …}`` over the default ``pk`` choice: recorded as their weights."""
    cfg = compose_train(["experiment=topk/icml2022_t6/in21kp_softsort_tenth_top20"])
    job = hydra_job()
    assert job.choices["pk"] == "half_top5"
    assert pk_as_run(cfg, job.choices)["pk"] == "[.1" + ",0" * 18 + ",.9]"


def test_runs_without_pk_are_left_alone(compose_train):
    cfg = compose_train(["pk=half_top5"])
    choices = {"operator": "sinkhorn", "pk": None}
    assert pk_as_run(cfg, choices) is choices
    assert pk_as_run(cfg, {"operator": "sinkhorn"}) == {"operator": "sinkhorn"}
