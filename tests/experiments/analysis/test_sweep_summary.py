"""diffrank.experiments.analysis.sweep_summary (summary CSV, plot, best configuration), the β grid resolver,
skip-finished, the Optuna resume count of the Hydra callback and the W&B paper rows, on synthetic files (fast; the
real multiruns are in tests/experiments/run/test_sweeps.py)."""

from __future__ import annotations

import csv
import json
import math

import pytest
import yaml
from omegaconf import OmegaConf

from diffrank.experiments.analysis import sweep_summary as sweeps
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.run import resolvers

CAUCHY5 = {"paper": "petersen_thesis_2022", "table": "3.7", "dataset": "mnist4", "method": "Cauchy CDF",
           "network": "odd_even", "n": 5}


def _job(root, num, overrides, metrics=None, status="done", **extra):
    d = root / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if status is not None:
        RunRecord.from_dict({
            "status": status, "metrics": metrics or {}, "overrides": overrides, "wall_time_s": 1.5,
            "optimizer_steps": 10, "world_size": 1, "global_batch": 64,
            "config": {"optimized_metric": "val/em5", "optimized_mode": "max"}, **extra}).write(d / "results.json")
    return d


def _synthetic_sweep(root):
    """2 operators x 3 β x 2 seeds (metric = f(operator, β) + seed offset), one failed job, one unfinished."""
    num = 0
    for op, peak in (("neuralsort", 1.0), ("softsort", 4.0)):
        for beta in (0.5, 1.0, 2.0, 4.0)[:3] if op == "neuralsort" else (1.0, 2.0, 4.0):
            for seed in (0, 1):
                value = 0.8 - 0.1 * abs(math.log2(beta / peak)) + 0.01 * seed + (0.05 if op == "softsort" else 0)
                _job(root, num, [f"operator={op}", f"operator.beta={beta}", f"seed={seed}", "trainer.max_steps=5"],
                     {"val/em5": value, "test/em": value - 0.1})
                num += 1
    _job(root, num, ["operator=softsort", "operator.beta=8.0", "seed=0", "trainer.max_steps=5"], status="failed",
         error="ValueError: boom")
    _job(root, num + 1, ["operator=softsort", "operator.beta=8.0", "seed=1", "trainer.max_steps=5"], status=None)
    return num + 2


def test_beta_grid_is_factor_two_and_checks_its_bounds():
    assert resolvers.beta_grid(0.0625, 16) == [2.0**k for k in range(-4, 5)]
    assert resolvers.beta_grid(1, 1) == [1.0]
    assert resolvers.beta_grid(1, 7) == [1.0, 2.0, 4.0]  # stops below a bound that is not on the grid
    for bad in ((0, 1), (-1, 2), (2, 1), (float("nan"), 1), (1, float("inf")), (1e-30, 1e30)):
        with pytest.raises(ValueError):
            resolvers.beta_grid(*bad)


def test_beta_grid_resolver_gives_a_sweep_list(compose_train):
    cfg = compose_train(["hparams_search=beta_grid", "sweep.beta_min=0.25", "sweep.beta_max=2"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweeper.params["operator.beta"] == "0.25,0.5,1.0,2.0"
    cfg = compose_train(["hparams_search=beta_grid"])
    assert cfg.hydra.sweeper.params["operator.beta"].split(",") == [repr(2.0**k) for k in range(-4, 5)]
    assert OmegaConf.create({"x": "${short_hash:abc}"}).x == OmegaConf.create({"y": "${short_hash:abc}"}).y != \
        OmegaConf.create({"x": "${short_hash:abd}"}).x


def test_summary_csv_plot_and_best(tmp_path):
    n_jobs = _synthetic_sweep(tmp_path)
    out = sweeps.summarize(tmp_path)
    assert out["counts"] == {"done": n_jobs - 2, "failed": 1, "incomplete": 1}
    assert out["keys"] == ["operator", "operator.beta", "seed"] and out["metric"] == "val/em5"
    with open(tmp_path / sweeps.SUMMARY_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == n_jobs and [r["job"] for r in rows] == [str(i) for i in range(n_jobs)]  # natural order
    assert {"status", "operator", "operator.beta", "seed", "val/em5", "test/em", "wall_time_s", "optimizer_steps",
            "world_size", "global_batch", "overrides", "error"} <= set(rows[0])
    assert rows[-2]["status"] == "failed" and rows[-2]["error"] == "ValueError: boom" and rows[-2]["val/em5"] == ""
    assert rows[-1]["status"] == "incomplete" and rows[-1]["operator.beta"] == "8.0"
    assert float(rows[0]["val/em5"]) == pytest.approx(0.8 - 0.1)  # neuralsort, β 0.5, seed 0
    # best = seed mean: softsort at β = 4 (0.85 + 0.005), ahead of neuralsort at β = 1 (0.8 + 0.005)
    best = yaml.safe_load((tmp_path / sweeps.BEST_YAML).read_text())
    assert best["best"]["overrides"] == {"operator": "softsort", "operator.beta": 4.0}
    assert best["best"]["mean"] == pytest.approx(0.855) and best["best"]["n"] == 2
    assert best["best"]["std"] == pytest.approx(0.01 / math.sqrt(2))
    assert best["by"]["operator"]["neuralsort"]["overrides"]["operator.beta"] == 1.0
    assert best["job_counts"] == {"done": 12, "failed": 1, "incomplete": 1}
    png = (tmp_path / sweeps.PLOT_PNG).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary file
    report = sweeps.format_report(out)
    assert "operator=softsort operator.beta=4.0" in report and "best for operator=neuralsort" in report


def test_min_mode_metric_override_and_partial_sweep(tmp_path):
    _job(tmp_path, 0, ["operator.beta=1"], {"val/em5": 0.5, "val/loss": 2.0})
    _job(tmp_path, 1, ["operator.beta=2"], {"val/em5": 0.6, "val/loss": 1.0})
    _job(tmp_path, 2, ["operator.beta=4"], status=None)
    out = sweeps.summarize(tmp_path, metric="val/loss", mode="min", write=False)
    assert out["best"]["best"]["overrides"] == {"operator.beta": 2} and out["files"] == {}
    assert not (tmp_path / sweeps.SUMMARY_CSV).exists()
    with pytest.raises(ValueError, match="mode"):
        sweeps.summarize(tmp_path, mode="up")
    with pytest.raises(FileNotFoundError):
        sweeps.summarize(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sweeps.summarize(empty)["best"] is None and sweeps.plot_png([], [], "val/em5") is None


def test_sweep_report_command_line(tmp_path, capsys):
    _synthetic_sweep(tmp_path)
    (res,) = sweeps.main([str(tmp_path)])
    assert (tmp_path / sweeps.SUMMARY_CSV).exists() and res["best"]["best"]["overrides"]["operator"] == "softsort"
    assert "best val/em5 (max)" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        sweeps.main([str(empty)])


def test_finished_record_needs_same_overrides_done_and_multirun(tmp_path):
    from diffrank.experiments.run.train import finished_record

    cfg = OmegaConf.create({"skip_finished": True, "paths": {"output_dir": str(tmp_path)}, "train": True,
                            "optimized_metric": "val/em5"})
    ov = ["operator.beta=1", "seed=0"]
    assert finished_record(cfg, ov, True) is None  # no results.json
    RunRecord(status="done", overrides=ov, metrics={"val/em5": 0.5}).write(tmp_path / "results.json")
    assert finished_record(cfg, ov, True)["metrics"] == {"val/em5": 0.5}
    assert finished_record(cfg, ov, False) is None  # single runs always train
    assert finished_record(cfg, ["operator.beta=2", "seed=0"], True) is None
    cfg.skip_finished = False
    assert finished_record(cfg, ov, True) is None
    cfg.skip_finished = True
    RunRecord(status="failed", overrides=ov, metrics={"val/em5": 0.5}).write(tmp_path / "results.json")
    assert finished_record(cfg, ov, True) is None
    RunRecord(status="done", overrides=ov, metrics={"val/em": 0.5}).write(tmp_path / "results.json")
    assert finished_record(cfg, ov, True) is None  # the sweeper needs the optimised metric
    (tmp_path / "results.json").write_text('{"status": "done", "overr')  # a torn file (never written by us)
    assert finished_record(cfg, ov, True) is None


def test_finished_record_ignores_the_order_of_the_overrides(tmp_path):
    from diffrank.experiments.run.train import finished_record

    cfg = OmegaConf.create({"skip_finished": True, "paths": {"output_dir": str(tmp_path)}, "train": True,
                            "optimized_metric": "val/em5"})
    RunRecord(status="done", overrides=["seed=0", "operator.beta=1"], metrics={"val/em5": 0.5}).write(
        tmp_path / "results.json")
    assert finished_record(cfg, ["operator.beta=1", "seed=0"], True) is not None


def test_job_folders_are_named_after_the_config():
    """``subdir: ${hydra.job.num}`` put beta=1 of one grid and beta=4 of the next in one folder."""
    a = resolvers.job_dir_name("operator.beta=1,operator=softsort")
    assert a.startswith("operator.beta=1,operator=softsort_") and len(a) == len("operator.beta=1,operator=softsort") + 9
    assert a == resolvers.job_dir_name("operator.beta=1,operator=softsort")  # the same config: the same folder
    assert a != resolvers.job_dir_name("operator.beta=4,operator=softsort")
    long = "experiment=sorting/thesis_t3_5/bitonic_lambda04_n32_b4," + ",".join(f"k{i}=v" for i in range(40))
    name = resolvers.job_dir_name(long)
    assert "/" not in name and len(name) <= 120 + 9 and name != resolvers.job_dir_name(long + "x")
    assert name.split("_")[-2].endswith("=v")  # whole key=value items only: what does not fit is in the hash
    assert resolvers.job_dir_name("").startswith("defaults_")
    OmegaConf.clear_resolver("job_dir")
    resolvers.register_resolvers()
    cfg = OmegaConf.create({"o": "operator.beta=1,operator=softsort", "d": "${job_dir:${o}}"})
    assert cfg.d == a


def test_repeated_multirun_job_resumes_its_own_last_checkpoint(tmp_path, monkeypatch):
    from diffrank.experiments.run.train import _resume_path

    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    cfg = OmegaConf.create({"skip_finished": True, "paths": {"output_dir": str(tmp_path)}, "train": True,
                            "ckpt_path": None})
    assert _resume_path(cfg, True) is None  # no checkpoint yet
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert _resume_path(cfg, True) == str(tmp_path / "checkpoints" / "last.ckpt")
    assert _resume_path(cfg, False) is None  # a single run gets a fresh folder: never resumed by itself
    cfg.skip_finished = False
    assert _resume_path(cfg, True) is None
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert _resume_path(cfg, False) == str(tmp_path / "checkpoints" / "last.ckpt")
    cfg.ckpt_path = "given.ckpt"
    assert _resume_path(cfg, True) is None


def test_a_failed_job_writes_the_summary_of_the_jobs_so_far(tmp_path):
    """Hydra skips on_multirun_end after a failed job, so no summary was written."""
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    from diffrank.experiments.callbacks.hydra_callbacks import SweepSummary

    _job(tmp_path, 0, ["operator.beta=1"], {"val/em5": 0.5})
    _job(tmp_path, 1, ["operator.beta=-1"], status="failed", error="ValueError: beta must be positive")
    cfg = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "sweep": {"dir": str(tmp_path)}}})
    cb = SweepSummary(wandb=False)
    cb.on_job_end(cfg, JobReturn(status=JobStatus.COMPLETED))
    assert not (tmp_path / sweeps.SUMMARY_CSV).exists()  # all well so far: on_multirun_end will write it
    cb.on_job_end(cfg, JobReturn(status=JobStatus.FAILED))
    with open(tmp_path / sweeps.SUMMARY_CSV, newline="") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert rows["0"]["status"] == "done" and rows["1"]["status"] == "failed"
    assert "beta must be positive" in rows["1"]["error"]
    _job(tmp_path, 2, ["operator.beta=2"], {"val/em5": 0.7})
    cb.on_job_end(cfg, JobReturn(status=JobStatus.COMPLETED))  # after the failure: every job refreshes it
    assert yaml.safe_load((tmp_path / sweeps.BEST_YAML).read_text())["best"]["mean"] == 0.7


def test_global_batch_must_divide():
    from diffrank.experiments.run.build import _per_device_batch

    assert _per_device_batch(64, 2) == 32 and _per_device_batch(100, 1) == 100
    with pytest.raises(ValueError, match="global batch"):
        _per_device_batch(100, 3)


def test_optuna_resume_runs_only_the_missing_trials(tmp_path):
    optuna = pytest.importorskip("optuna")
    from diffrank.experiments.callbacks.hydra_callbacks import SweepSummary, optuna_finished_trials

    storage = f"sqlite:///{tmp_path}/optuna.db"
    try:
        study = optuna.create_study(study_name="s", storage=storage)
    except Exception as e:  # optuna 2.10 RDB storage needs SQLAlchemy < 2 (pyproject's sweep extra pins it)
        pytest.skip(f"sqlite storage unusable: {e}")
    assert optuna_finished_trials(storage, "other") == 0
    assert optuna_finished_trials(f"sqlite:///{tmp_path}/none.db", "s") == 0
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    study.ask()  # a trial left running by a killed search: not finished, it will be run again
    assert optuna_finished_trials(storage, "s") == 2
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")},
                                      "sweeper": {"storage": storage, "study_name": "s", "n_trials": 5}}})
    OmegaConf.set_readonly(cfg.hydra, True)
    SweepSummary().on_multirun_start(cfg)
    assert cfg.hydra.sweeper.n_trials == 3 and (tmp_path / "sweep").is_dir()
    cfg2 = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)},
                                       "sweeper": {"storage": storage, "study_name": "s", "n_trials": 1}}})
    SweepSummary().on_multirun_start(cfg2)
    assert cfg2.hydra.sweeper.n_trials == 0


def test_wandb_group_tags_and_paper_rows():
    from diffrank.experiments.callbacks.loggers import paper_comparison, wandb_group, wandb_offline_default, wandb_tags

    assert wandb_group(CAUCHY5, "2026-01-01_00-00-00-000000", "t") == "petersen_thesis_2022 Table 3.7"
    assert wandb_group(None, "sw", "train") == "train/sw" and wandb_group(None, None, "train") == "train"
    cfg = OmegaConf.create({"operator": {"beta": 0.5}, "loss": {"m": 16}})
    tags = wandb_tags(cfg, {"operator": "softsort", "pk": "top1", "data": "digits100"}, ["sweep:x", "sweep:x"])
    assert tags == ["operator:softsort", "pk:top1", "m:16", "beta:0.5", "dataset:digits100", "sweep:x"]
    summary, header, cells = paper_comparison({"paper": CAUCHY5, "metrics": {"test/em": 0.80, "test/ew": 0.90},
                                               "global_step": 100, "global_batch": 20, "optimizer_steps": 100})
    assert summary["paper/EM"] == pytest.approx(84.9) and summary["ours/EM"] == pytest.approx(80.0)
    assert summary["delta/EM"] == pytest.approx(-4.9) and summary["delta/EW"] == pytest.approx(-3.2)
    assert json.loads(summary["paper/row"]) == CAUCHY5
    assert header[:2] == ["reference", "table"] and "Δ" in header and len(cells) == 2
    assert cells[0][header.index("Δ")] == "-4.90" and cells[0][header.index("steps×batch")] == "100×20"
    assert paper_comparison({"paper": None, "metrics": {"test/em": 0.5}}) == ({}, [], [])
    assert wandb_offline_default(True) is True and wandb_offline_default(False) is False


def test_wandb_offline_without_a_key(monkeypatch, tmp_path):
    from diffrank.experiments.callbacks.loggers import wandb_api_key_configured, wandb_offline_default

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert not wandb_api_key_configured() and wandb_offline_default(None) is True
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    (tmp_path / "netrc").chmod(0o600)
    assert wandb_api_key_configured() and wandb_offline_default(None) is False
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_offline_default(None) is False  # W&B follows WANDB_MODE itself
