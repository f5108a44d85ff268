"""The front door: the commands of the README and docs/sweeps.md as a user types them, from the
checkout and from another working directory, with no override a user would not type. Budgets shrink only through
the documented switch ``DIFFRANK_SMOKE=1`` (docs/experiments.md); outputs go under ``DIFFRANK_ROOT``, or, without
it, under the working directory outside a checkout.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from diffrank.experiments.run import resolvers
from helpers import ROOT


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("DIFFRANK_ROOT", resolvers.SWEPT_KEYS_ENV)}
    return {**env, "DIFFRANK_SMOKE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", **extra}


def _train(args, cwd, timeout=600, entry=None, **env):
    cmd = entry or [sys.executable, str(ROOT / "train.py")]
    out = subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(**env))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    return text


def _sweep(root: Path) -> Path:
    (sweep,) = (root / "outputs" / "train" / "multiruns").iterdir()
    return sweep


def _assert_clean(text):
    """No traceback and no warning: Python's and Lightning's warnings print as ``<file>.py:<line>: <message>``."""
    assert "Traceback" not in text and "Warning" not in text and "HydraConfig was not set" not in text, text[-3000:]
    warned = re.findall(r"^\S+\.py:\d+: .*$", text, flags=re.M)
    assert not warned, warned


def test_beta_grid_as_typed_names_the_swept_key_and_the_best(tmp_path):
    """``python train.py -m operator=sinkhorn pk=half_top5 operator.beta=10,100``: no ``hydra.sweep.dir``, no
    ``paths.*`` override; the summary names the best β; job folders lead with the swept key."""
    text = _train(["-m", "operator=sinkhorn", "pk=half_top5", "operator.beta=10,100"], ROOT,
                  DIFFRANK_ROOT=str(tmp_path))
    _assert_clean(text)
    sweep = _sweep(tmp_path)
    assert "best val/top1 (max)" in text and "with operator.beta=" in text
    best = yaml.safe_load((sweep / "best.yaml").read_text())
    assert str(best).count("operator.beta") >= 1
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert [j.split(",")[0] for j in jobs] == ["operator.beta=10", "operator.beta=100"], jobs
    for job in jobs:
        record = yaml.safe_load((sweep / job / "results.json").read_text())
        assert record["status"] == "done" and record["budget"].startswith("smoke")
        if platform.machine().lower() in ("x86_64", "amd64"):  # pinned before torch: ATen ran its AVX2 kernels
            assert record["compute"]["env"]["ATEN_CPU_CAPABILITY"] == "avx2"
            assert record["compute"]["cpu_capability"] == "AVX2"


def test_installed_entry_point_from_another_folder_seed_sweep(tmp_path):
    """``diffrank-train -m seed=0,1`` started outside the checkout writes under that folder's ``outputs/``."""
    entry = shutil.which("diffrank-train", path=str(Path(sys.executable).parent))
    if entry is None:
        pytest.skip("diffrank-train is not installed in this environment")
    text = _train(["-m", "seed=0,1"], tmp_path, entry=[entry])
    _assert_clean(text)
    sweep = _sweep(tmp_path)
    assert "best val/top1 (max)" in text and "over 2 run(s) with the defaults (only the seed swept)" in text
    assert sorted(p.name.split("_")[0] for p in sweep.iterdir() if p.is_dir()) == ["seed=0", "seed=1"]


def test_optuna_search_as_typed_two_trials(tmp_path):
    """``python train.py -m hparams_search=sinkhorn_beta_optuna``: the smoke budget runs 2 trials; the sqlite
    study lives in the sweep folder; the summary names the best β."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    text = _train(["-m", "hparams_search=sinkhorn_beta_optuna"], ROOT, DIFFRANK_ROOT=str(tmp_path))
    _assert_clean(text)
    sweep = _sweep(tmp_path)
    assert (sweep / "optuna.db").is_file() and "with operator.beta=" in text
    assert len([p for p in sweep.iterdir() if (p / "results.json").is_file()]) == 2


def test_plain_run_prints_no_traceback_or_warning(tmp_path):
    """``python train.py`` (the README's run) under the smoke budget: no RunFolderGuard warning, no traceback."""
    text = _train([], ROOT, DIFFRANK_ROOT=str(tmp_path))
    _assert_clean(text)
    assert "test/top1" in text and list((tmp_path / "outputs" / "train" / "runs").glob("*/results.json"))


def test_hparams_search_beta_grid_as_typed(tmp_path):
    """``python train.py hparams_search=beta_grid``: 9 jobs (β = 2⁻⁴ … 2⁴), the summary names the best β."""
    text = _train(["hparams_search=beta_grid"], ROOT, DIFFRANK_ROOT=str(tmp_path))
    _assert_clean(text)
    sweep = _sweep(tmp_path)
    assert len(list(sweep.glob("*/results.json"))) == 9 and "with operator.beta=" in text


def test_project_root_marker_env_and_fallback(tmp_path, monkeypatch):
    monkeypatch.delenv("DIFFRANK_ROOT", raising=False)
    assert resolvers.project_root(ROOT / "docs") == str(ROOT)  # the checkout, from a subfolder
    assert resolvers.project_root(tmp_path) == str(tmp_path.resolve())  # outside a checkout: the folder itself
    monkeypatch.setenv("DIFFRANK_ROOT", str(tmp_path / "elsewhere"))
    assert resolvers.project_root(ROOT) == str((tmp_path / "elsewhere").resolve())


def test_paths_and_task_name_resolve_without_a_job(tmp_path, monkeypatch):
    """While Hydra makes a sweep folder no ``HydraConfig`` is set: ``hydra.sweep.dir`` (paths.root_dir, an
    experiment's task_name) must resolve from the composed config alone."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setenv("DIFFRANK_ROOT", str(tmp_path))
    resolvers.register_resolvers()
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("train", overrides=["experiment=sorting/thesis_t3_3/neuralsort_n5"],
                          return_hydra_config=True)
        assert not HydraConfig.initialized()
        sweep_dir = str(cfg.hydra.sweep.dir)
        assert sweep_dir.startswith(str(tmp_path / "outputs" / "sorting" / "thesis_t3_3" / "neuralsort_n5"))
    finally:
        GlobalHydra.instance().clear()


def test_swept_keys_lead_the_job_folder_name(monkeypatch):
    from diffrank.experiments.callbacks.hydra_callbacks import swept_keys

    cfg = OmegaConf.create({"hydra": {"overrides": {"task": ["+trainer.limit_test_batches=2", "operator=sinkhorn",
                                                             "operator.beta=10,100", "seed=range(2)"]},
                                      "sweeper": {"params": {"loss.margin": "0.1,0.2"}}}})
    assert swept_keys(cfg) == ["operator.beta", "seed", "loss.margin"]
    monkeypatch.setenv(resolvers.SWEPT_KEYS_ENV, "operator.beta")
    long = "+trainer.limit_test_batches=2,+trainer.limit_train_batches=2,+trainer.limit_val_batches=2," \
           "data.batch_size=64,data.n_test=128,data.n_train=256,data.n_val=128,operator.beta=100,operator=sinkhorn"
    name = resolvers.job_dir_name(long, width=60)
    assert name.startswith("operator.beta=100,+trainer.limit_test_batches=2") and len(name) <= 60 + 9
    assert name.endswith("_" + resolvers.job_dir_name(long).split("_")[-1])  # the hash is of every override
    monkeypatch.setenv(resolvers.SWEPT_KEYS_ENV, "pk.weights")
    assert resolvers.job_dir_name("pk.weights=[1,2],seed=0").startswith("pk.weights=[1,2],seed=0_")


def test_isa_pins_set_only_what_is_unset_on_x86_64():
    from diffrank.experiments.run.isa import ISA_PINS, pin_cpu_isa

    env = {"MKL_CBWR": "COMPATIBLE"}
    assert pin_cpu_isa(env, "x86_64") == {k: v for k, v in ISA_PINS.items() if k != "MKL_CBWR"}
    assert env["MKL_CBWR"] == "COMPATIBLE" and env["ATEN_CPU_CAPABILITY"] == "avx2"  # the user's value wins
    assert pin_cpu_isa(env, "x86_64") == {}  # already pinned
    assert pin_cpu_isa({}, "aarch64") == {} and pin_cpu_isa({"DIFFRANK_NATIVE_ISA": "1"}, "x86_64") == {}
