"""Config hygiene: keys nothing reads, strings for numbers, metrics that cannot be computed and splits
that cannot train are refused before a run starts, each naming the key and the fix (a test per command)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from diffrank.experiments.run.train import train
from helpers import CONFIGS, options

SMALL = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64"]




@pytest.mark.parametrize("override, nearest", [("+operater=neuralsort", "did you mean operator=neuralsort?"),
                                               ("+max_epochs=3", "did you mean trainer.max_epochs=3?"),
                                               ("++seeed=1", "did you mean seed=1?")])
def test_unknown_top_level_keys_are_refused_with_the_nearest_key(compose_train, override, nearest):
    """`T +operater=neuralsort` trained the default Sinkhorn and `+max_epochs=3` the default budget."""
    with pytest.raises(ValueError) as e:
        train(compose_train([override, *SMALL]))
    assert override in str(e.value) and nearest in str(e.value) and "nothing reads it" in str(e.value)


def test_keys_the_code_reads_and_groups_may_be_added(compose_train):
    """+resume_with_changes (read without a default) and a group added with + are not refused."""
    from diffrank.experiments.run.composition import check_new_keys, known_top_level_keys

    cfg = compose_train(["+resume_with_changes=true"])
    check_new_keys(cfg, ["+resume_with_changes=true", "+loss=softmax_ce", "+trainer.max_epochs=3"])
    assert {"seed", "operator", "pk", "loss", "trainer", "resume_with_changes"} <= known_top_level_keys()


@pytest.mark.parametrize("override, message", [
    ("model.optimizer.lr=abc", "model.optimizer.lr=abc: torch.optim.Adam takes a number for 'lr'"),
    ("seed=abc", "seed=abc: seed takes an integer (configs/train.yaml: seed: 0)"),
    ("trainer.max_epochs=abc", "trainer.max_epochs=abc: lightning.pytorch.trainer.Trainer takes a number"),
    ("operator.beta=abc", "operator.beta=abc: diffrank.operators.sinkhorn.SinkhornSort takes a number for 'beta'"),
])
def test_strings_for_numbers_name_the_key(compose_train, override, message):
    """`model.optimizer.lr=abc` failed in Adam with "'<=' not supported between 'float' and 'str'", `seed=abc` with
    "invalid literal for int()"; both now name the key as `operator.beta=abc` did."""
    with pytest.raises(ValueError) as e:
        train(compose_train([override, *SMALL]))
    assert message in str(e.value)


def test_a_topk_beyond_the_classes_is_refused(compose_train):
    """`model.topk=[1,200]` with 100 classes trained and dropped top-200 silently."""
    with pytest.raises(ValueError, match=r"model.topk=\[1, 200\]: .* 100 here \(data.num_classes\); \[200\] cannot"):
        train(compose_train(["model.topk=[1,200]", *SMALL]))


def test_a_training_split_smaller_than_a_batch_says_so(compose_train):
    """`data.n_train=50` (batch 64) ran 0 steps and advised a longer trainer.max_epochs."""
    with pytest.raises(ValueError, match=r"training set \(data.n_train: 50 items\) is smaller than one batch "
                                         r"\(data.batch_size=64\)"):
        train(compose_train([*SMALL, "data.n_train=50"]))


def test_an_empty_validation_split_is_refused(compose_train):
    """`data.n_val=0` raised "IndexError: arrays used as indices must be of integer (or boolean) type"."""
    with pytest.raises(ValueError, match=r"data.n_val=0: every split needs at least one pair"):
        train(compose_train([*SMALL, "data.n_val=0"]))



@pytest.mark.parametrize("group, path", [(p.parent.name, p) for group in ("pk", "operator")
                                         for p in sorted((CONFIGS / group).glob("*.yaml"))],
                         ids=lambda v: v.stem if isinstance(v, Path) else v)
def test_every_pk_and_operator_option_builds(group, path):
    """Every option of the ``pk`` and ``operator`` groups is instantiated, not only composed: a P_K whose weights
    do not sum to 1, or an operator setting its class refuses, fails here (composing alone checks neither)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from diffrank.losses.pk import PK
    from diffrank.operators.base import RankingOperator

    built = instantiate(OmegaConf.load(path))
    assert isinstance(built, PK if group == "pk" else RankingOperator), f"{path.name} built {type(built).__name__}"


def _loss_user(name: str) -> list[str]:
    """Overrides of a composition that uses ``configs/loss/<name>.yaml``: the first experiment (or else model) that
    selects it (``override /loss: <name>`` / ``/loss: <name>``), else the default config with ``loss=<name>``."""
    pattern = re.compile(rf"^\s*-\s*(?:override\s+)?/loss:\s*{re.escape(name)}\s*$", re.MULTILINE)
    for group in ("experiment", "model"):
        for option in options(group):
            if pattern.search((CONFIGS / group / f"{option}.yaml").read_text()):
                return [f"{group}={option}"]
    return [f"loss={name}"]


@pytest.mark.parametrize("name", options("loss"))
def test_every_loss_option_builds_where_it_is_used(compose_train, name):
    """Every option of the ``loss`` group is instantiated, not only composed, in a config that uses it (an
    experiment or model that selects it, else the default config with ``loss=<name>``): a loss whose arguments
    its class refuses, or that reads a key its users do not have, fails here."""
    from hydra.utils import instantiate

    cfg = compose_train(_loss_user(name))
    assert cfg.hydra.runtime.choices["loss"] == name
    built = instantiate(cfg.loss)
    assert isinstance(built, torch.nn.Module) or callable(built), f"loss={name} built {type(built).__name__}"
