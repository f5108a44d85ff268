"""``callbacks=gpu``: the default callbacks without the ThroughputMonitor's per-batch CUDA synchronisation."""

from __future__ import annotations


def test_gpu_callbacks_drop_only_the_throughput_monitor(compose_train):
    default = compose_train(["trainer=gpu"]).callbacks
    gpu = compose_train(["trainer=gpu", "callbacks=gpu"]).callbacks
    assert default.throughput is not None and gpu.throughput is None
    assert {k for k, v in gpu.items() if v is not None} == set(default) - {"throughput"}
