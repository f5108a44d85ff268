"""Issue 37 (no lost runs, no silent numbers): run identity, folder locks, divergence, interrupted runs, resume
checks, the report's pooling and the cell runner. One test per case of the issue, written from its command
(``T`` = ``python train.py``), on digits100 at a few steps (CPU). The names this issue added are imported inside
the tests, so that the file also runs (and fails case by case) against the code before it."""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import open_dict

from diffrank.experiments.callbacks import AtomicCheckpointIO
from diffrank.experiments.callbacks.hydra_callbacks import SweepSummary
from diffrank.experiments.models.classifier import TopKClassifier
from diffrank.experiments.records import folder as folders
from diffrank.experiments.records.archive import read_archive, write_archive
from diffrank.experiments.records.folder import LAST_CHECKPOINT
from diffrank.experiments.records.paper_rows import collect_runs, table_rows
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
from diffrank.experiments.run.train import run, train
from diffrank.experiments.tools import cells

# 4 steps of 64 per epoch, validation and test on 128 images: a run of an epoch or two takes a few seconds
TINY = ["data.n_train=256", "data.n_val=128", "data.n_test=128", "data.batch_size=64",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "~logger",
        "extras.keep_freed_memory=false", "~callbacks.run_time_estimate", "~callbacks.throughput"]
# the best checkpoint stays at epoch 0 (the loss falls and the monitor is its maximum)
BEST_STAYS = ["optimized_metric=val/loss", "optimized_mode=max"]


def _cfg(compose_train, out: Path, overrides):
    cfg = compose_train([*TINY, *overrides], fast=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
    return cfg


def _rec(**fields) -> RunRecord:
    """A record from its JSON fields (through :meth:`RunRecord.from_dict`, so that it also builds where a field is
    unknown: the code before this issue keeps it in ``extra``)."""
    return RunRecord.from_dict({"schema": 2, **fields})


def _record(folder: Path) -> RunRecord:
    rec = RunRecord.read(folder / RECORD_FILE)
    assert rec is not None, f"no record in {folder}"
    return rec


# --- results lost -----------------------------------------------------------------------------------------------
def test_case1_second_run_into_a_live_folder_is_refused(compose_train, tmp_path):
    """T trainer.max_epochs=2 hydra.run.dir=X, and while it runs T operator=softsort … hydra.run.dir=X: the second
    is refused (the first holds the folder's lock), and the live run's folder is left as it was."""
    live = folders.FolderLock(tmp_path / "x", "the-first-run").acquire()  # the first run, still writing
    try:
        with pytest.raises(folders.FolderBusy, match="the-first-run"):
            run(_cfg(compose_train, tmp_path / "x", ["operator=softsort", "trainer.max_epochs=1"]))
        assert not (tmp_path / "x" / RECORD_FILE).exists()  # no failure record over the live run's folder
    finally:
        live.release()


def test_case2_new_run_into_a_finished_folder_is_refused_unless_it_resumes(compose_train, tmp_path):
    """T operator=softsort … hydra.run.dir=<a finished sinkhorn run>: refused, its results.json and last.ckpt stay
    the sinkhorn run's; resuming that run from its last.ckpt is allowed (same run id)."""
    out = tmp_path / "x"
    train(_cfg(compose_train, out, ["trainer.max_epochs=1"]))
    before = (out / RECORD_FILE).read_text()
    first = _record(out)
    with pytest.raises(FileExistsError, match="holds run .*ckpt_path="):
        run(_cfg(compose_train, out, ["operator=softsort", "trainer.max_epochs=1"]))
    assert (out / RECORD_FILE).read_text() == before
    ckpt = torch.load(out / LAST_CHECKPOINT, map_location="cpu", weights_only=False)
    assert first.run_id and first.config_hash and ckpt["diffrank_run_meta"]["run_id"] == first.run_id
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch_000.ckpt", "last.ckpt"]
    train(_cfg(compose_train, out, ["trainer.max_epochs=2", f"ckpt_path={out / LAST_CHECKPOINT}"]))
    again = _record(out)
    assert again.run_id == first.run_id and again.optimizer_steps == 8 and again.status == "done"


def test_case2_hydra_refuses_before_writing_into_another_runs_folder(tmp_path):
    """The same refusal as a Hydra callback: before Hydra replaces the finished run's .hydra/ files; a resume of
    it (ckpt_path in its folder) and a folder whose run failed without a checkpoint pass."""
    from omegaconf import OmegaConf

    from diffrank.experiments.callbacks.hydra_callbacks import RunFolderGuard

    def config(ckpt=None):
        return OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path)}}, "ckpt_path": ckpt})

    _rec(status="done", run_id="r1").write(tmp_path / RECORD_FILE)
    with pytest.raises(SystemExit, match="holds run r1 .status done"):  # Hydra would turn an Exception into a warning
        RunFolderGuard().on_run_start(config())
    RunFolderGuard().on_run_start(config(str(tmp_path / LAST_CHECKPOINT)))
    _rec(status="failed", run_id="r1").write(tmp_path / RECORD_FILE)
    RunFolderGuard().on_run_start(config())


def test_case3_archive_keeps_an_archived_run_when_its_folder_is_reused(tmp_path):
    """Archive a cell, delete one seed's folder, re-run it with -- model.optimizer.lr=0.05, archive again: both
    records are kept (runs are told apart by their id, not their folder)."""
    folder = tmp_path / "cells" / "seed0"
    _rec(status="done", run_id="a" * 32, run_dir=str(folder), metrics={"test/top1": 0.9428},
         finished_at="2026-01-01T00:00:00").write(folder / RECORD_FILE)
    archive = tmp_path / "cell.jsonl.gz"
    write_archive([tmp_path / "cells"], archive)
    (folder / RECORD_FILE).unlink()
    _rec(status="done", run_id="b" * 32, run_dir=str(folder), metrics={"test/top1": 0.6677},
         overrides=["model.optimizer.lr=0.05"], finished_at="2026-01-02T00:00:00").write(folder / RECORD_FILE)
    assert write_archive([tmp_path / "cells"], archive) == 2
    assert sorted(r.metrics["test/top1"] for _, r in read_archive(archive)) == [0.6677, 0.9428]
    # the same run archived again (a resume rewrote its record) is still stored once: its latest record
    _rec(status="done", run_id="b" * 32, run_dir=str(folder), metrics={"test/top1": 0.7},
         finished_at="2026-01-03T00:00:00").write(folder / RECORD_FILE)
    assert write_archive([tmp_path / "cells"], archive) == 2
    assert sorted(r.metrics["test/top1"] for _, r in read_archive(archive)) == [0.7, 0.9428]


# --- silent wrong or misleading numbers --------------------------------------------------------------------------
def test_case6_resume_with_other_code_is_warned_and_recorded_per_segment(compose_train, tmp_path, caplog):
    """Resuming a checkpoint after checking out other code: a warning names both versions, and the record lists
    one segment per version."""
    a = tmp_path / "a"
    train(_cfg(compose_train, a, ["trainer.max_epochs=1"]))
    last = a / LAST_CHECKPOINT
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert "diffrank_run_meta" in ckpt, "the checkpoint does not say which code wrote it"
    ckpt["diffrank_run_meta"]["segments"][-1].update(git_sha="0123456789abcdef", git_dirty=False)
    torch.save(ckpt, last)
    with caplog.at_level("WARNING"):
        train(_cfg(compose_train, tmp_path / "b", ["trainer.max_epochs=2", f"ckpt_path={last}"]))
    assert "written by code 0123456789" in caplog.text
    rec = _record(tmp_path / "b")
    assert [s["from_step"] for s in rec.segments] == [0, 4]
    assert rec.segments[0]["git_sha"] == "0123456789abcdef" and rec.segments[1]["git_sha"] == rec.git_sha
    assert rec.code.startswith("0123456789+")


def test_case7_exploding_loss_is_recorded_as_diverged(compose_train, tmp_path):
    """T model.optimizer.lr=1e6: the run stops, its record says diverged (not done), a single run exits 3."""
    with pytest.raises(SystemExit) as stopped:
        run(_cfg(compose_train, tmp_path, ["model.optimizer.lr=1e6", "trainer.max_epochs=3"]))
    assert stopped.value.code == 3
    rec = _record(tmp_path)
    assert rec.status == "diverged" and "diverged" in rec.error and rec.optimizer_steps < 12


def test_case7_validation_back_at_chance_is_divergence():
    """The Newton-loss run that diverged in epoch 21 (training loss 0.0 at 10 % on 10 classes): validation at
    chance after it was above is divergence; a run that never left chance is not called diverged."""
    from diffrank.experiments.callbacks import DivergenceGuard

    guard = DivergenceGuard()
    metrics = {}
    trainer = SimpleNamespace(sanity_checking=False, callback_metrics=metrics, datamodule=None, current_epoch=0,
                              world_size=1, should_stop=False, global_step=0)
    module = SimpleNamespace(num_classes=10)
    for acc in (0.11, 0.3, 0.10):  # never learned much (a top-5 run's top-1, say): not a divergence
        metrics["val/top1"] = torch.tensor(acc)
        guard.on_validation_end(trainer, module)
    assert guard.reason is None and not trainer.should_stop
    for acc in (0.6, 0.9, 0.1):
        metrics["val/top1"] = torch.tensor(acc)
        guard.on_validation_end(trainer, module)
    assert trainer.should_stop and "fell to 0.1000" in guard.reason
    nan = DivergenceGuard()
    nan.on_train_batch_end(trainer, module, {"loss": torch.tensor(float("nan"))}, None, 0)
    assert "nan" in nan.reason


def test_case8_resume_that_changes_the_budget_is_refused_or_recorded(compose_train, tmp_path):
    """Resuming with +trainer.accumulate_grad_batches=2: refused; with +resume_with_changes=true the record shows
    each segment's budget (4×64 + 2×128), not 6×128."""
    train(_cfg(compose_train, tmp_path / "a", ["trainer.max_epochs=1"]))
    last = tmp_path / "a" / LAST_CHECKPOINT
    resume = ["trainer.max_epochs=2", f"ckpt_path={last}", "+trainer.accumulate_grad_batches=2"]
    with pytest.raises(ValueError, match="accumulate_grad_batches: 1 → 2"):
        train(_cfg(compose_train, tmp_path / "b", resume))
    train(_cfg(compose_train, tmp_path / "c", [*resume, "+resume_with_changes=true"]))
    rec = _record(tmp_path / "c")
    assert rec.optimizer_steps == 6 and rec.budget == "4×64+2×128"
    assert any("accumulate_grad_batches" in c for c in rec.resumed_with_changes)


def test_case9_moved_run_folder_tests_the_best_checkpoint_beside_ckpt_path(compose_train, tmp_path):
    """Resume from a moved run folder: the best checkpoint (epoch 0) is found beside last.ckpt and tested."""
    train(_cfg(compose_train, tmp_path / "a", [*BEST_STAYS, "trainer.max_epochs=2"]))
    (tmp_path / "a").rename(tmp_path / "moved")
    moved = tmp_path / "moved"
    train(_cfg(compose_train, moved, [*BEST_STAYS, "trainer.max_epochs=3", f"ckpt_path={moved / LAST_CHECKPOINT}"]))
    rec = _record(moved)
    assert rec.checkpoint["path"] == str((moved / "checkpoints" / "epoch_000.ckpt").resolve())
    assert rec.checkpoint["epoch"] == 0 and "best_checkpoint_missing" not in rec.extra


def test_case10_precision_actually_used_is_recorded(compose_train, tmp_path):
    """T trainer.precision=16-mixed on the CPU runs bf16: the record says so, and so does its budget."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU 16-mixed is what runs")
    train(_cfg(compose_train, tmp_path, ["trainer.precision=16-mixed", "trainer.max_epochs=1",
                                         "trainer.limit_train_batches=2"]))
    rec = _record(tmp_path)
    assert rec.budget.endswith(" bf16-mixed"), rec.budget
    assert rec.precision == "bf16-mixed" and rec.segments[-1]["precision"] == "bf16-mixed"


def test_case12_sigterm_and_ctrl_c_record_an_interrupted_run(compose_train, tmp_path, monkeypatch):
    """kill -TERM (and Ctrl-C) during training: status interrupted with the resume command, and the exit status of
    a death by that signal (143, 130): never 0 without a record."""
    original = TopKClassifier.training_step

    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        out = tmp_path / sig.name

        def training_step(self, batch, batch_idx, sig=sig):
            if self.global_step == 5:
                os.kill(os.getpid(), sig)
            return original(self, batch, batch_idx)

        with monkeypatch.context() as m:
            m.setattr(TopKClassifier, "training_step", training_step)
            with pytest.raises(BaseException) as stopped:  # noqa: PT011 - the code before exited 0 (SystemExit)
                run(_cfg(compose_train, out, ["trainer.max_epochs=3"]))
        assert getattr(stopped.value, "exit_code", getattr(stopped.value, "code", None)) == code
        rec = _record(out)
        assert rec.status == "interrupted" and sig.name in rec.error and rec.run_id
        assert f"ckpt_path={out / LAST_CHECKPOINT}" in rec.resume_command
        assert f"hydra.run.dir={out}" in rec.resume_command
        assert signal.getsignal(sig) is not None  # the run's handlers are gone again
    # the Hydra callback ends the process with that status, after the sweep summary
    config = {"hydra": {"mode": None}}
    with pytest.raises(SystemExit) as exited:
        SweepSummary().on_job_end(config, SimpleNamespace(_return_value=stopped.value, status=None))
    assert exited.value.code == 130


def test_case12_interrupted_multirun_job_is_in_the_summary(tmp_path):
    """A multirun whose job was stopped by SIGTERM: the summary lists it as interrupted, the sweep stops (143)."""
    from hydra.core.utils import JobStatus
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    job = tmp_path / "seed=0"
    RunRecord(status="interrupted", error="SIGTERM received", overrides=["seed=0"]).write(job / RECORD_FILE)
    (job / ".hydra").mkdir()
    (job / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    config = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit) as exited:
        SweepSummary(wandb=False).on_job_end(config, SimpleNamespace(
            _return_value=folders.RunInterrupted(signal.SIGTERM, "stopped"), status=JobStatus.FAILED))
    assert exited.value.code == 143
    assert "interrupted" in (tmp_path / "sweep_summary.csv").read_text()


def _done(run_id: str, top1: float, seed: int = 0, overrides=(), sha: str = "a" * 40, finished: str = "1",
          status: str = "done", **config) -> RunRecord:
    paper = {"paper": "petersen_thesis_2022", "table": "7.1", "dataset": "mnist", "model": "fc5_relu_100",
             "method": "Regular", "setting": "optimizer=sgd;epochs=1;model_label=M1"}
    return _rec(status=status, run_id=run_id, paper=paper, metrics={"test/top1": top1}, seed=seed,
                overrides=["experiment=x", f"seed={seed}", *overrides], git_sha=sha, git_dirty=False,
                optimizer_steps=100, global_batch=100, finished_at=finished,
                config={"seed": seed, "model": {"lr": config.get("lr", 0.001)}})


def _lines(records):
    result = collect_runs([(Path(f"/r/{i}/results.json"), r) for i, r in enumerate(records)])
    return [ln for lines in result["tables"].values() for ln in lines if ln["runs"]], result


def test_case15_one_run_per_config_and_seed():
    """Two identical seed-0 runs are one run (the later), not "94.28 ± 0.00, 2 runs"."""
    lines, _ = _lines([_done("a", 0.9428, finished="1"), _done("b", 0.9428, finished="2")])
    assert [(ln["runs"], ln["std"]) for ln in lines] == [(1, None)]
    assert lines[0]["duplicates"] == 1
    lines, _ = _lines([_done("a", 0.9428), _done("b", 0.95, seed=1)])
    assert [ln["runs"] for ln in lines] == [2]


def test_case16_runs_with_other_settings_are_variants_not_the_row():
    """A row run with lr=0.05 is a variant line, not the row; lr 0.01 and 0.001 runs are not pooled."""
    lines, _ = _lines([_done("a", 0.9475), _done("b", 0.7503, overrides=["model.optimizer.lr=0.05"], lr=0.05),
                       _done("c", 0.90, overrides=["model.optimizer.lr=0.01"], lr=0.01),
                       _done("d", 0.91, overrides=["model.optimizer.lr=0.001"], lr=0.001)])
    assert sorted(round(ln["mean"], 2) for ln in lines) == [75.03, 90.0, 91.0, 94.75]  # four lines, none pooled
    by_variant = {ln["variant"]: ln["mean"] for ln in lines}
    assert by_variant == pytest.approx({"": 94.75, "model.optimizer.lr=0.05": 75.03, "model.optimizer.lr=0.01": 90.0,
                                        "model.optimizer.lr=0.001": 91.0})
    header, cells_ = table_rows(lines)
    assert "variant of the row" in header
    # where a run ran, its seed and what has a column of its own do not make a variant
    assert _done("e", 0.9, overrides=["paths.data_dir=/d", "trainer.max_steps=5", "data=digits_sort"]).variant == ""


def test_case17_mixed_code_versions_are_shown_and_archives_not_hidden(tmp_path):
    """`make report` over results/ and outputs/: an archived record is not hidden behind a re-run that reused its
    folder (another run id). Seeds of one cell run by two code versions: the line lists both."""
    from diffrank.experiments.records.archive import find_records

    folder = tmp_path / "outputs" / "seed0"
    archived = _done("a", 0.9428, finished="1")
    archived.run_dir = str(folder)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.jsonl.gz").write_bytes(gzip.compress((json.dumps(archived.to_dict()) + "\n").encode()))
    rerun = _done("b", 0.6677, seed=1, finished="2")
    rerun.run_dir = str(folder)
    rerun.write(folder / RECORD_FILE)
    found = find_records([tmp_path / "results", tmp_path / "outputs"])
    assert sorted(r.to_dict().get("run_id") for _, r in found) == ["a", "b"]
    lines, _ = _lines([_done("a", 0.94, sha="1" * 40), _done("b", 0.95, seed=1, sha="2" * 40)])
    header, rows = table_rows(lines)
    assert rows[0][header.index("code versions")] == "1111111111, 2222222222"
    assert lines[0]["codes"] == ["1111111111", "2222222222"]


def test_diverged_and_interrupted_runs_are_never_pooled():
    lines, result = _lines([_done("a", 0.94), _done("b", 0.01, seed=1, status="diverged"),
                            _done("c", 0.5, seed=2, status="interrupted")])
    assert [ln["runs"] for ln in lines] == [1]
    assert sorted(s for _, s in result["not_done"]) == ["diverged", "interrupted"]


# --- cells ---------------------------------------------------------------------------------------------------------
def test_case13_cells_rerun_with_changed_overrides_is_not_done(tmp_path, capsys, monkeypatch):
    """cells … -- model.optimizer.lr=0.1 after a run without it: the folder's finished run is another job's; it is
    left alone and reported, never counted as already done."""
    (job,) = cells.jobs("e", [0], [], ["model.optimizer.lr=0.1"], tmp_path)
    RunRecord(status="done", overrides=["experiment=e", "seed=0"]).write(job.folder / RECORD_FILE)
    monkeypatch.setattr(cells.Job, "command", lambda self: [sys.executable, "-c", "pass"])  # never trains here
    counts = cells.run_queue([job], slots=1, threads=1, poll_s=0.01)
    assert counts["skipped"] == 0 and counts["other"] == 1 and counts["finished"] == 0
    assert job.label() == "other"
    assert "only here: model.optimizer.lr=0.1" in capsys.readouterr().out
    # the same job resumed earlier (its record's overrides hold ckpt_path=…) is still this job
    RunRecord(status="done", overrides=["experiment=e", "seed=0", "model.optimizer.lr=0.1",
                                        "ckpt_path=/x/last.ckpt"]).write(job.folder / RECORD_FILE)
    assert job.label() == "done"


def test_case14_cells_dry_run_calls_a_live_job_live(tmp_path, capsys):
    (job,) = cells.jobs("e", [0], [], [], tmp_path)
    lock = folders.FolderLock(job.folder, "live-run").acquire()
    try:
        assert job.label() == "live"
        assert cells.run_queue([job], slots=1, threads=1, poll_s=0.01)["live"] == 1
        cells.main(["e", "--out", str(tmp_path), "--dry-run"])
        assert capsys.readouterr().out.splitlines()[-1].startswith("live")
    finally:
        lock.release()
    assert job.label() == "new"


def test_case14_cells_passes_sigterm_to_its_jobs(tmp_path, monkeypatch):
    """kill -TERM on the runner: its job gets the signal (and ends), the runner exits 143."""
    (job,) = cells.jobs("e", [0], [], [], tmp_path)
    child = ("import signal, sys, time, pathlib; d = pathlib.Path(sys.argv[1]); "
             "signal.signal(signal.SIGTERM, lambda *a: ((d / 'got_term').touch(), sys.exit(143))); "
             "(d / 'started').touch(); time.sleep(60)")
    monkeypatch.setattr(cells.Job, "command", lambda self: [sys.executable, "-c", child, str(self.folder)])

    def kill_runner_once_started():
        deadline = time.time() + 30
        while not (job.folder / "started").exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # a runner that ignores it must not kill pytest
    try:
        threading.Thread(target=kill_runner_once_started, daemon=True).start()
        with pytest.raises(SystemExit) as exited:
            cells.run_queue([job], slots=1, threads=1, poll_s=0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exited.value.code == 143 and (job.folder / "got_term").exists()


def test_cells_options_are_checked(tmp_path, capsys):
    """--grid 'pk.weights=[.5,.5]' is one list value; --seeds 0,a and an experiment typo fail at once, named."""
    (job,) = cells.jobs("e", [0], ["pk.weights=[.5,.5]"], [], tmp_path)
    assert job.overrides[1] == "pk.weights=[.5,.5]"
    assert cells.split_values("[.5,.5],[1,0],'a,b'") == ["[.5,.5]", "[1,0]", "'a,b'"]
    with pytest.raises(ValueError, match="unbalanced"):
        cells.split_values("[.5,.5")
    with pytest.raises(SystemExit):
        cells.main(["e", "--seeds", "0,a", "--out", str(tmp_path), "--dry-run"])
    assert "'a' is not one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cells.main(["classification/no_such_experiment", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "does not compose" in err and "no_such_experiment" in err
    assert not (tmp_path / "classification").exists()  # no job started


# --- confusing -----------------------------------------------------------------------------------------------------
def test_unreadable_ckpt_path_says_so(compose_train, tmp_path):
    """A truncated, byte-flipped or non-checkpoint ckpt_path: "not a readable checkpoint" / "not a Lightning
    checkpoint", naming the file."""
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "epoch": 0}, good)
    data = good.read_bytes()
    bad = {"truncated.ckpt": data[: len(data) // 2], "flipped.ckpt": bytes(b ^ 0xFF for b in data[:64]) + data[64:],
           "text.ckpt": b"not a checkpoint\n"}
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match="truncated.ckpt is not a readable checkpoint"):
        train(_cfg(compose_train, tmp_path / "run", ["train=false", f"ckpt_path={tmp_path / 'truncated.ckpt'}"]))
    from diffrank.experiments.callbacks.run_identity import read_checkpoint

    for name in bad:
        with pytest.raises(ValueError, match=f"{name} is not a readable checkpoint"):
            read_checkpoint(tmp_path / name)
    torch.save([1, 2], tmp_path / "list.ckpt")
    with pytest.raises(ValueError, match="list.ckpt is not a Lightning checkpoint"):
        read_checkpoint(tmp_path / "list.ckpt")


def test_disk_full_is_named_in_the_record(compose_train, tmp_path, monkeypatch):
    """A checkpoint write on a full disk (torch: "unexpected pos …", ENOSPC only chained): the error and the failure
    record name ENOSPC and the checkpoint."""
    def full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 64 vs 0") from OSError(
            errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="no space left on device writing checkpoint .*x.ckpt") as e, \
            monkeypatch.context() as m:
        m.setattr(torch, "save", full)
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "x.ckpt")
    assert e.value.errno == errno.ENOSPC and not list(tmp_path.glob(".x.ckpt*"))
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError):
        run(_cfg(compose_train, tmp_path / "run", ["trainer.max_epochs=1"]))
    rec = _record(tmp_path / "run")
    assert rec.status == "failed" and "no space left on device (ENOSPC) writing" in rec.error
    assert "checkpoints" in rec.error
