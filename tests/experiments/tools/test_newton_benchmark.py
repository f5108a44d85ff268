"""``python -m diffrank.experiments.tools.newton_benchmark``: the Newton losses' cost per step (docs/newton.md)."""

from __future__ import annotations

import pytest
import torch

from diffrank.experiments.tools import newton_benchmark as nb
from diffrank.losses.newton import NewtonLoss


def test_the_first_loss_row_times_a_step_of_each_variant():
    """The first row of :func:`~diffrank.experiments.tools.newton_benchmark.cases` (softmax CE, d 10) runs a loss
    step for the plain loss and every Newton variant."""
    torch.manual_seed(0)
    name, loss, make_batch = next(nb.cases())
    batch = make_batch()
    for variant in nb.VARIANTS:
        nb.loss_step(loss if variant == "plain" else NewtonLoss(loss, variant, 0.01), batch)()


def test_command_line_offers_the_suites(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["newton_benchmark", "--help"])
    with pytest.raises(SystemExit) as done:
        nb.main()
    assert done.value.code == 0 and "--suite" in capsys.readouterr().out
