"""results.json records what decides the bits: CPU model and dispatched ISA, threads, library versions, flags."""

from __future__ import annotations

import json

import torch

from diffrank.utils.results import compute_environment, cpu_model, device_description, write_results


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


def test_write_results(tmp_path):
    path = write_results(tmp_path / "a" / "results.json", {"compute": compute_environment()})
    assert json.loads(path.read_text())["compute"]["num_threads"] >= 1
