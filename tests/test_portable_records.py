"""Committed run records speak of the repository, not of the machine that wrote them (devtools.portable_records)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from devtools.portable_records import machine_paths, portable, relative, rewrite

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted([*ROOT.joinpath("results").glob("*.jsonl.gz"), *ROOT.joinpath("tests").rglob("*.json")])


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_records_hold_no_machine_path(path):
    assert machine_paths(path) == [], f"rewrite with: python -m devtools.portable_records {path.relative_to(ROOT)}"


def test_relative_keeps_the_part_from_outputs_or_data():
    assert relative("/srv/a/outputs/t7/seed0/checkpoints/last.ckpt") == "outputs/t7/seed0/checkpoints/last.ckpt"
    assert relative("/srv/lab/data") == "data"
    assert relative("/x/outputs/run/data/cache") == "outputs/run/data/cache"   # the first of the two wins
    assert portable("paths.data_dir=/srv/lab/data") == "paths.data_dir=data"
    assert portable("1/2 of outputs/x, 3e-4") == "1/2 of outputs/x, 3e-4"      # relative text is left alone


def test_a_path_without_a_rule_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no rule for the machine path '/opt/weights.pt'"):
        relative("/opt/weights.pt")
    record = tmp_path / "results.json"
    record.write_text(json.dumps({"checkpoint": {"path": "/opt/weights.pt"}}))
    with pytest.raises(ValueError):
        rewrite(record)
    assert json.loads(record.read_text()) == {"checkpoint": {"path": "/opt/weights.pt"}}   # left as it was


def test_rewrite_changes_only_the_paths_and_is_stable(tmp_path):
    lines = [{"run_dir": "/srv/u/repo/outputs/b/seed1", "metrics": {"test/top1": 0.5}},
             {"run_dir": "/srv/u/repo/outputs/b/seed2", "overrides": ["paths.data_dir=/srv/u/data", "seed=2"]}]
    archive = tmp_path / "a.jsonl.gz"
    archive.write_bytes(gzip.compress("".join(json.dumps(r, sort_keys=True) + "\n" for r in lines).encode(), mtime=0))
    assert rewrite(archive) == 3
    once = archive.read_bytes()
    got = [json.loads(x) for x in gzip.decompress(once).decode().splitlines()]
    assert got == [{"run_dir": "outputs/b/seed1", "metrics": {"test/top1": 0.5}},
                   {"run_dir": "outputs/b/seed2", "overrides": ["paths.data_dir=data", "seed=2"]}]
    assert rewrite(archive) == 0 and archive.read_bytes() == once
