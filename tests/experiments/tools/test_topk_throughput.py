"""diffrank.experiments.tools.throughput runs both top-k measurements (CIFAR ResNet-18 step, ImageNet linear head) on
tiny sizes and reports positive rates; no timing is asserted."""

from __future__ import annotations

import math

from diffrank.experiments.tools import throughput


def test_cifar_and_head_measurements():
    (cifar,) = throughput.main(["topk", "--rows", "softmax_ce", "--threads", "1", "--steps", "1", "--batch", "8"])
    assert cifar["images_per_s"] > 0 and cifar["batch"] == 8 and cifar["hours_200_epochs"] > 0
    (head,) = throughput.main(["topk", "--head", "in1k_dsn_half_top5", "--threads", "1", "--batch", "64"])
    assert head["embeddings_per_s"] > 0 and head["batch"] == 64 and head["steps"] == 5
    assert math.isfinite(head["loss"]) and head["loss"] > 0  # a cross-entropy: finite and positive
