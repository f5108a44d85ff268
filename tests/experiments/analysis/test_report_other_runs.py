"""The report's runs of no paper row (``make report`` over ``results/``): the default ``python train.py`` run and the
digits100 runs, archived, get a section of their own with their command, seeds, metrics, date, machine and archive;
records the report cannot place say why, one by one; piped, the tables are printed whole, not cut at 80 columns."""

from __future__ import annotations

from diffrank.experiments.analysis import report
from diffrank.experiments.analysis.report_others import other_rows
from diffrank.experiments.records import archive
from diffrank.experiments.records.record import RunRecord

CPU2 = "cpu (AMD EPYC, AVX512, 2 threads)"
CPU1 = "cpu (AMD EPYC, AVX512, 1 thread)"
DEFAULT = {"data": "digits100", "experiment": None, "loss": "topk_ce", "net": "small_cnn", "newton": "none",
           "operator": "sinkhorn", "pk": "half_top5"}
CAUCHY5 = {"paper": "petersen_thesis_2022", "table": "3.7", "dataset": "mnist4", "method": "Cauchy CDF",
           "network": "odd_even", "n": 5}
LONG = ("operator=difftopk_splitter", "model.optimizer.lr=0.0005", "trainer.max_epochs=12",
        "trainer.enable_progress_bar=false")


def _run(root, name, metrics, *overrides, seed=0, device=CPU1, paper=None, status="done", choices=DEFAULT,
         day="26", **fields):
    """``root/name/results.json`` as a digits100 run of ``python train.py <overrides> seed=<seed>`` writes it."""
    d = root / name
    RunRecord(status=status, run_id=f"{name}-id", metrics=metrics, paper=paper, choices=dict(choices),
              overrides=[*overrides, f"seed={seed}"] if overrides or seed else [], seed=seed, optimizer_steps=1248,
              global_batch=128, device=device, wall_time_s=300.0 + seed, finished_at=f"2026-11-{day}T10:00:00+0000",
              run_dir=str(d), **fields).write(d / "results.json")


def _archived(tmp_path):
    """An archive in ``results/`` of: the default run, three seeds of one operator, one seed of a long command, a
    paper-row run, an older ``variant_of`` run and a benchmark cell that failed."""
    runs = tmp_path / "outputs"
    _run(runs, "default", {"test/top1": 0.9908, "test/top5": 1.0, "test/loss": 0.37}, device=CPU2, day="27")
    for seed, top1 in enumerate((0.9842, 0.9932, 0.9816)):
        _run(runs, f"neuralsort_s{seed}", {"test/top1": top1, "test/top5": 1.0}, "operator=neuralsort",
             "trainer.enable_progress_bar=false", seed=seed, choices={**DEFAULT, "operator": "neuralsort"})
    _run(runs, "long_s1", {"test/top1": 0.9852, "test/top5": 0.9999}, *LONG, seed=1,
         choices={**DEFAULT, "operator": "difftopk_splitter"})
    _run(runs, "cauchy_s0", {"test/em": 0.8}, "experiment=sorting/thesis_t3_7/cauchy_n5", paper=CAUCHY5)
    _run(runs, "old_variant", {"test/em": 0.5}, "operator=softsort", variant_of={"experiment": "sorting/x"})
    _run(runs, "bench_failed", {}, "experiment=topk/fashion_pairs/ns", status="failed",
         paper={"benchmark": "fashion_pairs", "method": "NeuralSort", "operator": "neuralsort",
                "pk": "[0,0,0,0,1]"})
    out = tmp_path / "results" / "digits100.jsonl.gz"
    # the failed run is not archived: give its record to the report as a run folder
    assert archive.write_archive([runs], out) == 7
    return out, runs / "bench_failed"


def test_archived_runs_of_no_paper_row_have_their_own_section(tmp_path):
    """Every archived run of no paper row is in the report (none skipped): the default run as ``python train.py``,
    the seeds of one command pooled (per-run values, mean ± std in %), with date, machine and the archive read; a
    record the tables cannot take says why on its line."""
    arch, failed = _archived(tmp_path)
    out = tmp_path / "report"
    result = report.write_report([arch, failed], out, quiet=True)
    assert result["runs"] == 1 and list(result["tables"]) == [("petersen_thesis_2022", "3.7")]
    others = result["others"]
    assert others["runs"] == 7 and others["benchmark"] == {}  # all but the paper-row run
    header, cells = other_rows(others["lines"])
    rows = [dict(zip(header, c)) for c in cells]
    by = {(r["command"], r["metric"]): r for r in rows}

    r = by[("python train.py", "test/top1 (%)")]  # the default run: no overrides
    assert r["config"] == "data=digits100 net=small_cnn loss=topk_ce operator=sinkhorn pk=half_top5"
    assert (r["seeds"], r["per run"], r["mean ± std"], r["runs"], r["steps×batch"]) == ("0", "99.08", "99.08", "1",
                                                                                        "1248×128")
    assert (r["date"], r["machine"], r["records"]) == ("2026-11-27", CPU2, str(arch))
    assert by[("python train.py", "test/loss")]["per run"] == "0.37"  # not an accuracy: as recorded

    r = by[("python train.py operator=neuralsort trainer.enable_progress_bar=false", "test/top1 (%)")]
    assert (r["seeds"], r["per run"], r["mean ± std"], r["runs"]) == ("0, 1, 2", "98.42, 99.32, 98.16",
                                                                     "98.63 ± 0.61", "3")
    assert (r["wall s"], r["date"], r["machine"], r["records"]) == ("301", "2026-11-26", CPU1, str(arch))

    r = by[("python train.py operator=softsort", "test/em (%)")]
    assert r["note"].startswith("an older run of sorting/x with another method (variant_of)")
    r = by[("python train.py experiment=topk/fashion_pairs/ns", "—")]
    assert (r["status"], r["records"]) == ("failed", str(failed / "results.json"))
    assert r["note"] == "benchmark cell fashion_pairs neuralsort [0,0,0,0,1], not in its P_K grid: status failed"
    assert len(rows) == 3 + 2 + 2 + 1 + 1  # default: top1, top5, loss; neuralsort and long: top1, top5

    md = (out / "report.md").read_text()
    assert "skipped" not in md and "## Runs of no paper row\n" in md
    assert "1 runs with a `paper` key beside the papers' tables; 7 runs of no paper row in [their own section]" in md
    assert (f"| python train.py | data=digits100 net=small_cnn loss=topk_ce operator=sinkhorn pk=half_top5 | 0 "
            f"| test/top1 (%) | 99.08 | 99.08 | 1 | 1248×128 | 300 | 2026-11-27 | {CPU2} | {arch} |") in md


def test_piped_report_prints_wide_table_rows_whole(tmp_path, capsys):
    """Printed to a pipe (here: captured, not a terminal) a table row wider than 80 columns is one whole line:
    rich would otherwise fit the tables to 80 columns, cutting cells to ``…``."""
    arch, failed = _archived(tmp_path)
    report.write_report([arch, failed], tmp_path / "report")
    printed = capsys.readouterr().out.splitlines()
    command = "python train.py " + " ".join(LONG)
    rows = [ln for ln in printed if command in ln and "test/top1 (%)" in ln]
    assert len(rows) == 1, "\n".join(printed)
    row = rows[0]
    assert len(row) > 80 and "…" not in row
    for cell in ("98.52", "1248×128", "2026-11-26", CPU1, str(arch)):
        assert cell in row
    # the paper table's row too: every column on one line
    cauchy = [ln for ln in printed if "Cauchy CDF" in ln and "EM" in ln]
    assert len(cauchy) == 1 and "80.00" in cauchy[0] and "1248×128" in cauchy[0]
