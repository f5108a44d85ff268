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


def _compose(row: str, data_dir: Path, batch: int) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        # task_name is set: the rows' ${hydra:runtime.choices.experiment} needs a running Hydra app
        return compose(config_name="train", overrides=[
            f"experiment=topk/icml2022_t1/{row}", f"paths.data_dir={data_dir}", f"data.batch_size={batch}",
            "data.val_size=16", "task_name=throughput"])


def measure(row: str, threads: int, steps: int, batch: int, device: str, data_dir: Path) -> dict[str, Any]:
    """Images/s of ``steps`` timed training steps (after one warm-up step) of ``topk/icml2022_t1/<row>``.

    Raises:
        ValueError: ``steps`` < 1.
    """
    from diffrank.utils.instantiate import instantiate

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    torch.set_num_threads(threads)
    cfg = _compose(row, data_dir, batch)
    dm = instantiate(cfg.data)
    dm.setup()
    loss = instantiate(cfg.loss)
    net = instantiate(cfg.model.net).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loader = dm.train_dataloader()

    class _T:  # the trainer fields the augmentation reads
        training, global_rank, current_epoch, global_step = True, 0, 0, 0

    dm.trainer = _T()
    batches = iter(loader)
    times = []
    for step in range(steps + 1):
        x, y = next(batches)
        _T.global_step = step
        t0 = time.perf_counter()
        x, y = dm.on_after_batch_transfer((x.to(device), y.to(device)), 0)
        value = loss(net(x), y)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    per_step = sum(times[1:]) / steps
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
    a = ap.parse_args(argv)
    out = []
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
