"""Hydra's run-folder guard (RunFolderGuard): the folder's lock it takes is the one the run holds to its end, a
folder the run cannot write is refused in one line, and a single run that fails for a reason outside its config
(a full disk, an unwritable folder) ends in one line, not a traceback. No training: the runner's ``train`` is
replaced by a fake where the run would train."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.core.utils import JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from diffrank.experiments.callbacks.hydra_callbacks import RunFolderGuard
from diffrank.experiments.records import folder as folders
from diffrank.experiments.records.folder import LAST_CHECKPOINT, FolderBusy, FolderLock, is_live
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
from diffrank.experiments.run import train as runner


@pytest.fixture(autouse=True)
def no_hydra_job(monkeypatch):
    """No Hydra job is set (an earlier test's composed config may be left in ``HydraConfig``): the runner reads
    its overrides and mode from there."""
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)


def _hydra_config(folder: Path, ckpt: str | None = None):
    return OmegaConf.create({"hydra": {"run": {"dir": str(folder)}, "mode": RunMode.RUN}, "ckpt_path": ckpt})


def _run_config(folder: Path):
    return OmegaConf.create({"paths": {"output_dir": str(folder)}, "trainer": {}, "extras": {},
                             "optimized_metric": None})


def test_the_guard_lock_is_held_by_the_run_to_its_end(tmp_path, monkeypatch):
    """Two runs into one hydra.run.dir, the second started between the first's guard check and its runner: the
    second passed the guard (the lock was dropped after the check) and Hydra replaced the first run's .hydra/
    files. The guard's lock is now held from the check, handed to the runner, and released at the run's end."""
    folder = tmp_path / "x"
    guard = RunFolderGuard()
    guard.on_run_start(_hydra_config(folder))
    assert is_live(folder)  # between the check and the run: held
    with pytest.raises(FolderBusy):  # what a second run's guard meets (another open of the lock file)
        FolderLock(folder).acquire()
    handed = FolderLock.handed_over(folder)
    seen = {}

    def fake_train(cfg, lock=None):
        seen.update(lock=lock, live=is_live(folder))
        return RunRecord(metrics={"test/top1": 0.5})  # what train() returns where nothing was recorded

    monkeypatch.setattr(runner, "train", fake_train)
    runner.run(_run_config(folder))
    assert seen["lock"] is handed and seen["live"]  # one lock object, from the guard to the end of the run
    assert not is_live(folder) and FolderLock.handed_over(folder) is None
    guard.on_run_end(_hydra_config(folder))  # nothing left to release
    FolderLock(folder).acquire().release()


def test_a_lock_the_run_never_took_is_dropped_at_the_run_end(tmp_path):
    """Hydra calls on_run_end after the job; a lock the runner never took over (the job failed before) is released
    there, and a second check of the same folder in the same process reuses the held lock."""
    guard = RunFolderGuard()
    guard.on_run_start(_hydra_config(tmp_path))
    guard.on_run_start(_hydra_config(tmp_path))  # same process, already holding it: no FolderBusy
    assert is_live(tmp_path)
    guard.on_run_end(_hydra_config(tmp_path))
    assert not is_live(tmp_path) and FolderLock.handed_over(tmp_path) is None


def _read_only(monkeypatch, folder: Path):
    """``chmod -R a-w folder`` as seen by a process without CAP_DAC_OVERRIDE (the tests may run as root, which
    ignores the mode bits): every open for writing and every file created under ``folder`` fails with EACCES."""
    real_open, real_mkstemp = open, folders.tempfile.mkstemp

    def inside(path) -> bool:
        return Path(path).resolve().is_relative_to(folder.resolve())

    def fake_open(path, mode="r", *args, **kwargs):
        if inside(path) and any(c in mode for c in "wax+"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    def fake_mkstemp(*args, dir=None, **kwargs):  # noqa: A002 - mkstemp's own keyword
        if dir is not None and inside(dir):
            raise PermissionError(errno.EACCES, "Permission denied", os.path.join(str(dir), "tmp"))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(folders, "open", fake_open, raising=False)
    monkeypatch.setattr(folders.tempfile, "mkstemp", fake_mkstemp)


@pytest.mark.parametrize("lock_file", [True, False], ids=["lock-file-read-only", "folder-read-only"])
def test_resume_into_a_read_only_run_folder_is_refused_in_one_line(tmp_path, monkeypatch, lock_file):
    """chmod -R a-w on a finished run, then a resume into it (ckpt_path=<it>/checkpoints/last.ckpt): a
    PermissionError in a callback became a warning, then train.log failed and Hydra ended in "ValueError: Unable
    to configure handler 'file'". Now: refused before anything is written, one line naming the folder."""
    folder = tmp_path / "run"
    RunRecord(status="done", run_id="r1").write(folder / RECORD_FILE)
    (folder / LAST_CHECKPOINT).parent.mkdir()
    (folder / LAST_CHECKPOINT).write_bytes(b"x")
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    if not lock_file:  # the lock file writable (left by an earlier run), the folder itself not
        (folder / folders.LOCK_FILE).write_text("")
    def files():  # the lock file, when writable, says who checked
        return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != folders.LOCK_FILE}

    before = files()
    _read_only(monkeypatch, folder if lock_file else folder / ".hydra")
    with pytest.raises(SystemExit) as refused:
        RunFolderGuard().on_run_start(_hydra_config(folder, str(folder / LAST_CHECKPOINT)))
    message = str(refused.value.code)
    assert message.startswith(f"refused: {folder} is not writable (Permission denied") and "\n" not in message
    assert "chmod -R u+w" in message and "resume the copy" in message and "hydra.run.dir=<copy>" in message
    assert not is_live(folder) and FolderLock.handed_over(folder) is None
    assert files() == before
    with pytest.raises(PermissionError, match="is not writable"):  # the runner's own lock says the same
        FolderLock(folder).acquire()


def test_a_single_run_that_fills_the_disk_ends_in_one_line():
    """A single run whose disk filled up (here while writing its record) ends with one line naming the file and
    ENOSPC (status 1), not a traceback ending in a bare OSError; any other failure keeps Hydra's traceback."""
    config = OmegaConf.create({"hydra": {"mode": RunMode.RUN}})
    full = OSError(errno.ENOSPC, "No space left on device (ENOSPC)", "/runs/x/results.json")
    with pytest.raises(SystemExit) as exited:
        RunFolderGuard().on_job_end(config, SimpleNamespace(status=JobStatus.FAILED, _return_value=full))
    assert str(exited.value.code).startswith("error: no space left on device (ENOSPC) writing /runs/x/results.json")
    RunFolderGuard().on_job_end(config, SimpleNamespace(status=JobStatus.FAILED, _return_value=KeyError("x")))
    multirun = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN}})  # a sweep goes on to its other jobs
    RunFolderGuard().on_job_end(multirun, SimpleNamespace(status=JobStatus.FAILED, _return_value=full))


def test_a_run_folder_that_cannot_be_created_is_refused_in_one_line(tmp_path):
    """hydra.run.dir below a file (or under /proc): the guard's lock failed with a bare NotADirectoryError /
    FileNotFoundError (a warning), then Hydra's own mkdir ended in that traceback. Now: one line, before anything."""
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=r"^refused: .*/file/run cannot be created or written \(Not a directory"):
        RunFolderGuard().on_run_start(_hydra_config(tmp_path / "file" / "run"))
    with pytest.raises(SystemExit, match=r"file cannot be created or written \(a file, not a folder\)"):
        RunFolderGuard().on_run_start(_hydra_config(tmp_path / "file"))


def test_a_refused_ckpt_path_ends_a_single_run_in_one_line(tmp_path):
    """ckpt_path=<no such file>, =<a run folder>, or empty: a traceback (an empty path even read as "ckpt_path=.:
    no such checkpoint file"). Now the message alone, naming what to give (status 1)."""
    from diffrank.experiments.callbacks.run_identity import read_checkpoint

    run = tmp_path / "old"
    (run / LAST_CHECKPOINT).parent.mkdir(parents=True)
    (run / LAST_CHECKPOINT).write_bytes(b"x")
    cases = {str(tmp_path / "typo.ckpt"): r"^error: ckpt_path=.*typo.ckpt: no such checkpoint file$",
             str(run): f"^error: ckpt_path={run} is a folder, not a checkpoint file: give "
                       f"ckpt_path={run / LAST_CHECKPOINT}$",
             "": "^error: ckpt_path is empty: give a checkpoint file",
             str(run / LAST_CHECKPOINT): r"^error: ckpt_path=.*last.ckpt is not a readable checkpoint \(1 bytes"}
    config = OmegaConf.create({"hydra": {"mode": RunMode.RUN}})
    for ckpt, message in cases.items():
        with pytest.raises((OSError, ValueError)) as refused:
            read_checkpoint(ckpt)
        with pytest.raises(SystemExit, match=message):
            RunFolderGuard().on_job_end(config, SimpleNamespace(status=JobStatus.FAILED, _return_value=refused.value))


def test_a_sweep_folder_that_cannot_be_created_is_refused_in_one_line(tmp_path):
    """-m hydra.sweep.dir=<below a file>: the sweep callback's mkdir failed (a warning), then Hydra's own mkdir of
    the first job ended in a bare NotADirectoryError traceback. Now one line naming the folder and the flag."""
    from diffrank.experiments.callbacks.hydra_callbacks import SweepSummary

    (tmp_path / "file").write_text("")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "file" / "sweep")}, "overrides": {}}})
    with pytest.raises(SystemExit, match=r"^refused: .*/file/sweep cannot be created or written \(Not a directory.*"
                                         r"hydra\.sweep\.dir=…\)$"):
        SweepSummary(wandb=False).on_multirun_start(config)


def test_the_guard_refuses_before_hydra_writes_into_another_runs_folder(tmp_path):
    """A new run into a finished run's folder is refused as a Hydra callback, before Hydra replaces the finished
    run's .hydra/ files; a resume of it (ckpt_path in its folder) and a folder whose run failed without a
    checkpoint pass."""
    def config(ckpt=None):
        return OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path)}}, "ckpt_path": ckpt})

    RunRecord.from_dict({"schema": 2, "status": "done", "run_id": "r1"}).write(tmp_path / RECORD_FILE)
    with pytest.raises(SystemExit, match="holds run r1 .status done"):  # Hydra would turn an Exception into a warning
        RunFolderGuard().on_run_start(config())
    RunFolderGuard().on_run_start(config(str(tmp_path / LAST_CHECKPOINT)))
    RunRecord.from_dict({"schema": 2, "status": "failed", "run_id": "r1"}).write(tmp_path / RECORD_FILE)
    RunFolderGuard().on_run_start(config())
