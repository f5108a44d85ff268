"""diffrank.experiments.tools.throughput sorting on tiny MNIST files: one line per
experiment after a header with the thread count and precision, positive rates in 32-true and bf16-mixed; no
timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from diffrank.experiments.tools import throughput
from experiments.data.image_files import write_mnist

EXPERIMENT = "sorting/thesis_t3_7/neuralsort_n5"


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist")
    write_mnist(root, "MNIST", n_train=5200, n_test=60)  # the protocol holds out 5 000 for validation
    return root


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_sets_per_second(mnist_dir, capsys, precision):
    (r,) = throughput.main(["sorting", "--data-dir", str(mnist_dir), "--batch", "4", "--steps", "2", "--glibc-mmap",
                            "--precision", precision, EXPERIMENT])
    assert r["experiment"] == EXPERIMENT and r["precision"] == precision and r["sets_per_s"] > 0
    assert r["sets_per_s"] == pytest.approx(4 / r["s_per_step"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("torch threads: ") and f"precision {precision}" in out[0]
    assert out[1].startswith(EXPERIMENT) and out[1].endswith("sets/s")


def test_bad_arguments(mnist_dir):
    with pytest.raises(ValueError, match="precision"):
        throughput.measure_sorting(EXPERIMENT, mnist_dir, 4, 2, precision="16-mixed")
    with pytest.raises(ValueError, match="steps"):
        throughput.measure_sorting(EXPERIMENT, mnist_dir, 4, 0)
    with pytest.raises(SystemExit):
        throughput.main(["sorting", "--precision", "fp8", EXPERIMENT])


def test_command_line_runs_as_a_module(mnist_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "diffrank.experiments.tools.throughput", "sorting", "--data-dir",
                          str(mnist_dir), "--batch", "4", "--steps", "2", "--precision", "bf16-mixed", EXPERIMENT],
                         cwd=mnist_dir, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    header, line = out.stdout.strip().splitlines()
    assert header.startswith("torch threads: 1,") and "precision bf16-mixed" in header
    assert line.startswith(EXPERIMENT) and "sets/s" in line
