"""scripts/topk_throughput.py runs both of its measurements (CIFAR ResNet-18 step, ImageNet linear head) on tiny
sizes and reports positive rates; no timing is asserted."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
try:
    import topk_throughput
finally:
    sys.path.remove(str(ROOT / "scripts"))


def test_cifar_and_head_measurements():
    (cifar,) = topk_throughput.main(["--rows", "softmax_ce", "--threads", "1", "--steps", "1", "--batch", "8"])
    assert cifar["images_per_s"] > 0 and cifar["batch"] == 8 and cifar["hours_200_epochs"] > 0
    (head,) = topk_throughput.main(["--head", "in1k_dsn_half_top5", "--threads", "1", "--batch", "64"])
    assert head["embeddings_per_s"] > 0 and head["batch"] == 64 and head["steps"] == 5
    assert head["loss"] == head["loss"]  # finite loss (not NaN)
