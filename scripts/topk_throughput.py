"""Training throughput of the CIFAR-100 top-k protocol (Petersen et al. 2022, §5.1): images/s of forward +
backward + Adam step of the CIFAR ResNet-18 with a table row's loss, on generated CIFAR-100-format data, and the
time 200 epochs (47 500 training images after the 5 % held out, batch 128: 371 steps per epoch) would take at
that rate (training only; validation + test each epoch add about 12 500 forward passes).

The rows are composed exactly as ``python train.py experiment=<row>`` would (``topk/icml2022_t1/*``: ResNet-18
with the stem max-pool, loss over all 100 classes), the batch goes through the data module's on-device
augmentation (random crop + flip + normalisation), so the number is the training loop's cost without Lightning.

Usage::

    python scripts/topk_throughput.py                                  # CPU, 1 and 2 threads, three losses
    python scripts/topk_throughput.py --threads 2 --steps 5 --rows softmax_ce dsn_uniform5
    python scripts/topk_throughput.py --device cuda --steps 20         # on a GPU
    python scripts/topk_throughput.py --head --threads 2               # ImageNet-1K linear heads (embeddings/s)

Prints one line per (threads, row) and returns the measurements (list of dicts) from :func:`main`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH = (50000 - 2500) // 128  # whole batches per epoch (the loader drops the last partial one)


def _write_cifar100(root: Path, n: int) -> None:
    """``root/cifar-100-python/{train,test,meta}`` with random pixels (the official pickle layout)."""
    import pickle

    import numpy as np

    rng = np.random.default_rng(0)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("train", "test"):
        split = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"fine_labels": [int(v) for v in np.arange(n) % 100], b"coarse_labels": [0] * n}
        (folder / name).write_bytes(pickle.dumps(split))
    (folder / "meta").write_bytes(pickle.dumps({b"fine_label_names": [b"c"] * 100}))


def _compose(experiment: str, data_dir: Path, batch: int, val_size: int = 16) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        # task_name is set: the rows' ${hydra:runtime.choices.experiment} needs a running Hydra app
        return compose(config_name="train", overrides=[
            f"experiment={experiment}", f"paths.data_dir={data_dir}", f"data.batch_size={batch}",
            f"data.val_size={val_size}", "task_name=throughput"])


def _timed_steps(step, steps: int, device: str) -> float:
    """Mean seconds of ``steps`` calls of ``step(i)`` after one warm-up call (CUDA: synchronised)."""
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        step(i)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sum(times[1:]) / steps


def measure_head(row: str, threads: int, steps: int, batch: int, device: str) -> dict[str, Any]:
    """Embeddings/s of ``steps`` timed training steps of the linear head of ``topk/icml2022_t2/<row>`` (ImageNet-1K:
    2 048-d, 1 000 classes, m = 16) on generated embeddings held in memory (no disk reads).

    Raises:
        ValueError: ``steps`` < 1.
    """
    from diffrank.experiments.instantiate import instantiate

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    torch.set_num_threads(threads)
    cfg = _compose(f"topk/icml2022_t2/{row}", ROOT / "outputs", batch)  # the cache is never read
    loss = instantiate(cfg.loss)
    head = instantiate(cfg.model.net).to(device)
    opt = torch.optim.Adam(head.parameters(), lr=cfg.model.optimizer.lr)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch * (steps + 1), head.in_features, generator=gen).to(device)
    y = torch.randint(0, head.out_features, (len(x),), generator=gen).to(device)
    value = torch.zeros(())

    def step(i: int) -> None:
        nonlocal value
        sl = slice(i * batch, (i + 1) * batch)
        value = loss(head(x[sl]), y[sl])
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()

    per_step = _timed_steps(step, steps, device)
    return {"row": row, "threads": threads, "device": device, "batch": batch, "steps": steps,
            "s_per_step": per_step, "embeddings_per_s": batch / per_step, "loss": value.item()}


def measure(row: str, threads: int, steps: int, batch: int, device: str, data_dir: Path) -> dict[str, Any]:
    """Images/s of ``steps`` timed training steps (after one warm-up step) of ``topk/icml2022_t1/<row>``.

    Raises:
        ValueError: ``steps`` < 1.
    """
    from diffrank.experiments.instantiate import instantiate

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    torch.set_num_threads(threads)
    cfg = _compose(f"topk/icml2022_t1/{row}", data_dir, batch)
    dm = instantiate(cfg.data)
    dm.setup()
    loss = instantiate(cfg.loss)
    net = instantiate(cfg.model.net).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loader = dm.train_dataloader()

    class _T:  # the trainer fields the augmentation reads
        training, global_rank, current_epoch, global_step = True, 0, 0, 0

    dm.trainer = _T()
    batches = list(loader)[:steps + 1]  # read before timing: the loop times the step, not the loader
    value = torch.zeros(())

    def step(i: int) -> None:
        nonlocal value
        _T.global_step = i
        x, y = dm.on_after_batch_transfer((batches[i][0].to(device), batches[i][1].to(device)), 0)
        value = loss(net(x), y)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()

    per_step = _timed_steps(step, steps, device)
    rate = batch / per_step
    return {"row": row, "threads": threads, "device": device, "batch": batch, "steps": steps,
            "s_per_step": per_step, "images_per_s": rate, "loss": value.item(),
            "hours_200_epochs": 200 * STEPS_PER_EPOCH * per_step / 3600}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", default=["softmax_ce", "dsn_uniform5", "sinkhorn_uniform5"],
                    help="rows of topk/icml2022_t1 (their loss and operator)")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=2, help="timed steps per measurement (after one warm-up)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--head", nargs="*", metavar="ROW", default=None,
                    help="instead: the ImageNet-1K linear head of these topk/icml2022_t2 rows (default: softmax, "
                         "NeuralSort, DSN and Sinkhorn at [.5,0,0,0,.5]), batch 500 unless --batch is given")
    a = ap.parse_args(argv)
    out = []
    if a.head is not None:
        batch = 500 if a.batch == 128 else a.batch
        for threads in a.threads:
            for row in a.head or ["in1k_softmax_ce", "in1k_neuralsort_half_top5", "in1k_dsn_half_top5",
                                  "in1k_sinkhorn_half_top5"]:
                r = measure_head(row, threads, max(a.steps, 5), batch, a.device)
                out.append(r)
                print(f"{row:28s} {a.device} {threads} thread(s), batch {batch}: {r['embeddings_per_s']:8.0f} "
                      f"embeddings/s ({r['s_per_step'] * 1e3:.0f} ms/step)", flush=True)
        return out
    with tempfile.TemporaryDirectory() as tmp:
        _write_cifar100(Path(tmp), n=16 + a.batch * (a.steps + 1))
        for threads in a.threads:
            for row in a.rows:
                r = measure(row, threads, a.steps, a.batch, a.device, Path(tmp))
                out.append(r)
                print(f"{row:20s} {a.device} {threads} thread(s), batch {a.batch}: {r['images_per_s']:7.1f} images/s "
                      f"({r['s_per_step']:.3f} s/step); 200 epochs x {STEPS_PER_EPOCH} steps: "
                      f"{r['hours_200_epochs']:.1f} h (training only)", flush=True)
    return out


if __name__ == "__main__":
    main()
