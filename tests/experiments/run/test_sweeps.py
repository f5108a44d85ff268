"""Multiruns, launchers, DDP and resume — as subprocesses, the way users run them (slow).

Also the answers a sweep ends in (summary CSV / plot / best.yaml), skip-finished re-runs, the Optuna sqlite
study that resumes, 1 vs 2 DDP processes with the same global batch, and W&B offline files holding the paper
rows (read back from the binary run file).
"""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys

import pytest
import torch
import yaml

from helpers import ROOT

pytestmark = pytest.mark.slow
TINY = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64", "extras.print_config=false",
        "trainer.enable_progress_bar=false"]


def _run(args, tmp_path, timeout=600, env=None, ok=True, tiny=TINY):
    flags = [a for a in args if a.startswith("-")]  # Hydra reads flags only before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    out = subprocess.run([sys.executable, "train.py", *flags, f"paths.log_dir={tmp_path}", *tiny, *overrides], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", **(env or {})})
    if ok:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def _finished_at(sweep):
    return {p.parent.name: json.loads(p.read_text()).get("finished_at") for p in sweep.glob("*/results.json")}


def _job(sweep, override):
    """The job folder whose results.json holds ``override`` (folders are named after the job's overrides)."""
    (job,) = [p.parent for p in sweep.glob("*/results.json") if override in json.loads(p.read_text())["overrides"]]
    return job


def _wandb_records(path):
    """Records of a W&B offline ``run-*.wandb`` file (LevelDB-log framing: 7-byte file header, 32 KiB blocks,
    7-byte chunk headers crc32 / length / type; a record = one FULL chunk or FIRST, MIDDLE…, LAST)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


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


def test_grid_summary_then_rerun_trains_only_the_missing_job(tmp_path):
    """A 3-job grid ends in sweep_summary.csv (3 rows), sweep.png and best.yaml; a sweep "killed" after its first
    jobs (one results.json deleted) re-run into the same folder trains that job only."""
    sweep = tmp_path / "sweep"
    args = ["-m", "operator=softsort", "operator.beta=0.5,1,2", "trainer.max_epochs=1", f"hydra.sweep.dir={sweep}"]
    _run(args, tmp_path)
    with open(sweep / "sweep_summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((float(r["operator.beta"]), r["status"]) for r in rows) == [(0.5, "done"), (1.0, "done"),
                                                                              (2.0, "done")]
    assert all("operator.beta=" in r["job"] for r in rows)  # folders named after the job's overrides
    assert all(r["val/top1"] and r["test/top1"] and r["wall_time_s"] for r in rows)
    assert (sweep / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    best = yaml.safe_load((sweep / "best.yaml").read_text())
    assert best["metric"] == "val/top1" and best["best"]["mean"] == max(float(r["val/top1"]) for r in rows)
    before = _finished_at(sweep)
    killed = _job(sweep, "operator.beta=1")
    (killed / "results.json").unlink()
    out = _run(args, tmp_path)
    after = _finished_at(sweep)
    trained = sorted(j for j in after if after[j] != before.get(j))
    assert trained == [killed.name], (before, after)
    assert "resuming this job from its own" in out.stdout + out.stderr  # from its last.ckpt, not from scratch
    assert not list(killed.rglob("last-v*.ckpt"))
    assert (out.stdout + out.stderr).count("it already finished") == 2


def test_failed_job_is_recorded_and_retrained(tmp_path):
    """A job that raises leaves results.json with status failed (the sweep stops with an error, Hydra skips
    on_multirun_end); python -m diffrank.experiments.analysis.sweep_summary
    summarises the partial sweep; the fixed re-run trains only that job."""
    sweep = tmp_path / "sweep"
    args = ["-m", "operator=softsort", "trainer.fast_dev_run=true", f"hydra.sweep.dir={sweep}"]
    out = _run([*args, "operator.beta=1,-1"], tmp_path, ok=False)
    assert out.returncode != 0
    rec = json.loads((_job(sweep, "operator.beta=-1") / "results.json").read_text())
    assert rec["status"] == "failed" and "beta" in rec["error"]
    with open(sweep / "sweep_summary.csv", newline="") as f:  # written by the callback after the failed job
        assert sorted(r["status"] for r in csv.DictReader(f)) == ["done", "failed"]
    rep = subprocess.run([sys.executable, "-m", "diffrank.experiments.analysis.sweep_summary", str(sweep)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0 and "1 done, 1 failed" in rep.stdout, rep.stdout + rep.stderr
    assert (sweep / "sweep_summary.csv").exists()


def test_second_grid_into_the_same_sweep_folder_keeps_the_first(tmp_path):
    """A second grid into a used sweep folder overwrote job 0's results and resumed from its
    last.ckpt. Folders are named after the job's config now: beta=2 (in both grids) is skipped, 1 is kept."""
    sweep = tmp_path / "sweep"
    base = ["-m", "operator=softsort", "trainer.max_steps=4", f"hydra.sweep.dir={sweep}"]
    _run([*base, "operator.beta=1,2"], tmp_path)
    first = _finished_at(sweep)
    out = _run([*base, "operator.beta=2,4"], tmp_path)
    after = _finished_at(sweep)
    assert len(after) == 3 and all(after[j] == first[j] for j in first)  # nothing of the first grid rewritten
    assert "it already finished" in out.stdout + out.stderr  # beta=2: the same config, skipped
    for beta in (1, 2, 4):
        job = _job(sweep, f"operator.beta={beta}")
        assert json.loads((job / "results.json").read_text())["config"]["operator"]["beta"] == beta
        assert yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()).count(f"operator.beta={beta}") == 1
        assert not list(job.rglob("last-v*.ckpt"))
    with open(sweep / "sweep_summary.csv", newline="") as f:
        assert sorted(float(r["operator.beta"]) for r in csv.DictReader(f)) == [1.0, 2.0, 4.0]


def test_optuna_sqlite_study_resumes(tmp_path):
    """The study lives in <sweep>/optuna.db; the same command again (n_trials 2 → 3) runs 1 more trial only,
    into a folder of its own."""
    sweep = tmp_path / "sweep"
    args = ["hparams_search=neuralsort_beta_optuna", "hydra.sweeper.sampler.n_startup_trials=1",
            "trainer.fast_dev_run=true", f"hydra.sweep.dir={sweep}"]
    _run([*args, "hydra.sweeper.n_trials=2"], tmp_path)
    assert (sweep / "optuna.db").is_file() and len(_finished_at(sweep)) == 2
    before = _finished_at(sweep)
    out = _run([*args, "hydra.sweeper.n_trials=3"], tmp_path)
    after = _finished_at(sweep)
    assert len(after) == 3 and all(after[j] == before[j] for j in before), (before, after)
    assert "2 finished trials: running 1 more" in out.stdout + out.stderr
    import optuna

    study = optuna.load_study(study_name="neuralsort_beta", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    with open(sweep / "sweep_summary.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 3


# 2 processes x 32 = 1 process x 64. The data order differs (Lightning's distributed sampler reshuffles the
# epoch's indices before splitting them over the ranks), so the runs are not bitwise equal: after 3 epochs on
# digits (57 optimizer steps) test top-1 must agree within 3 points (8 of 270 test images).
DDP_TOLERANCE = 0.03


def test_ddp_spawn_equals_one_process_with_the_same_global_batch(tmp_path):
    common = ["data=digits", "loss.m=null", "pk=top1", "operator=softsort", "trainer.max_epochs=3",
              "data.batch_size=64"]
    tiny = [a for a in TINY if not a.startswith("data.")]  # digits (10 classes): all 1 797 images
    _run([*common, "trainer=default"], tmp_path / "one", tiny=tiny)
    _run([*common, "trainer=ddp_spawn"], tmp_path / "two", tiny=tiny)
    (one,) = _results(tmp_path / "one")
    (two,) = _results(tmp_path / "two")
    assert (one["world_size"], one["per_device_batch"], one["global_batch"]) == (1, 64, 64)
    assert (two["world_size"], two["per_device_batch"], two["global_batch"]) == (2, 32, 64)
    assert one["optimizer_steps"] == two["optimizer_steps"] == 3 * (1257 // 64)  # same steps per epoch
    assert abs(one["metrics"]["test/top1"] - two["metrics"]["test/top1"]) <= DDP_TOLERANCE
    assert two["metrics"]["test/top1"] > 0.5  # both learnt (chance is 0.1)


def test_resume_from_last_checkpoint(tmp_path):
    _run(["trainer.max_epochs=1", "operator=softsort"], tmp_path / "a")
    (ckpt,) = list((tmp_path / "a").rglob("last.ckpt"))
    _run(["trainer.max_epochs=2", "operator=softsort", f"ckpt_path={ckpt}"], tmp_path / "b")
    (last,) = list((tmp_path / "b").rglob("last.ckpt"))  # epoch 1 whether or not it became the best
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 1


def test_wandb_offline_multirun_gives_distinct_runs(tmp_path):
    pytest.importorskip("wandb")
    _run(["-m", "logger=wandb", "operator=neuralsort,softsort", "trainer.fast_dev_run=true"], tmp_path)
    # a job's W&B folder sits in its job folder, named after its overrides (operator=neuralsort_…)
    runs = [p for p in tmp_path.rglob("offline-run-*") if p.parent.parent.name.startswith("operator=")]
    assert len(runs) == 2, runs
    sweep_runs = [p for p in tmp_path.rglob("offline-run-*") if p not in runs]
    assert len(sweep_runs) == 1  # the sweep summary (plot + table), logged by the Hydra callback
    assert list(sweep_runs[0].glob("files/media/images/sweep_plot_*.png"))
    assert list(sweep_runs[0].glob("files/media/table/sweep_summary_*.table.json"))


def test_wandb_offline_files_hold_the_paper_rows(tmp_path):
    """logger=many (CSV + W&B) on a paper row, without an API key and without WANDB_MODE: offline by default;
    the run file holds group = the paper table, the tags, paper/ours/delta summary values and the table."""
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
    out = subprocess.run(
        [sys.executable, "train.py", "experiment=sorting/thesis_t3_3/neuralsort_n5", "data=digits_sort",
         "logger=many", "trainer.fast_dev_run=true", f"paths.log_dir={tmp_path}", "extras.print_config=false",
         "trainer.enable_progress_bar=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**env, "OMP_NUM_THREADS": "1", "NETRC": str(tmp_path / "no_netrc"), "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    (res,) = _results(tmp_path)
    (run_file,) = tmp_path.rglob("offline-run-*/run-*.wandb")
    assert list(tmp_path.rglob("csv/**/hparams.yaml"))  # the CSV half of logger=many (fast_dev_run logs no metrics)
    summary, runs = {}, []
    for rec in _wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "run":
            runs.append(rec.run)
    assert runs[0].run_group == "petersen_thesis_2022 Table 3.3"
    assert {"operator:neuralsort", "beta:1.0", "dataset:digits_sort"} <= set(runs[0].tags)
    assert summary["paper/EM"] == pytest.approx(77.7)
    assert summary["ours/EM"] == pytest.approx(100 * res["metrics"]["test/em"], abs=1e-4)
    assert summary["delta/EM"] == pytest.approx(summary["ours/EM"] - 77.7, abs=1e-4)
    assert {"paper/EW", "ours/EW", "delta/EW"} <= set(summary)
    (table,) = run_file.parent.glob("files/media/table/paper_comparison_*.table.json")
    t = json.loads(table.read_text())
    assert t["columns"][:2] == ["reference", "table"] and "Δ" in t["columns"]
    assert {row[t["columns"].index("metric")] for row in t["data"]} == {"EM", "EM5", "EW"}


def test_submitit_local_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    _run(["-m", "hydra/launcher=submitit_local", "operator=softsort", "trainer.fast_dev_run=true"], tmp_path)
    assert len(_results(tmp_path)) == 1
