"""The paper report's sections for LapSum (Struski et al. 2025) Table 2 and thesis Table 7.3, from results.json
records written the way a run of a real row config writes them (the composed config, its ``paper`` key, the
Newton loss's λ, the device, the budget), checked cell by cell."""

from __future__ import annotations

from omegaconf import OmegaConf

from diffrank import reference
from diffrank.experiments.analysis import report
from diffrank.experiments.records.record import RunRecord
from diffrank.experiments.records.table_cells import table_rows

CPU = "cpu (AMD EPYC 7763 64-Core Processor, AVX2, 1 thread)"
H100 = "NVIDIA H100 80GB HBM3 (CUDA 12.4, cuDNN 90100)"
LAPSUM, ICML, THESIS = "struski_lapsum_icml2025", "petersen_difftopk_icml2022", "petersen_thesis_2022"
_COMPOSED: dict[tuple, tuple[dict, dict]] = {}


def _run(compose, root, name, row, metrics, *overrides, seed=0, device=CPU, steps=None):
    """Write ``root/name/results.json`` as :func:`diffrank.experiments.records.finished.make_record` would for the row
    ``experiment=<row>`` with ``overrides``: its paper key, unresolved config, Hydra overrides, seed, device and
    budget (``steps`` optimizer steps, default the config's ``trainer.max_steps``, × ``data.batch_size``)."""
    task = [f"experiment={row}", f"seed={seed}", *overrides]
    key = (id(compose), row, overrides)
    if key not in _COMPOSED:  # one composition per row and overrides (the seed only sets cfg.seed)
        cfg = compose(task, fast=False)
        config = OmegaConf.to_container(cfg, resolve=False)
        config.pop("hydra", None)
        _COMPOSED[key] = (config, OmegaConf.to_container(cfg.paper, resolve=True))
    config, paper = _COMPOSED[key]
    config = {**config, "seed": seed}
    steps = int(config["trainer"]["max_steps"]) if steps is None else steps
    batch = int(config["data"]["batch_size"])
    RunRecord(status="done", metrics=metrics, paper=paper, overrides=task, config=config, seed=seed,
              global_step=steps, optimizer_steps=steps, world_size=1, per_device_batch=batch, global_batch=batch,
              device=device).write(root / name / "results.json")


def _cells(result, paper, table):
    header, cells = table_rows(result["tables"][(paper, table)])
    return [dict(zip(header, c)) for c in cells], header


def test_lapsum_table2_section_shows_copied_baselines_with_the_originals_runs_once(compose_train, tmp_path):
    """LapSum Table 2 reprints Petersen et al. 2022 Table 2 (ImageNet-1K / -21K-P heads): a run of an ICML 2022
    row appears in both sections (Δ against each table's printed number), counted once; runs of that row on
    another device stay a line of their own in both; LapSum's own row shows its seeds' mean; the section lists
    the whole published table; ICML rows LapSum does not reprint (Softmax) stay out of it."""
    runs = tmp_path / "runs"
    ns = "topk/icml2022_t2/in1k_neuralsort_top5"
    _run(compose_train, runs, "ns/0", ns, {"test/top1": 0.33, "test/top5": 0.947}, seed=0, steps=51240)
    _run(compose_train, runs, "ns/1", ns, {"test/top1": 0.35, "test/top5": 0.949}, seed=1, steps=51240)
    _run(compose_train, runs, "ns/gpu0", ns, {"test/top1": 0.30, "test/top5": 0.94}, seed=0, device=H100,
         steps=51240)
    _run(compose_train, runs, "ss21k", "topk/icml2022_t2/in21kp_softsort_half_top5",
         {"test/top1": 0.40, "test/top5": 0.70}, steps=9000)
    _run(compose_train, runs, "softmax", "topk/icml2022_t2/in1k_softmax_ce", {"test/top1": 0.86, "test/top5": 0.978},
         steps=51240)
    lap = "topk/lapsum_t2/in1k_lapsum_top5"
    _run(compose_train, runs, "lap/0", lap, {"test/top1": 0.85, "test/top5": 0.978}, seed=0, steps=256200)
    _run(compose_train, runs, "lap/1", lap, {"test/top1": 0.86, "test/top5": 0.980}, seed=1, steps=256200)
    out = tmp_path / "report"
    result = report.write_report([runs], out, quiet=True)
    assert result["runs"] == 7 and not result["unmatched"]  # every record once

    lines = result["tables"][(LAPSUM, "2")]
    # the whole table: 44 published cells, plus one line for the NeuralSort runs on the second device (top-1, top-5)
    assert len(lines) == len(reference.load_table("lapsum_icml2025_table2")) + 2 == 46
    copies = [ln for ln in lines if ln.get("copy_of")]
    assert {ln["copy_of"] for ln in copies} == {f"{ICML} Table 2"}
    assert not any(ln["row"]["operator"] == "softmax_ce" for ln in lines)  # not in LapSum's table
    # the copies carry exactly the original's runs: NeuralSort 2 seeds on the CPU + 1 on the GPU, SoftSort 1 seed
    assert sum(ln["runs"] for ln in copies) == (2 + 1 + 1) * 2
    assert not any(ln["runs"] for ln in lines if not ln.get("copy_of") and ln["row"]["operator"] != "lapsum")

    rows, header = _cells(result, LAPSUM, "2")
    assert "device" in header and "Newton λ" not in header
    got = {(r["dataset"], r["method"], r["pk"], r["metric"], r["device"]): r for r in rows if r["runs"] != "0"}
    # Top-5 NeuralSort, ImageNet-1K, CPU: mean(33, 35) = 34.00 ± 1.41 vs LapSum's 33.37; top-5 mean(94.7, 94.9)
    # printed with LapSum's two decimals (94.75; Petersen et al. print 94.748)
    r = got[("imagenet1k", "NeuralSort", "[0,0,0,0,1]", "top1", "cpu")]
    assert (r["paper"], r["ours"], r["Δ"], r["runs"], r["steps×batch"]) == ("33.37", "34.00 ± 1.41", "+0.63", "2",
                                                                             "51240×500")
    r = got[("imagenet1k", "NeuralSort", "[0,0,0,0,1]", "top5", "cpu")]
    assert (r["paper"], r["ours"], r["Δ"]) == ("94.75", "94.80 ± 0.14", "+0.05")
    r = got[("imagenet1k", "NeuralSort", "[0,0,0,0,1]", "top1", "NVIDIA H100 80GB HBM3")]
    assert (r["ours"], r["Δ"], r["runs"]) == ("30.00", "-3.37", "1")  # never pooled with the CPU seeds
    r = got[("imagenet21kp", "SoftSort", "[.5,0,0,0,.5]", "top1", "cpu")]
    assert (r["paper"], r["ours"], r["Δ"], r["steps×batch"]) == ("39.93", "40.00", "+0.07", "9000×500")
    # LapSum's own row: mean(85, 86) = 85.50 ± 0.71 vs 85.36; top-5 mean(97.8, 98.0) = 97.90 vs 97.83
    r = got[("imagenet1k", "Lap-Top-k (our)", "[0,0,0,0,1]", "top1", "cpu")]
    assert (r["paper"], r["ours"], r["Δ"], r["runs"], r["steps×batch"]) == ("85.36", "85.50 ± 0.71", "+0.14", "2",
                                                                             "256200×500")
    assert got[("imagenet1k", "Lap-Top-k (our)", "[0,0,0,0,1]", "top5", "cpu")]["ours"] == "97.90 ± 0.14"
    assert len(got) == 8  # NeuralSort x 2 devices, SoftSort, Lap-Top-k; top-1 and top-5 each
    # unrun cells are shown with ours empty
    r = next(r for r in rows if r["method"] == "Lap-Top-k (our)" and r["dataset"] == "imagenet21kp"
             and r["pk"] == "[0,0,0,0,1]" and r["metric"] == "top1")
    assert (r["paper"], r["ours"], r["runs"]) == ("37.93", "—", "0")

    # the original's own section holds the same runs, against its own number and decimals
    orig = {(r["method"], r["metric"], r["device"]): r for r in _cells(result, ICML, "2")[0] if r["runs"] != "0"}
    assert orig[("Top-5 NeuralSort", "top5", "cpu")]["paper"] == "94.748"
    assert orig[("Top-5 NeuralSort", "top5", "cpu")]["ours"] == "94.800 ± 0.141"
    assert orig[("Top-5 NeuralSort", "top1", "NVIDIA H100 80GB HBM3")]["runs"] == "1"
    assert orig[("Softmax", "top1", "cpu")]["ours"] == "86.00"

    md = (out / "report.md").read_text()
    assert f"## {LAPSUM}, Table 2\n" in md and f"## {ICML}, Table 2\n" in md
    assert f"reprint {ICML} Table 2" in md
    assert "| imagenet1k | NeuralSort | neuralsort |  |  | 1000 | [0,0,0,0,1] | 16 " \
           "| copy_of=petersen_difftopk_icml2022:2 | top5 | 94.75 | 94.80 ± 0.14 | +0.05 | 2 | 51240×500 | cpu |" in md


def test_thesis_table7_3_section_keeps_lambdas_and_devices_apart(compose_train, tmp_path):
    """Thesis Table 7.3 (Regular / NL (Hessian) / NL (Fisher) per sorting relaxation): each method's seeds are
    averaged beside the thesis' number; a Newton run's Tikhonov λ is its own column and runs of another λ (or
    another device) are their own line, never pooled; each Newton line is compared with Regular of its cell."""
    runs = tmp_path / "runs"
    t73 = "sorting/thesis_t7_3/softsort_n5"
    for seed, (em, ew) in enumerate([(0.70, 0.86), (0.71, 0.87), (0.72, 0.88)]):
        _run(compose_train, runs, f"regular/{seed}", t73, {"test/em": em, "test/ew": ew}, seed=seed)
    for seed, em in enumerate([0.83, 0.85]):  # the row's λ (configs/newton/hessian.yaml)
        _run(compose_train, runs, f"hessian/{seed}", f"{t73}_hessian", {"test/em": em, "test/ew": em + 0.08},
             seed=seed)
    _run(compose_train, runs, "hessian_l1/0", f"{t73}_hessian", {"test/em": 0.10, "test/ew": 0.50},
         "newton.tikhonov=1", seed=0)
    for seed, em in enumerate([0.84, 0.86]):
        _run(compose_train, runs, f"fisher/{seed}", f"{t73}_fisher", {"test/em": em, "test/ew": em + 0.08},
             seed=seed)
    _run(compose_train, runs, "fisher_gpu/0", f"{t73}_fisher", {"test/em": 0.50, "test/ew": 0.60}, seed=0,
         device=H100)
    _run(compose_train, runs, "dsn_fisher/0", "sorting/thesis_t7_3/odd_even_cauchy_n5_fisher",
         {"test/em": 0.85, "test/ew": 0.93}, seed=0)
    # NeuralSort's Newton rows, without a NeuralSort Regular run: nothing to compare with (not SoftSort's Regular)
    _run(compose_train, runs, "ns_fisher/0", "sorting/thesis_t7_3/neuralsort_n5_fisher",
         {"test/em": 0.80, "test/ew": 0.90}, seed=0)
    _run(compose_train, runs, "ns_fisher/1", "sorting/thesis_t7_3/neuralsort_n5_fisher",
         {"test/em": 0.82, "test/ew": 0.91}, seed=1)
    out = tmp_path / "report"
    result = report.write_report([runs], out, quiet=True)
    assert result["runs"] == 12 and not result["unmatched"]
    assert list(result["tables"]) == [(THESIS, "7.3")]

    rows, header = _cells(result, THESIS, "7.3")
    assert {"Newton λ", "device", "paper − Regular", "ours − Regular (Welch p)", "sigmoid"} <= set(header)
    got = {(r["method"], r["operator"], r["metric"], r["Newton λ"], r["device"]): r for r in rows}
    # 7 lines (Regular, Hessian x 2 λ, Fisher x 2 devices, DSN Fisher, NeuralSort Fisher) x EM/EW
    assert len(got) == len(rows) == 14
    r = got[("Regular", "softsort", "EM", "", "cpu")]
    # mean(70, 71, 72) = 71.00 ± 1.00 vs 70.70
    assert (r["paper"], r["ours"], r["Δ"], r["runs"], r["steps×batch"]) == ("70.70", "71.00 ± 1.00", "+0.30", "3",
                                                                             "100000×100")
    assert r["paper − Regular"] == r["ours − Regular (Welch p)"] == ""
    r = got[("NL (Hessian)", "softsort", "EM", "0.01", "cpu")]
    assert (r["paper"], r["ours"], r["Δ"], r["runs"]) == ("83.87", "84.00 ± 1.41", "+0.13", "2")
    assert r["paper − Regular"] == "+13.17" and r["ours − Regular (Welch p)"].startswith("+13.00 (p=")
    r = got[("NL (Hessian)", "softsort", "EM", "1", "cpu")]  # newton.tikhonov=1: its own line
    assert (r["paper"], r["ours"], r["Δ"], r["runs"]) == ("83.87", "10.00", "-73.87", "1")
    assert r["ours − Regular (Welch p)"] == "-61.00"  # one run: no test
    r = got[("NL (Fisher)", "softsort", "EM", "0.01", "cpu")]
    assert (r["paper"], r["ours"], r["runs"]) == ("84.03", "85.00 ± 1.41", "2")
    r = got[("NL (Fisher)", "softsort", "EM", "0.01", "NVIDIA H100 80GB HBM3")]
    assert (r["ours"], r["runs"]) == ("50.00", "1")  # a seed on another device is not a third seed
    assert r["ours − Regular (Welch p)"] == ""  # no Regular run on that device
    r = got[("NL (Fisher)", "dsn", "EM", "0.01", "cpu")]
    assert (r["sigmoid"], r["paper"], r["ours"]) == ("cauchy", "84.95", "85.00")
    assert r["paper − Regular"] == r["ours − Regular (Welch p)"] == ""  # no DSN Regular run
    r = got[("NL (Fisher)", "neuralsort", "EM", "0.01", "cpu")]
    assert (r["paper"], r["ours"], r["runs"]) == ("83.93", "81.00 ± 1.41", "2")
    assert r["paper − Regular"] == r["ours − Regular (Welch p)"] == ""  # SoftSort's Regular is another cell
    assert got[("Regular", "softsort", "EW", "", "cpu")]["ours"] == "87.00 ± 1.00"

    md = (out / "report.md").read_text()
    assert f"## {THESIS}, Table 7.3\n" in md
    assert "| NL (Hessian) | softsort |  | 5 | EM | 83.87 | 10.00 | -73.87 | 1 | 100000×100 | 1 | cpu | +13.17 " \
           "| -61.00 |" in md
