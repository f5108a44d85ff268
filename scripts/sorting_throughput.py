"""Training throughput of the MNIST sorting benchmark (sets per second, forward + backward + Adam step).

Usage: ``OMP_NUM_THREADS=1 python scripts/sorting_throughput.py --data-dir /work/shared/data --batch 20 --steps 30
EXPERIMENT...`` (e.g. ``sorting/thesis_t3_7/odd_even_cauchy_n5``) — each experiment config is composed (so
operator, β and loss are the experiment's), the MNIST data module draws real batches, and the median step time
over ``--steps`` timed steps (after 3 warm-up steps) gives sets/s = batch / step time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from hydra import compose, initialize_config_dir

from diffrank.experiments.instantiate import instantiate
from diffrank.experiments.malloc import keep_freed_memory
from diffrank.registry import config_dir


def measure(experiment: str, data_dir: str, batch: int, steps: int) -> tuple[float, float]:
    """(median seconds per step, sets per second) for one experiment config."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}", f"paths.data_dir={data_dir}",
                                                       f"data.batch_size={batch}", "data.val_sets=1",
                                                       "data.test_sets=1", "paths.output_dir=/tmp"])
    dm = instantiate(cfg.data)
    dm.setup()
    loss = instantiate(cfg.loss)  # with the operator its yaml interpolates
    model = instantiate(cfg.model, loss=loss)
    opt = model.hparams.optimizer(params=model.parameters())
    times = []
    for i, (x, v) in enumerate(dm.train_dataloader()):
        if i == steps + 3:
            break
        t = time.perf_counter()
        lv = loss(model(x), v)
        opt.zero_grad()
        lv.backward()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t)
    dt = statistics.median(times)
    return dt, batch / dt


def main() -> None:
    """Print one line per experiment."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("experiments", nargs="+")
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--glibc-mmap", action="store_true",
                    help="leave glibc's mmap/munmap of large blocks on (train.py turns it off)")
    a = ap.parse_args()
    if not a.glibc_mmap:
        keep_freed_memory()
    mmap = "on" if a.glibc_mmap else "off"
    print(f"torch threads: {torch.get_num_threads()}, batch {a.batch} sets, glibc mmap {mmap}")
    for e in a.experiments:
        dt, sps = measure(e, a.data_dir, a.batch, a.steps)
        print(f"{e:45s} {dt * 1e3:8.1f} ms/step {sps:8.1f} sets/s")


if __name__ == "__main__":
    main()
