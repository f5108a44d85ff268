"""``make gpu-check`` (diffrank.benchmark.gpu): the CPU dry run writes every table with the GPU columns marked
not measured, and the report's arithmetic (ratios to the peer and to torch.sort, hours at a rate) by hand."""

from __future__ import annotations

import csv
import math

import pytest

from diffrank.benchmark import gpu
from diffrank.operators import available


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    mp = pytest.MonkeyPatch()
    mp.delenv("TRITON_INTERPRET", raising=False)  # the interpreter's Triton rows would only be slow here
    try:
        md = gpu.main(["--device", "cpu", "--quick", "--out", str(out), "--budget", "30"])
    finally:
        mp.undo()
    return out, md


def test_dry_run_writes_every_file_and_table(dry_run):
    out, md = dry_run
    for name in ("environment.json", "gpu_check.md", "headline.csv", "headline.png", "table39.csv", "table39.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "gpu_check.md").read_text() == md
    rows = list(csv.DictReader((out / "headline.csv").read_text().splitlines()))
    assert {r["operator"] for r in rows if r["table"] == "grid"} == set(available())
    assert {r["operator"] for r in rows if r["table"] == "floor"} == {"torch.sort", "torch.topk"}
    for heading in ("Headline cell", "Table 3.9 sizes", "Training step and run"):
        assert heading in md


def test_dry_run_marks_every_gpu_column_not_measured(dry_run):
    _, md = dry_run
    table = md.split("##### Headline cell")[1].split("\n\n")[1].splitlines()[2:]
    assert len(table) >= len(available()) + 2
    for line in table:
        time_cell = line.split("|")[3].strip()
        # a cell the headline step's share of --budget did not reach says so, on the CPU too
        assert time_cell in (gpu.NOT_MEASURED, gpu.BUDGET_SPENT), line
    assert [line.split("|")[3].strip() for line in table[:2]] == [gpu.NOT_MEASURED] * 2  # the floors come first
    t39 = md.split("##### Table 3.9")[1].split("\n\n")[1].splitlines()[2:]
    t39_cells = [line.split("|")[2].strip() for line in t39]
    assert len(t39_cells) == len(gpu.grid.TABLE39_N) and set(t39_cells) <= {gpu.NOT_MEASURED, gpu.BUDGET_SPENT}
    assert t39_cells[-1] == gpu.NOT_MEASURED  # n = 1024: not run by --quick at all
    assert "μs" not in md.split("##### Training")[1] and "sets/s" in md


def _rec(table, operator, impl, seconds, note=""):
    return {"table": table, "operator": operator, "impl": impl, "n": 1000, "k": 5, "B": 1024, "fwd_s": seconds / 2,
            "fwd_bwd_s": seconds, "peak_bytes": 1e6, "achieved_Bps": 1e11, "roofline_frac": 0.03,
            "per_sample_s": seconds / 1024, "note": note}


def test_report_ratios_by_hand():
    recs = [_rec("floor", "torch.sort", "torch", 1e-4), _rec("floor", "torch.topk", "torch", 5e-5),
            _rec("grid", "neuralsort", "torch", 4e-3), _rec("grid", "neuralsort", "triton", 1e-3),
            _rec("grid", "neuralsort", "difftopk", 8e-3), _rec("grid", "lapsum", "triton", float("nan"), "skip: x")]
    head = gpu.headline_table(recs, measured=True)
    triton = next(line for line in head if "| neuralsort | triton |" in line)
    cells = [c.strip() for c in triton.split("|")[1:-1]]
    assert cells[6] == "10.0" and cells[7] == "difftopk" and cells[9] == "0.12"  # 1 ms ÷ 0.1 ms; 1 ms ÷ 8 ms
    assert "skip: x" in next(line for line in head if "| lapsum |" in line)
    best = gpu.best_ratios(recs)
    assert best[2].split("|")[1].strip() == "neuralsort" and best[2].split("|")[2].strip() == "triton"
    assert best[2].split("|")[6].strip() == "0.12" and best[2].split("|")[7].strip() == "10.0"


def test_table_hours_by_hand():
    h = gpu.table_hours("3.7", steps_per_s=10.0)
    assert h["rows"] == 87 and h["steps"] == 30 * 1_000_000 + 57 * 200_000  # the SVHN rows train 10^6 steps
    assert math.isclose(h["hours"], h["steps"] / 10.0 / 3600)


def test_test_outcomes_from_junit(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase name="a"/><testcase name="b"><failure message="x"/></testcase>'
                   '<testcase name="c"><skipped/></testcase></testsuite></testsuites>')
    assert [gpu._test_outcome(xml, n) for n in "abcd"] == ["passed", "failed", "skipped", "not run"]
    assert gpu._test_outcome(tmp_path / "missing.xml", "a") == "not run"


@pytest.mark.parametrize("argv, message", [
    (["--device", "foo"], "argument --device: cpu, cuda or cuda:<index>, got 'foo'"),
    (["--device", "cpu", "--budget", "-5"], "argument --budget: a finite number >= 0, got -5"),
    (["--device", "cpu", "--budget", "inf"], "argument --budget: a finite number >= 0, got inf"),
])
def test_an_unknown_device_or_a_negative_budget_is_refused(tmp_path, capsys, argv, message):
    """--device foo would fail in every step and still write a report headed 'CPU' with exit status 0: refused up
    front, as is a negative budget."""
    with pytest.raises(SystemExit) as exited:
        gpu.main([*argv, "--quick", "--out", str(tmp_path)])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "gpu_check.md").exists()


def _time_cells(md, heading):
    return [line.split("|")[3 if heading == "##### Headline cell" else 2].strip()
            for line in md.split(heading)[1].split("\n\n")[1].splitlines()[2:]]


def test_a_spent_budget_says_so_in_every_cell(tmp_path):
    """--budget 0: every headline and Table 3.9 cell reads 'skipped: budget spent', not the dry run's 'not
    measured' (which says a GPU column on a CPU)."""
    md = gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--budget", "0"])
    head = _time_cells(md, "##### Headline cell")
    assert len(head) == len(available()) + 2 and set(head) == {gpu.BUDGET_SPENT}
    # --quick runs n <= 32 only: the larger sizes are not measured at all
    assert _time_cells(md, "##### Table 3.9") == [gpu.BUDGET_SPENT] * 3 + [gpu.NOT_MEASURED] * 2
    rows = list(csv.DictReader((tmp_path / "headline.csv").read_text().splitlines()))
    assert {r["note"] for r in rows} == {gpu.BUDGET_SPENT}


def test_a_failed_step_says_failed_in_its_table(tmp_path, monkeypatch):
    """A step that raises: its table's cells say 'failed: <error>' (the console has the traceback), and the next
    steps run."""
    def fail(*args, **kwargs):
        raise RuntimeError("Expected one of cpu, cuda device type at start of device string: foo")

    monkeypatch.setattr(gpu, "run_headline", fail)
    monkeypatch.setattr(gpu, "run_table39", fail)
    md = gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--budget", "0"])
    failed = "failed: RuntimeError: Expected one of cpu, cuda device type at start of device string: foo"
    assert set(_time_cells(md, "##### Headline cell")) == {failed[:100]}
    assert set(_time_cells(md, "##### Table 3.9")) == {failed[:100]}


def test_an_unwritable_out_folder_is_an_error(tmp_path):
    """--out naming a file: 'error: cannot write into …', no traceback."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exited:
        gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path / "file"), "--budget", "0"])
    assert str(exited.value.code).startswith(f"error: cannot write into {tmp_path / 'file'}:")
