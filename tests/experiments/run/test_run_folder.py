"""A run folder holds one run: a second run into a folder that a live run holds, or that a finished run's record
and checkpoints fill, is refused before it writes anything; resuming the finished run from its ``last.ckpt`` is
allowed and keeps its run id (``python train.py`` on digits100 at a few steps, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffrank.experiments.records import folder as folders
from diffrank.experiments.records.folder import LAST_CHECKPOINT
from diffrank.experiments.records.record import RECORD_FILE, RunRecord
from diffrank.experiments.run.train import run, train


def _record(folder: Path) -> RunRecord:
    rec = RunRecord.read(folder / RECORD_FILE)
    assert rec is not None, f"no record in {folder}"
    return rec


def test_a_second_run_into_a_live_folder_is_refused(tiny_run, tmp_path):
    """T trainer.max_epochs=2 hydra.run.dir=X, and while it runs T operator=softsort … hydra.run.dir=X: the second
    is refused (the first holds the folder's lock), and the live run's folder is left as it was."""
    live = folders.FolderLock(tmp_path / "x", "the-first-run").acquire()  # the first run, still writing
    try:
        with pytest.raises(folders.FolderBusy, match="the-first-run"):
            run(tiny_run(tmp_path / "x", ["operator=softsort", "trainer.max_epochs=1"]))
        assert not (tmp_path / "x" / RECORD_FILE).exists()  # no failure record over the live run's folder
    finally:
        live.release()


def test_a_new_run_into_a_finished_folder_is_refused_unless_it_resumes(tiny_run, tmp_path):
    """T operator=softsort … hydra.run.dir=<a finished sinkhorn run>: refused, its results.json and last.ckpt stay
    the sinkhorn run's; resuming that run from its last.ckpt is allowed (same run id)."""
    out = tmp_path / "x"
    train(tiny_run(out, ["trainer.max_epochs=1"]))
    before = (out / RECORD_FILE).read_text()
    first = _record(out)
    with pytest.raises(FileExistsError, match="holds run .*ckpt_path="):
        run(tiny_run(out, ["operator=softsort", "trainer.max_epochs=1"]))
    assert (out / RECORD_FILE).read_text() == before
    ckpt = torch.load(out / LAST_CHECKPOINT, map_location="cpu", weights_only=False)
    assert first.run_id and first.config_hash and ckpt["diffrank_run_meta"]["run_id"] == first.run_id
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch_000.ckpt", "last.ckpt"]
    train(tiny_run(out, ["trainer.max_epochs=2", f"ckpt_path={out / LAST_CHECKPOINT}"]))
    again = _record(out)
    assert again.run_id == first.run_id and again.optimizer_steps == 8 and again.status == "done"
