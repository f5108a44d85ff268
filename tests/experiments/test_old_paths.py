"""The flat module paths of diffrank.experiments before the layout by concern stay importable for one release, as
aliases that warn (FutureWarning) and re-export the moved module's names."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from conftest import ROOT

MOVED = {"train": "run.train", "record": "records.record", "archive": "records.archive", "report": "analysis.report",
         "sweeps": "analysis.sweep_summary", "list_experiments": "rows.list_experiments",
         "generate_sorting": "rows.sorting", "generate_topk": "rows.topk",
         "generate_classification": "rows.classification", "generate_warcraft": "rows.warcraft",
         "cells": "tools.cells", "throughput": "tools.throughput", "extract_embeddings": "tools.extract_embeddings",
         "convert_embeddings": "tools.convert_embeddings"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_warns_and_reexports(old):
    sys.modules.pop(f"diffrank.experiments.{old}", None)
    with pytest.warns(FutureWarning, match=f"diffrank.experiments.{MOVED[old]}"):
        alias = importlib.import_module(f"diffrank.experiments.{old}")
    new = importlib.import_module(f"diffrank.experiments.{MOVED[old]}")
    names = getattr(new, "__all__", [n for n in vars(new) if not n.startswith("_")])
    assert names and all(getattr(alias, n) is getattr(new, n) for n in names)


def test_sweeps_alias_keeps_the_resolvers():
    sys.modules.pop("diffrank.experiments.sweeps", None)
    with pytest.warns(FutureWarning):
        from diffrank.experiments.sweeps import register_resolvers
    from diffrank.experiments.run.resolvers import register_resolvers as moved
    assert register_resolvers is moved


def test_old_command_line_runs_the_new_one():
    out = subprocess.run([sys.executable, "-m", "diffrank.experiments.list_experiments", "topk/icml2022_t1/*"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "topk/icml2022_t1/" in out.stdout and "FutureWarning" in out.stderr
