"""The cell runner: job folders, skip / resume / start, the queue with slots, a live or another job's folder, its
options, and a SIGTERM passed on to its jobs."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from diffrank.experiments.records.folder import LAST_CHECKPOINT, FolderLock, FolderState, folder_state
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
from diffrank.experiments.tools import cells


def test_jobs_cross_grid_and_seeds(tmp_path):
    q = cells.jobs("sorting/x", [0, 1], ["operator.beta=30,35"], ["paths.data_dir=D"], tmp_path)
    assert [j.folder.relative_to(tmp_path).as_posix() for j in q] == [
        "sorting/x/beta30_seed0", "sorting/x/beta30_seed1", "sorting/x/beta35_seed0", "sorting/x/beta35_seed1"]
    assert q[2].overrides == ["experiment=sorting/x", "operator.beta=35", "seed=0", "paths.data_dir=D"]
    assert cells.jobs("e", [3], [], [], tmp_path)[0].folder == tmp_path / "e" / "seed3"
    with pytest.raises(ValueError, match="key=v1,v2"):
        cells.jobs("e", [0], ["operator.beta"], [], tmp_path)


def test_job_state_and_resume_command(tmp_path):
    (job,) = cells.jobs("e", [0], [], [], tmp_path)
    assert job.state == FolderState("new") and not any("ckpt_path" in c for c in job.command())
    (job.folder / "checkpoints").mkdir(parents=True)
    (job.folder / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert job.state.action == "resume"
    assert job.command()[-1] == f"ckpt_path={(job.folder / 'checkpoints' / 'last.ckpt').resolve()}"
    assert f"hydra.run.dir={job.folder}" in job.command()
    RunRecord(status="failed").write(job.folder / RECORD_FILE)
    assert job.state.action == "resume"
    RunRecord(status="done", overrides=job.overrides).write(job.folder / RECORD_FILE)
    assert job.state.action == "done"


def test_folder_state_is_the_one_decision(tmp_path):
    """done / resume / new of a run folder, for both runners: a finished record (same overrides and the selection
    metric when asked), else a checkpoint to resume from (none to pass when Lightning's SLURM requeue checkpoint
    is there: Lightning resumes from it itself), else new."""
    assert folder_state(tmp_path / "missing") == FolderState("new")
    (tmp_path / "a.torn").mkdir()
    (tmp_path / "a.torn" / RECORD_FILE).write_text('{"status": "done", "overr')  # never written by us
    assert folder_state(tmp_path / "a.torn") == FolderState("new")
    done = RunRecord(status="done", overrides=["seed=1", "operator.beta=2"], metrics={"val/em": 0.5})
    done.write(tmp_path / RECORD_FILE)
    assert folder_state(tmp_path).action == "done" and folder_state(tmp_path).record.metrics == {"val/em": 0.5}
    assert folder_state(tmp_path, ["operator.beta=2", "seed=1"], "val/em").action == "done"
    assert folder_state(tmp_path, ["seed=1"]).action == "new"  # another job's record
    assert folder_state(tmp_path, None, "val/em5").action == "new"  # it did not measure what selects it
    last = tmp_path / LAST_CHECKPOINT
    last.parent.mkdir()
    last.write_bytes(b"x")
    assert folder_state(tmp_path, ["seed=1"]) == FolderState("resume", done, last)
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"x")
    assert folder_state(tmp_path, ["seed=1"]) == FolderState("resume", done, None)
    assert folder_state(tmp_path).action == "done"


def test_queue_skips_finished_and_counts(tmp_path, monkeypatch):
    q = cells.jobs("e", [0, 1, 2], [], [], tmp_path)
    RunRecord(status="done", overrides=q[0].overrides).write(q[0].folder / "results.json")
    fake = ("import sys, pathlib; from diffrank.experiments.records.record import RunRecord; "
            "d = pathlib.Path(sys.argv[1]); RunRecord(status='done' if d.name != 'seed2' else 'failed', "
            "overrides=sys.argv[2:]).write(d / 'results.json')")
    monkeypatch.setattr(cells.Job, "command",
                        lambda self: [sys.executable, "-c", fake, str(self.folder), *self.overrides])
    counts = cells.run_queue(q, slots=2, threads=1, poll_s=0.05)
    assert counts == {"skipped": 1, "live": 0, "other": 0, "finished": 1, "failed": 1}
    assert (q[1].folder / "stdout.log").is_file()


def test_command_line_dry_run(tmp_path, capsys):
    RunRecord(status="done", overrides=["experiment=e", "operator.beta=30", "seed=0", "paths.data_dir=D",
                                        "trainer.max_steps=5"]).write(tmp_path / "e" / "beta30_seed0" / "results.json")
    assert cells.main(["e", "--grid", "operator.beta=30", "--seeds", "0,1", "--out", str(tmp_path), "--dry-run",
                       "--", "paths.data_dir=D", "trainer.max_steps=5"]) == {"jobs": 2}
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("done") and out[1].startswith("new")
    assert out[1].endswith("experiment=e operator.beta=30 seed=1 paths.data_dir=D trainer.max_steps=5")


def test_command_line_queues_several_cells_in_order(tmp_path, capsys):
    assert cells.main(["a", "b", "--seeds", "0,1", "--out", str(tmp_path), "--dry-run", "--", "x=1"]) == {"jobs": 4}
    folders = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert folders == [str(tmp_path / e / f"seed{s}") for e in ("a", "b") for s in (0, 1)]


@pytest.mark.parametrize("argv, message", [
    (["--grid", "seed=1,2"], "seed is set for each job by the runner (--seeds)"),
    (["--grid", "experiment=a,b"], "experiment is set for each job by the runner"),
    (["--grid", "operator.beta=1,2", "--grid", "operator.beta=3"], "operator.beta is already a grid axis"),
    (["--grid", "operator.beta=1,2", "--", "operator.beta=3"], "operator.beta is set for each job (a --grid axis)"),
    (["--", "seed=3"], "seed is set for each job (--seeds)"),
    (["--", "+hydra.run.dir=/x"], "hydra.run.dir is set for each job"),
])
def test_grid_keys_the_jobs_set_again_are_refused(tmp_path, capsys, argv, message):
    """--grid seed=1,2 beside --seeds (or a grid key given again after --) would be overridden in every job: the
    jobs would all run the same; refused, named, before anything runs."""
    with pytest.raises(SystemExit) as exited:
        cells.main(["e", "--seeds", "0", "--out", str(tmp_path), "--dry-run", *argv])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_two_jobs_in_one_folder_are_refused(tmp_path, capsys):
    """--seeds 0,0, a grid value given twice (a path with and without its trailing /) or an experiment named twice:
    refused, naming the duplicate; a path value is one folder name, never folders inside folders."""
    for argv, message in ((["e", "--seeds", "0,0"], "seed 0 is given twice"),
                          (["e", "--grid", "paths.data_dir=/d,/d/"], "two jobs would run in one folder"),
                          (["e", "e", "--seeds", "1"], "two jobs would run in one folder")):
        with pytest.raises(SystemExit) as exited:
            cells.main([*argv, "--out", str(tmp_path), "--dry-run"])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and message in err, err
    assert "'experiment=e paths.data_dir=/d seed=0' and 'experiment=e paths.data_dir=/d/ seed=0'" in str(
        pytest.raises(ValueError, cells.jobs, "e", [0], ["paths.data_dir=/d,/d/"], [], tmp_path).value)
    (job,) = cells.jobs("e", [0], ["paths.data_dir=/work/data"], [], tmp_path)
    assert job.folder == tmp_path / "e" / "data_dirwork_data_seed0"
    nested = [cells.Job(tmp_path / "e" / "seed0", ["a"]), cells.Job(tmp_path / "e" / "seed0" / "x", ["b"])]
    with pytest.raises(ValueError, match="is inside job folder"):
        cells.check_folders(nested)


@pytest.mark.parametrize("flag", ["--slots", "--threads"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_slots_and_threads_below_one_are_refused(tmp_path, capsys, flag, value):
    """--slots 0 would wait forever for a free slot, --threads 0 give OMP_NUM_THREADS=0: argparse refuses both."""
    with pytest.raises(SystemExit) as exited:
        cells.main(["e", "--out", str(tmp_path), "--dry-run", flag, value])
    assert exited.value.code == 2 and f"argument {flag}: at least 1, got {value}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least 1"):
        cells.run_queue(cells.jobs("e", [0], [], [], tmp_path), slots=0, threads=1, poll_s=0.01)


def test_a_failed_job_exits_non_zero_with_its_last_error(tmp_path, capsys, monkeypatch):
    """A job that fails (here: a traceback ending in ValueError, then Hydra's hint) makes the runner exit 1,
    its FAILED line and the summary naming the last error line of its stdout.log."""
    fake = ("import sys; print('Error executing job with overrides: [...]'); print('Traceback (most recent call "
            "last):'); print('  File \"x.py\", line 1'); print('ValueError: lr must be positive, got -1'); print(); "
            "print('Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.'); sys.exit(1)")
    monkeypatch.setattr(cells.Job, "command", lambda self: [sys.executable, "-c", fake])
    monkeypatch.setattr(cells, "check_composes", lambda job: None)
    run_queue = cells.run_queue
    monkeypatch.setattr(cells, "run_queue", lambda *a, **kw: run_queue(*a, poll_s=0.05, **kw))
    with pytest.raises(SystemExit) as exited:
        cells.main(["e", "--seeds", "0", "--slots", "1", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert exited.value.code == 1
    assert "FAILED (rc 1)" in out and out.splitlines()[-2].endswith("ValueError: lr must be positive, got -1")
    assert "0 finished, 1 failed" in out
    assert err.strip() == f"failed: {tmp_path / 'e' / 'seed0' / 'stdout.log'}: ValueError: lr must be positive, got -1"


def test_a_rerun_with_changed_overrides_is_not_counted_as_done(tmp_path, capsys, monkeypatch):
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


def test_dry_run_calls_a_live_job_live(tmp_path, capsys):
    (job,) = cells.jobs("e", [0], [], [], tmp_path)
    lock = FolderLock(job.folder, "live-run").acquire()
    try:
        assert job.label() == "live"
        assert cells.run_queue([job], slots=1, threads=1, poll_s=0.01)["live"] == 1
        cells.main(["e", "--out", str(tmp_path), "--dry-run"])
        assert capsys.readouterr().out.splitlines()[-1].startswith("live")
    finally:
        lock.release()
    assert job.label() == "new"


def test_the_runner_passes_sigterm_to_its_jobs(tmp_path, monkeypatch):
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
