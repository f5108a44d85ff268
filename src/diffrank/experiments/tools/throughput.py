"""Training throughput of the benchmarks without Lightning: the step a run repeats (forward + backward + Adam),
timed on the configs ``python train.py experiment=<row>`` composes. Two subcommands (:func:`main`)::

    python -m diffrank.experiments.tools.throughput sorting [--data-dir DIR] [--batch 100] [--steps 20]
        [--precision 32-true|bf16-mixed] EXPERIMENT...
    python -m diffrank.experiments.tools.throughput topk [--rows ROW...] [--threads 1 2] [--steps 2] [--device cpu]
        [--head [ROW...]]

``sorting`` (:func:`measure_sorting`): the MNIST sorting benchmark in sets per second. Each experiment config is
composed (so operator, β and loss are the experiment's), the MNIST data module draws real batches, and the median
step time over ``--steps`` timed steps (after 3 warm-up steps) gives sets/s = batch / step time; ``--precision
bf16-mixed`` runs the forward and the loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``, as Lightning's
``bf16-mixed`` does (the backward and the Adam step outside it). Run it with ``OMP_NUM_THREADS`` set: the header
prints the thread count, e.g. ``OMP_NUM_THREADS=1 python -m diffrank.experiments.tools.throughput sorting --data-dir DIR
--batch 20 --steps 30 sorting/thesis_t3_7/odd_even_cauchy_n5``.

``topk`` (:func:`measure_topk`): the CIFAR-100 top-k protocol (Petersen et al. 2022, §5.1) in images/s of forward
+ backward + Adam step of the CIFAR ResNet-18 with a table row's loss, on generated CIFAR-100-format data, and the
time 200 epochs (47 500 training images after the 5 % held out, batch 128: 371 steps per epoch) would take at
that rate (training only; validation + test each epoch add about 12 500 forward passes). The rows are composed
exactly as ``python train.py experiment=<row>`` would (``topk/icml2022_t1/*``: ResNet-18 with the stem max-pool,
loss over all 100 classes), the batch goes through the data module's on-device augmentation (random crop + flip +
normalisation), so the number is the training loop's cost without Lightning. ``--head`` instead times the
ImageNet-1K linear heads of ``topk/icml2022_t2`` on generated embeddings (:func:`measure_head`, embeddings/s)::

    python -m diffrank.experiments.tools.throughput topk                       # CPU, 1 and 2 threads, three losses
    python -m diffrank.experiments.tools.throughput topk --threads 2 --steps 5 --rows softmax_ce dsn_uniform5
    python -m diffrank.experiments.tools.throughput topk --device cuda --steps 20   # on a GPU
    python -m diffrank.experiments.tools.throughput topk --head --threads 2         # ImageNet-1K linear heads

Every subcommand prints one line per measurement and :func:`main` returns the measurements (list of dicts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from diffrank.experiments.data.image_readers import write_random_cifar100
from diffrank.registry import config_dir

PRECISIONS = ("32-true", "bf16-mixed")  # sorting --precision: Lightning's names
STEPS_PER_EPOCH = (50000 - 2500) // 128  # whole batches per epoch (the loader drops the last partial one)


def _compose(overrides: list[str]) -> Any:
    """``configs/train.yaml`` with ``overrides`` (a fresh Hydra, as ``train.py`` composes it)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def _compose_topk(experiment: str, data_dir: Path, batch: int, val_size: int = 16) -> Any:
    # task_name is set: the rows' ${hydra:runtime.choices.experiment} needs a running Hydra app
    return _compose([f"experiment={experiment}", f"paths.data_dir={data_dir}", f"data.batch_size={batch}",
                     f"data.val_size={val_size}", "task_name=throughput"])


def _sorting_parts(experiment: str, data_dir: str | Path, batch: int, device: str) -> tuple[Any, Any, Any, Any]:
    """(data module set up, loss, model, optimizer) of a sorting experiment config, on ``device`` (CUDA: the
    training sets composed on the device, ``data.device_resident``)."""
    from diffrank.experiments.run.instantiate import instantiate

    cfg = _compose([f"experiment={experiment}", f"paths.data_dir={data_dir}", f"data.batch_size={batch}",
                    "data.val_sets=1", "data.test_sets=1", f"paths.output_dir={tempfile.gettempdir()}"])
    dm = instantiate(cfg.data)
    dm.device_resident = device.startswith("cuda")
    dm.setup()
    loss = instantiate(cfg.loss).to(device)  # with the operator its yaml interpolates
    model = instantiate(cfg.model, loss=loss).to(device)
    return dm, loss, model, model.hparams.optimizer(params=model.parameters())


def measure_sorting(experiment: str, data_dir: str | Path, batch: int, steps: int,
                    precision: str = "32-true", device: str = "cpu") -> tuple[float, float]:
    """(median seconds per step, sets per second) of one sorting experiment config: ``steps`` timed training
    steps (forward + loss + backward + Adam step, real MNIST batches) after 3 warm-up steps, in the current
    thread count.

    On CUDA the training sets are composed on the device, as ``trainer=gpu`` composes them
    (``data.device_resident``: the digit pool on the GPU, one ``SetKey`` per step), and the steps are timed
    together: the wall time of all timed steps, one synchronisation at their end, divided by ``steps`` (a
    synchronisation per step would add its own latency to a step of a few milliseconds).

    Args:
        experiment: an experiment config name, e.g. ``sorting/thesis_t3_7/odd_even_cauchy_n5``.
        data_dir: ``paths.data_dir`` (holds ``MNIST/raw``).
        batch: sets per step (``data.batch_size``).
        steps: timed steps.
        precision: ``32-true``, or ``bf16-mixed``: forward and loss under ``torch.autocast(<device>, bfloat16)``.
        device: ``"cpu"`` or ``"cuda"``.

    Raises:
        ValueError: ``steps`` < 1 or an unknown ``precision``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cuda = device.startswith("cuda")
    dm, loss, model, opt = _sorting_parts(experiment, data_dir, batch, device)
    bf16 = precision == "bf16-mixed"
    times, start = [], None
    for i, batch_ in enumerate(dm.train_dataloader()):
        if i == steps + 3:
            break
        if i == 3 and cuda:
            torch.cuda.synchronize()
            start = time.perf_counter()
        t = time.perf_counter()
        x, v = dm.transfer_batch_to_device(batch_, torch.device(device), 0)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            lv = loss(model(x), v)
        opt.zero_grad()
        lv.backward()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t)
    if len(times) < steps:
        raise ValueError(f"{experiment}: the training loader gave fewer than {steps + 3} batches of {batch} sets")
    if cuda:
        torch.cuda.synchronize()
        dt = (time.perf_counter() - start) / steps
    else:
        dt = statistics.median(times)
    return dt, batch / dt


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
    from diffrank.experiments.run.instantiate import instantiate

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    torch.set_num_threads(threads)
    cfg = _compose_topk(f"topk/icml2022_t2/{row}", Path(tempfile.gettempdir()), batch)  # the cache is never read
    loss = instantiate(cfg.loss)
    head = instantiate(cfg.model.net).to(device)
    opt = torch.optim.Adam(head.parameters(), lr=cfg.model.optimizer.lr)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch * (steps + 1), head.in_features, generator=gen).to(device)
    y = torch.randint(0, head.out_features, (len(x),), generator=gen).to(device)
    value = torch.zeros(())

    def step(i: int) -> None:
        """One timed training step on batch ``i`` (forward, backward, optimizer step)."""
        nonlocal value
        sl = slice(i * batch, (i + 1) * batch)
        value = loss(head(x[sl]), y[sl])
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()

    per_step = _timed_steps(step, steps, device)
    return {"row": row, "threads": threads, "device": device, "batch": batch, "steps": steps,
            "s_per_step": per_step, "embeddings_per_s": batch / per_step, "loss": value.item()}


def measure_topk(row: str, threads: int, steps: int, batch: int, device: str, data_dir: Path) -> dict[str, Any]:
    """Images/s of ``steps`` timed training steps (after one warm-up step) of ``topk/icml2022_t1/<row>``.

    Raises:
        ValueError: ``steps`` < 1.
    """
    from diffrank.experiments.run.instantiate import instantiate

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    torch.set_num_threads(threads)
    cfg = _compose_topk(f"topk/icml2022_t1/{row}", data_dir, batch)
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
        """One timed training step on batch ``i`` (forward, backward, optimizer step)."""
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


def _sorting(a: argparse.Namespace) -> list[dict[str, Any]]:
    from diffrank.experiments.run.malloc import keep_freed_memory

    if not a.glibc_mmap:
        keep_freed_memory()
    mmap = "on" if a.glibc_mmap else "off"
    print(f"torch threads: {torch.get_num_threads()}, batch {a.batch} sets, precision {a.precision}, "
          f"glibc mmap {mmap}")
    out = []
    for e in a.experiments:
        dt, sps = measure_sorting(e, a.data_dir, a.batch, a.steps, a.precision, a.device)
        out.append({"experiment": e, "device": a.device, "threads": torch.get_num_threads(), "batch": a.batch,
                    "steps": a.steps, "precision": a.precision, "s_per_step": dt, "sets_per_s": sps})
        print(f"{e:45s} {dt * 1e3:8.1f} ms/step {sps:8.1f} sets/s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


def _topk(a: argparse.Namespace) -> list[dict[str, Any]]:
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
        n = 16 + a.batch * (a.steps + 1)
        write_random_cifar100(Path(tmp), n_train=n, n_test=n)
        for threads in a.threads:
            for row in a.rows:
                r = measure_topk(row, threads, a.steps, a.batch, a.device, Path(tmp))
                out.append(r)
                print(f"{row:20s} {a.device} {threads} thread(s), batch {a.batch}: {r['images_per_s']:7.1f} images/s "
                      f"({r['s_per_step']:.3f} s/step); 200 epochs x {STEPS_PER_EPOCH} steps: "
                      f"{r['hours_200_epochs']:.1f} h (training only)", flush=True)
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Command line: ``python -m diffrank.experiments.tools.throughput {sorting,topk} ...``; returns the
    measurements."""
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.tools.throughput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sorting", help="MNIST sorting benchmark: sets/s of experiment configs")
    s.add_argument("experiments", nargs="+", help="experiment configs, e.g. sorting/thesis_t3_7/odd_even_cauchy_n5")
    s.add_argument("--data-dir", default="data", help="paths.data_dir (holds MNIST/raw)")
    s.add_argument("--batch", type=int, default=100)
    s.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up steps)")
    s.add_argument("--precision", choices=PRECISIONS, default="32-true",
                   help="bf16-mixed: forward and loss under torch.autocast(<device>, bfloat16), as Lightning's")
    s.add_argument("--device", default="cpu", help="cuda: sets composed on the device (trainer=gpu's data path)")
    s.add_argument("--json", help="also write the measurements to this JSON file")
    s.add_argument("--glibc-mmap", action="store_true",
                   help="leave glibc's mmap/munmap of large blocks on (train.py turns it off)")
    t = sub.add_parser("topk", help="CIFAR-100 ResNet-18 images/s, or ImageNet linear heads (--head)")
    t.add_argument("--rows", nargs="+", default=["softmax_ce", "dsn_uniform5", "sinkhorn_uniform5"],
                   help="rows of topk/icml2022_t1 (their loss and operator)")
    t.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    t.add_argument("--steps", type=int, default=2, help="timed steps per measurement (after one warm-up)")
    t.add_argument("--batch", type=int, default=128)
    t.add_argument("--device", default="cpu")
    t.add_argument("--head", nargs="*", metavar="ROW", default=None,
                   help="instead: the ImageNet-1K linear head of these topk/icml2022_t2 rows (default: softmax, "
                        "NeuralSort, DSN and Sinkhorn at [.5,0,0,0,.5]), batch 500 unless --batch is given")
    a = ap.parse_args(argv)
    return _sorting(a) if a.command == "sorting" else _topk(a)


if __name__ == "__main__":
    main()
