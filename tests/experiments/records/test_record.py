"""results.json records what decides the bits: CPU model and dispatched ISA, threads, library versions, flags."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from diffrank.experiments.records.environment import compute_environment, cpu_model, device_description
from diffrank.experiments.records.record import SCHEMA, RunRecord


def test_compute_environment_records_what_decides_the_bits(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        env = compute_environment()
    finally:
        torch.set_num_threads(before)
    assert env["num_threads"] == 1 and env["num_interop_threads"] == torch.get_num_interop_threads()
    assert env["env"]["OMP_NUM_THREADS"] == "1" and env["env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["cpu_model"] == cpu_model() and env["cpu_model"]
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch"] == torch.__version__ and env["cuda"] == torch.version.cuda
    if torch.backends.mkldnn.is_available():
        assert env["onednn"] and env["onednn"][0].isdigit()
    assert env["deterministic"]["algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert set(env["deterministic"]) >= {"warn_only", "cudnn_deterministic", "cudnn_benchmark",
                                         "cuda_matmul_allow_tf32", "float32_matmul_precision"}
    assert len(env["cuda_devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    json.dumps(env)  # goes into results.json as it is


def test_deterministic_flag_is_recorded():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        flags = compute_environment()["deterministic"]
    finally:
        torch.use_deterministic_algorithms(was)
    assert flags["algorithms"] is True and flags["warn_only"] is True


def test_device_line_names_isa_and_threads():
    env = compute_environment()
    line = device_description(env)
    if torch.cuda.is_available():
        assert env["cuda_devices"][0]["name"] in line
    else:
        assert env["cpu_capability"] in line and f"{env['num_threads']} thread" in line and env["cpu_model"] in line


RECORDS = Path(__file__).parent  # the committed records lie beside this file


def test_record_round_trip(tmp_path):
    rec = RunRecord(status="done", metrics={"test/em5": 0.7}, overrides=["seed=1"], compute=compute_environment(),
                    extra={"note": "kept"})
    path = rec.write(tmp_path / "a" / "results.json")
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and data["note"] == "kept" and data["compute"]["num_threads"] >= 1
    back = RunRecord.read(path)
    assert back == rec and back.to_dict() == data


def test_partial_or_missing_record_reads_as_none(tmp_path):
    assert RunRecord.read(tmp_path / "none.json") is None
    (tmp_path / "torn.json").write_text('{"status": "do')
    assert RunRecord.read(tmp_path / "torn.json") is None
    (tmp_path / "list.json").write_text("[1, 2]")
    assert RunRecord.read(tmp_path / "list.json") is None


def test_schema1_record_written_before_runrecord_loads():
    """A results.json of the Table 3.5 precision check (n = 32, batch 4, 1 000 steps), written by the code
    before RunRecord existed."""
    rec = RunRecord.read(RECORDS / "schema1_sorting_t3_5.json")
    assert rec.schema == 1 and rec.status == "done"
    assert rec.paper["table"] == "3.5" and rec.metrics["test/em5"] == pytest.approx(0.4096, abs=1e-4)
    assert (rec.steps, rec.global_batch) == (1000, 4)
    assert rec.optimized_metric == "val/em5"


def test_schema1_fallbacks_of_the_earliest_records():
    """Records before optimizer_steps / global_batch / status: steps from global_step, batch from the overrides or
    the config, status from the metrics (the fallbacks three readers used to carry)."""
    data = json.loads((RECORDS / "schema1_early.json").read_text())
    rec = RunRecord.from_dict(data)
    assert (rec.status, rec.optimizer_steps, rec.global_batch) == ("done", data["global_step"], 4)
    rec = RunRecord.from_dict({**data, "overrides": [*data["overrides"], "data.batch_size=8"]})
    assert rec.global_batch == 8
    rec = RunRecord.from_dict({"config": {"trainer": {"max_steps": 50}}})
    assert (rec.status, rec.optimizer_steps, rec.steps) == ("incomplete", None, 50)


def test_accessors_the_readers_use():
    """What the report, the P_K report and the sweep summary read, read once here: budget (steps actually taken ×
    global batch, precision when not float32), β, the Newton λ, the kind of device, other data, the validation
    score, the reference row."""
    row = {"paper": "petersen_thesis_2022", "table": "7.1", "method": "Newton L. (F)"}
    rec = RunRecord.from_dict({
        "schema": SCHEMA, "paper": row, "optimizer_steps": 550, "global_batch": 100,
        "overrides": ["operator.beta=4", "data=digits_sort"], "device": "NVIDIA H100 80GB HBM3 (CUDA 13.0, cuDNN 9)",
        "metrics": {"val/top1": 0.5, "val/acc": 0.75},
        "config": {"operator": {"beta": "0.25"}, "newton": {"variant": "fisher", "tikhonov": 0.1},
                   "optimized_metric": "val/acc", "optimized_mode": "max", "trainer": {"precision": "bf16-mixed"}}})
    assert rec.budget == "550×100 bf16-mixed" and rec.beta == 0.25 and rec.tikhonov == "0.1"
    assert rec.device_kind == "NVIDIA H100 80GB HBM3" and rec.data_kind == "data=digits_sort"
    assert rec.val_score == 0.75 and rec.optimized_mode == "max"  # optimized_metric before val/top1
    assert rec.table_row == row and rec.benchmark_cell is None
    bare = RunRecord()
    assert bare.budget == "?" and bare.beta is None and bare.tikhonov == "" and bare.device_kind == ""
    assert bare.data_kind == "" and math.isnan(bare.val_score) and bare.table_row is None
    assert RunRecord(synthetic_data=True, overrides=["data=digits_sort"]).data_kind == "synthetic"
    assert RunRecord(config={"newton": {"variant": "none", "tikhonov": 1}}).tikhonov == ""


def test_the_precision_actually_used_is_recorded(tiny_run, tmp_path):
    """T trainer.precision=16-mixed on the CPU runs bf16: the record says so, and so does its budget."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU 16-mixed is what runs")
    from diffrank.experiments.records.record import RECORD_FILE
    from diffrank.experiments.run.train import train

    train(tiny_run(tmp_path, ["trainer.precision=16-mixed", "trainer.max_epochs=1", "trainer.limit_train_batches=2"]))
    rec = RunRecord.read(tmp_path / RECORD_FILE)
    assert rec.budget.endswith(" bf16-mixed"), rec.budget
    assert rec.precision == "bf16-mixed" and rec.segments[-1]["precision"] == "bf16-mixed"
