"""The cell runner: job folders, skip / resume / start, and the queue with slots."""

from __future__ import annotations

import sys

import pytest

from diffrank.experiments.records.folder import LAST_CHECKPOINT, FolderState, folder_state
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
