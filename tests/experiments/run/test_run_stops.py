"""How a training run stops when something outside it stops it: signals (SIGTERM, SIGINT, SIGHUP, a second signal
while stopping), a full disk, a checkpoint cut short. Each ends with a record that says so and how to resume, the
exit status of the signal, and one clear line. The runner's ``train`` is replaced by a fake where the run would
train (the code around it is the real one), except in the one end-to-end run of ``python train.py`` and the short
digits100 runs (a few steps, CPU) that a signal or a full disk stops while they train."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from diffrank.experiments.callbacks.hydra_callbacks import RunInterrupted
from diffrank.experiments.callbacks.loggers import finish_wandb
from diffrank.experiments.records.folder import LAST_CHECKPOINT, folder_state, is_live
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
from diffrank.experiments.run import stops
from diffrank.experiments.run import train as runner
from helpers import ROOT


@pytest.fixture(autouse=True)
def no_hydra_job(monkeypatch):
    """No Hydra job is set (an earlier test's composed config may be left in ``HydraConfig``): the runner reads
    its overrides and mode from there."""
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)


def _cfg(folder: Path):
    return OmegaConf.create({"paths": {"output_dir": str(folder)}, "trainer": {}, "extras": {},
                             "optimized_metric": None})


def _record(folder: Path) -> RunRecord:
    rec = RunRecord.read(folder / RECORD_FILE)
    assert rec is not None, f"no record in {folder}"
    return rec


class _Unhandled(Exception):
    """A signal that reached the test's own handler: the run did not handle it."""


@pytest.fixture
def no_default_kill():
    """While a test runs, SIGHUP / SIGTERM / SIGINT that the run does not handle raise :class:`_Unhandled` instead of
    killing (or interrupting) pytest."""
    def unhandled(signum, frame):
        raise _Unhandled(signal.Signals(signum).name)

    old = {s: signal.signal(s, unhandled) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in old.items():
        signal.signal(s, handler)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_while_stopping_keeps_the_exit_status_and_the_record(tmp_path, monkeypatch, sig, code,
                                                                            no_default_kill):
    """Two SIGTERMs (or Ctrl-C twice) mid-epoch: the second landed in the clean-up (Lightning's teardown, the W&B
    import of the finish step), replaced the first, and the half-imported wandb module failed on the way out:
    status 1 and "AttributeError: partially initialized module 'wandb'". Now the second is ignored (reported),
    the clean-up completes, and the run exits 143 / 130 with its interrupted record."""
    cleaned = []

    def fake_train(cfg, lock=None):
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # not reached: the first signal stops the run
        finally:
            os.kill(os.getpid(), sig)  # the second, during the clean-up
            cleaned.append(True)

    monkeypatch.setattr(runner, "train", fake_train)
    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))  # an import cut short: no attributes
    with pytest.raises(RunInterrupted) as stopped:
        runner.run(_cfg(tmp_path))
    assert stopped.value.exit_code == code and cleaned == [True]
    rec = _record(tmp_path)
    assert rec.status == "interrupted" and rec.error == f"{sig.name} received" and rec.resume_command
    assert not is_live(tmp_path)


def test_the_finish_step_never_imports_wandb(monkeypatch):
    """A run that never used W&B does not import it on the way out (the import is slow, and a signal during it
    leaves a half-initialised module); an open W&B run is still finished."""
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.setattr("builtins.__import__", _no_wandb_import(__import__))
    finish_wandb()
    finished = []
    fake = types.SimpleNamespace(run=object(), finish=lambda: finished.append(True))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    finish_wandb()
    assert finished == [True]


def _no_wandb_import(real):
    def guarded(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise AssertionError("wandb imported")
        return real(name, *args, **kwargs)

    return guarded


def test_sighup_stops_a_run_like_sigterm(tmp_path, monkeypatch, no_default_kill):
    """kill -HUP (a closed terminal or ssh session) killed the run with no record and no message. It is handled
    like SIGTERM: status interrupted with the resume command, exit status 129."""
    def fake_train(cfg, lock=None):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)

    monkeypatch.setattr(runner, "train", fake_train)
    with pytest.raises(RunInterrupted) as stopped:
        runner.run(_cfg(tmp_path))
    assert stopped.value.exit_code == 129
    rec = _record(tmp_path)
    assert rec.status == "interrupted" and rec.error == "SIGHUP received"


def test_a_signal_the_process_ignores_stays_ignored(tmp_path, monkeypatch):
    """Under nohup (SIGHUP ignored) a closed terminal does not stop the run."""
    seen = {}
    monkeypatch.setattr(runner, "train", lambda cfg, lock=None: (seen.update(
        hup=signal.getsignal(signal.SIGHUP), term=signal.getsignal(signal.SIGTERM)), RunRecord())[1])
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        runner.run(_cfg(tmp_path))
    finally:
        signal.signal(signal.SIGHUP, old)
    assert seen["hup"] is signal.SIG_IGN and callable(seen["term"])


def test_stopped_while_writing_the_first_last_ckpt_resumes_from_the_newest_checkpoint(tmp_path, monkeypatch,
                                                                                    no_default_kill):
    """SIGTERM the instant the first last.ckpt's temporary file appears: the temporary file is removed and
    epoch_000.ckpt (complete) stays, but the record said to start over in a new folder. It resumes from the newest
    complete checkpoint, in the same folder."""
    ckpts = tmp_path / LAST_CHECKPOINT.parent

    def fake_train(cfg, lock=None):
        ckpts.mkdir(parents=True)
        (ckpts / "epoch_000.ckpt").write_bytes(b"best")
        os.utime(ckpts / "epoch_000.ckpt", (1, 1))
        (ckpts / "epoch_001.ckpt").write_bytes(b"newer")
        tmp = ckpts / f".last.ckpt.{os.getpid()}.tmp"
        tmp.write_bytes(b"half")
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            tmp.unlink()  # AtomicCheckpointIO removes its temporary file

    monkeypatch.setattr(runner, "train", fake_train)
    with pytest.raises(RunInterrupted):
        runner.run(_cfg(tmp_path))
    command = _record(tmp_path).resume_command
    assert f"ckpt_path={ckpts / 'epoch_001.ckpt'}" in command and f"hydra.run.dir={tmp_path}" in command
    assert folder_state(tmp_path).checkpoint == ckpts / "epoch_001.ckpt"  # the cell launcher resumes it too
    (ckpts / "last.ckpt").write_bytes(b"last")
    assert f"ckpt_path={tmp_path / LAST_CHECKPOINT}" in stops.resume_command(_cfg(tmp_path))


class _FullDiskStream:
    """The stream of a log file on a full disk: every write and flush fails with ENOSPC."""

    def write(self, *args):
        raise OSError(errno.ENOSPC, "No space left on device")

    flush = write

    def close(self):
        pass


def test_a_full_disk_while_testing_names_the_file_without_a_cascade(tmp_path, monkeypatch, capsys, caplog):
    """The disk fills up during the test phase: the record's write failed with a bare "OSError: [Errno 28] No space
    left on device", the failure record could not be written either, and every later log line printed a "Logging
    error" traceback (train.log is on the same disk). Now the error names results.json and ENOSPC, the log file on
    that disk is closed first, and one line says how to resume."""
    log_file = tmp_path / "train.log"
    handler = logging.FileHandler(log_file, delay=True)
    handler.stream = _FullDiskStream()
    logging.getLogger().addHandler(handler)

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def fake_train(cfg, lock=None):
        (tmp_path / LAST_CHECKPOINT).parent.mkdir()
        (tmp_path / LAST_CHECKPOINT).write_bytes(b"x")
        monkeypatch.setattr(Path, "write_text", full)  # the disk is full from here on
        RunRecord(status="done").write(tmp_path / RECORD_FILE)

    monkeypatch.setattr(runner, "train", fake_train)
    try:
        with caplog.at_level(logging.INFO), pytest.raises(OSError) as failed:
            runner.run(_cfg(tmp_path))
    finally:
        logging.getLogger().removeHandler(handler)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(tmp_path / RECORD_FILE)
    assert "No space left on device (ENOSPC)" in str(failed.value)
    assert "Logging error" not in capsys.readouterr().err
    assert handler not in logging.getLogger().handlers
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(f"no space left on device (ENOSPC) writing {tmp_path / RECORD_FILE}" in m
               and f"the resume command: python train.py ckpt_path={tmp_path / LAST_CHECKPOINT}" in m for m in errors)
    assert any(m.startswith("could not write the failed record either: no space left") for m in errors)
    assert all(r.exc_info is None for r in caplog.records)  # no traceback in the log
    assert not list(tmp_path.glob(".results.json*"))


def test_a_training_script_ignores_stop_signals_until_it_exits(tmp_path, monkeypatch, no_default_kill):
    """In train.py (not a library call) a second kill arriving after the record was written, while Hydra's
    callbacks end the process, must not end it by the signal's default action (status -15 / -2 instead of 143 /
    130): the handlers stay in place, ignoring, once a run was stopped."""
    monkeypatch.setitem(stops._PROCESS, "script", True)

    def fake_train(cfg, lock=None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(runner, "train", fake_train)
    old = {s: signal.getsignal(s) for s in stops.STOP_SIGNALS}
    try:
        with pytest.raises(RunInterrupted):
            runner.run(_cfg(tmp_path))
        for s in stops.STOP_SIGNALS:
            os.kill(os.getpid(), s)  # reported and ignored
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    assert _record(tmp_path).error == "SIGTERM received"


def test_sighup_ends_a_real_run_with_its_record(tmp_path):
    """python train.py … hydra.run.dir=X &, then kill -HUP once X/checkpoints/last.ckpt exists
    (here twice, 50 ms apart) → exit status 129 (not a death by SIGHUP), results.json interrupted with the resume
    command, no traceback; the folder's lock is held from the moment Hydra wrote .hydra/ to the end."""
    out = tmp_path / "x"
    # 3000 epochs: the signal stops the run long before; with 30 the fit (about 0.3 s an epoch) could end before a
    # starved test process sent it (exit 0 in the full suite), a race of the test and not of the run
    cmd = [sys.executable, "train.py", "trainer.max_epochs=3000", "data.n_train=128", "data.n_val=64", "data.n_test=64",
           "data.batch_size=64", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
           "~logger", "extras.print_config=false", "~callbacks.run_time_estimate", "~callbacks.throughput",
           f"hydra.run.dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    locked_while_hydra_wrote = None
    try:
        deadline = time.time() + 240
        while not (out / LAST_CHECKPOINT).is_file() and proc.poll() is None and time.time() < deadline:
            if locked_while_hydra_wrote is None and (out / ".hydra" / "overrides.yaml").is_file():
                locked_while_hydra_wrote = is_live(out)
            time.sleep(0.005)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)  # the second while the run stops: the status stays 129
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 129, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    rec = _record(out)
    assert rec.status == "interrupted" and rec.error == "SIGHUP received" and rec.run_id
    assert f"ckpt_path={out / LAST_CHECKPOINT}" in rec.resume_command and f"hydra.run.dir={out}" in rec.resume_command
    assert locked_while_hydra_wrote is True and not is_live(out)


def test_sigterm_and_ctrl_c_record_an_interrupted_run_with_the_signal_status(tiny_run, tmp_path, monkeypatch):
    """kill -TERM (and Ctrl-C) during a real training run: status interrupted with the resume command, and the exit
    status of a death by that signal (143, 130): never 0 without a record."""
    from diffrank.experiments.callbacks.hydra_callbacks import SweepSummary
    from diffrank.experiments.models.classifier import TopKClassifier

    original = TopKClassifier.training_step

    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        out = tmp_path / sig.name

        def training_step(self, batch, batch_idx, sig=sig):
            if self.global_step == 5:
                os.kill(os.getpid(), sig)
            return original(self, batch, batch_idx)

        with monkeypatch.context() as m:
            m.setattr(TopKClassifier, "training_step", training_step)
            with pytest.raises(BaseException) as stopped:  # noqa: PT011 - exited 0 (SystemExit) before it was fixed
                runner.run(tiny_run(out, ["trainer.max_epochs=3"]))
        assert getattr(stopped.value, "exit_code", getattr(stopped.value, "code", None)) == code
        rec = _record(out)
        assert rec.status == "interrupted" and sig.name in rec.error and rec.run_id
        assert f"ckpt_path={out / LAST_CHECKPOINT}" in rec.resume_command
        assert f"hydra.run.dir={out}" in rec.resume_command
        assert signal.getsignal(sig) is not None  # the run's handlers are gone again
    # the Hydra callback ends the process with that status, after the sweep summary
    config = {"hydra": {"mode": None}}
    with pytest.raises(SystemExit) as exited:
        SweepSummary().on_job_end(config, types.SimpleNamespace(_return_value=stopped.value, status=None))
    assert exited.value.code == 130


def test_an_interrupted_multirun_job_is_in_the_summary_and_stops_the_sweep(tmp_path):
    """A multirun whose job was stopped by SIGTERM: the summary lists it as interrupted, the sweep stops (143)."""
    from hydra.core.utils import JobStatus
    from hydra.types import RunMode

    from diffrank.experiments.callbacks.hydra_callbacks import SweepSummary

    job = tmp_path / "seed=0"
    RunRecord(status="interrupted", error="SIGTERM received", overrides=["seed=0"]).write(job / RECORD_FILE)
    (job / ".hydra").mkdir()
    (job / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    config = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit) as exited:
        SweepSummary(wandb=False).on_job_end(config, types.SimpleNamespace(
            _return_value=RunInterrupted(signal.SIGTERM, "stopped"), status=JobStatus.FAILED))
    assert exited.value.code == 143
    assert "interrupted" in (tmp_path / "sweep_summary.csv").read_text()


def test_a_full_disk_writing_a_checkpoint_is_named_in_the_record(tiny_run, tmp_path, monkeypatch):
    """A checkpoint write on a full disk (torch: "unexpected pos …", ENOSPC only chained): the error and the failure
    record name ENOSPC and the checkpoint."""
    import torch

    from diffrank.experiments.callbacks import AtomicCheckpointIO

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
        runner.run(tiny_run(tmp_path / "run", ["trainer.max_epochs=1"]))
    rec = _record(tmp_path / "run")
    assert rec.status == "failed" and "no space left on device (ENOSPC) writing" in rec.error
    assert "checkpoints" in rec.error
