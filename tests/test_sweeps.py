"""Multiruns, launchers, DDP and resume — as subprocesses, the way users run them (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.slow
TINY = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64", "extras.print_config=false",
        "trainer.enable_progress_bar=false"]


def _run(args, tmp_path, timeout=600, env=None):
    flags = [a for a in args if a.startswith("-")]  # Hydra reads flags only before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    out = subprocess.run([sys.executable, "train.py", *flags, f"paths.log_dir={tmp_path}", *TINY, *overrides], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "WANDB_MODE": "offline", **(env or {})})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def _results(tmp_path):
    return [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("results.json"))]


def test_beta_sweep_basic(tmp_path):
    _run(["-m", "operator=softsort", "operator.beta=0.5,2", "trainer.max_epochs=1"], tmp_path)
    res = _results(tmp_path)
    assert sorted(r["config"]["operator"]["beta"] for r in res) == [0.5, 2.0]


def test_operator_sweep_joblib(tmp_path):
    _run(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "operator=neuralsort,softsort",
          "trainer.fast_dev_run=true"], tmp_path)
    assert sorted(r["choices"]["operator"] for r in _results(tmp_path)) == ["neuralsort", "softsort"]


def test_optuna_beta_search(tmp_path):
    _run(["hparams_search=neuralsort_beta_optuna", "hydra.sweeper.n_trials=2",
          "hydra.sweeper.sampler.n_startup_trials=1", "trainer.max_epochs=1"], tmp_path)
    assert len(_results(tmp_path)) == 2
    assert list(tmp_path.rglob("optimization_results.yaml"))


def test_ddp_spawn_two_processes(tmp_path):
    _run(["trainer=ddp_spawn", "trainer.max_epochs=1", "operator=softsort"], tmp_path)
    (res,) = _results(tmp_path)
    assert 0 <= res["metrics"]["test/top1"] <= 1


def test_resume_from_last_checkpoint(tmp_path):
    _run(["trainer.max_epochs=1", "operator=softsort"], tmp_path / "a")
    (ckpt,) = list((tmp_path / "a").rglob("last.ckpt"))
    _run(["trainer.max_epochs=2", "operator=softsort", f"ckpt_path={ckpt}"], tmp_path / "b")
    (last,) = list((tmp_path / "b").rglob("last.ckpt"))  # epoch 1 whether or not it became the best
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 1


def test_wandb_offline_multirun_gives_distinct_runs(tmp_path):
    pytest.importorskip("wandb")
    _run(["-m", "logger=wandb", "operator=neuralsort,softsort", "trainer.fast_dev_run=true"], tmp_path)
    runs = list(tmp_path.rglob("offline-run-*"))
    assert len(runs) == 2, runs


def test_submitit_local_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    _run(["-m", "hydra/launcher=submitit_local", "operator=softsort", "trainer.fast_dev_run=true"], tmp_path)
    assert len(_results(tmp_path)) == 1
