"""Per-step cost of the Newton losses (thesis §7.3) relative to the plain loss: prints a markdown table.

Times one training step's loss part (forward + backward of the loss with respect to the network's output y)
and whole training steps of the thesis' networks: M1 (5-layer fully connected ReLU, width 100, on 28×28 inputs,
SGD) for classification, the sorting CNN on four-digit MNIST sets (1 × 28 × 112, Adam; n = 5 and 10) and
CombResNet18 on 3 × 96 × 96 Warcraft maps (Adam; the loss rows of the Warcraft algorithms at d = k² = 144), for the
plain loss and each Newton variant. Median of ``--repeats`` timed steps after warm-up (``--step-repeats`` for the
whole steps), CPU, ``--threads`` threads. A benchmark to read, not a timed test.

    python -m diffrank.experiments.tools.newton_benchmark --threads 1 --repeats 30              # every row
    python -m diffrank.experiments.tools.newton_benchmark --suite ch7 --threads 1 --repeats 10  # sorting, Warcraft
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from diffrank.losses.newton import NewtonLoss
from diffrank.losses.softmax_ce import SoftmaxCrossEntropyLoss
from diffrank.losses.sorting import SortingBCELoss
from diffrank.losses.topk_cross_entropy import TopKCrossEntropyLoss
from diffrank.operators import load

VARIANTS = ("plain", "hessian", "fisher", "elementwise_hessian")


def cases():
    """(name, loss, make_batch) for the loss rows of the throughput table (docs/newton.md)."""
    def classification(b, n):
        """Batches of B logits (B, n) and class labels (B,)."""
        return lambda: (torch.randn(b, n), torch.randint(0, n, (b,)))

    def sorting(b, n):
        """Batches of B score rows (B, n) and the values they rank (B, n)."""
        return lambda: (torch.randn(b, n), torch.randn(b, n))

    yield "softmax CE, MNIST (B 128, d 10)", SoftmaxCrossEntropyLoss(), classification(128, 10)
    yield "softmax CE, digits100 (B 128, d 100)", SoftmaxCrossEntropyLoss(), classification(128, 100)
    for n in (5, 10):
        for op in ("neuralsort", "softsort", "diffsort_odd_even"):
            yield f"sort_bce {op} (B 100, d = n = {n})", SortingBCELoss(load(op)), sorting(100, n)
        # the network in plain autograd ops: what the Hessian rows of Table 7.3 run
        yield (f"sort_bce diffsort_odd_even twice_differentiable (B 100, d = n = {n})",
               SortingBCELoss(load("diffsort_odd_even", twice_differentiable=True)), sorting(100, n))
    yield ("topk_ce sinkhorn half_top5, m 16 (B 128, n 100, d = m = 16)",
           TopKCrossEntropyLoss(load("sinkhorn"), [0.5, 0, 0, 0, 0.5], m=16), classification(128, 100))


def _time(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def loss_step(loss, batch):
    """Forward + backward of the loss with respect to the output y."""
    y0, target = batch

    def step():
        """One timed step (forward, backward and, where there is an optimiser, its update)."""
        y = y0.clone().requires_grad_(True)
        loss(y, target).backward()

    return step


def m1_step(loss, batch):
    """One SGD step of M1 (5 × Linear(·, 100) + ReLU, then Linear(100, 10)) on a 28×28 batch."""
    _, target = batch
    x = torch.randn(len(target), 784)
    layers, width = [], 784
    for _ in range(5):
        layers += [nn.Linear(width, 100), nn.ReLU()]
        width = 100
    net = nn.Sequential(*layers, nn.Linear(100, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)

    def step():
        """One timed step (forward, backward and, where there is an optimiser, its update)."""
        opt.zero_grad()
        loss(net(x), target).backward()
        opt.step()

    return step


def sorting_step(loss, batch):
    """One Adam step of the sorting CNN (MultiDigitCNN, MNIST shapes) on ``B`` sets of n four-digit images."""
    from diffrank.experiments.models.sorting import MultiDigitCNN

    images, values = batch
    net = MultiDigitCNN((1, 28, 112))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        """One timed step (forward, backward and, where there is an optimiser, its update)."""
        opt.zero_grad()
        b, n = values.shape
        loss(net(images.flatten(0, 1)).view(b, n), values).backward()
        opt.step()

    return step


def warcraft_step(loss, batch):
    """One Adam step of CombResNet18 on ``B`` 3 × 96 × 96 maps through a Warcraft algorithm's loss."""
    from diffrank.experiments.models.shortest_path import CombResNet18

    maps, paths = batch
    net = CombResNet18(grid=12)
    opt = torch.optim.Adam(net.parameters(), lr=5e-4)

    def step():
        """One timed step (forward, backward and, where there is an optimiser, its update)."""
        opt.zero_grad()
        loss(net(maps), paths).backward()
        opt.step()

    return step


def ch7_rows(tikhonov: float):
    """(name, {variant: loss or None = not run}, make_batch, kind) of the sorting steps and the Warcraft losses."""
    from diffrank.experiments.algorithms.bellman_ford import RelaxedBellmanFord
    from diffrank.experiments.algorithms.dijkstra import shortest_paths
    from diffrank.experiments.algorithms.newton import NewtonAlgorithm
    from diffrank.experiments.algorithms.perturbed import PerturbedFenchelYoung
    from diffrank.experiments.algorithms.sampling import SmoothedAlgorithmDijkstra, SmoothedLossDijkstra

    def sets(b, n):
        """Batches of B sets of n four-digit images (B, n, 1, 28, 112) and their values (B, n)."""
        return lambda: (torch.rand(b, n, 1, 28, 112), torch.randint(0, 10000, (b, n)))

    for n in (5, 10):
        for op in ("neuralsort", "diffsort_odd_even"):
            loss = SortingBCELoss(load(op))
            yield (f"whole Adam step, sorting CNN, sort_bce {op} (B 100 sets, n = {n})",
                   {v: loss if v == "plain" else NewtonLoss(loss, v, tikhonov) for v in VARIANTS}, sets(100, n),
                   sorting_step)

    def warcraft(b, maps=False):
        """Batches of B Warcraft inputs (maps (B, 3, 96, 96), or costs (B, 12, 12)) and their shortest paths."""
        def make():
            """One batch: (inputs, true shortest-path indicators (B, 12, 12))."""
            true = torch.rand(b, 12, 12) * 9 + 0.5
            x = torch.rand(b, 3, 96, 96) if maps else torch.rand(b, 12, 12) * 5 + 0.1
            return x, shortest_paths(true)
        return make

    algorithms = {"relaxed Bellman-Ford (T 25, for, l2sq)": (RelaxedBellmanFord(), ("fisher",)),
                  "PO w/ FY, 3 samples": (PerturbedFenchelYoung(samples=3),
                                          ("hessian", "fisher", "elementwise_hessian")),
                  "SS of loss, 10 samples": (SmoothedLossDijkstra(samples=10), ("hessian", "fisher")),
                  "SS of algorithm, 10 samples": (SmoothedAlgorithmDijkstra(samples=10), ("fisher",))}
    for name, (alg, variants) in algorithms.items():
        losses = {v: (alg.loss if v == "plain" else NewtonAlgorithm(alg, v, tikhonov).loss)
                  if v == "plain" or v in variants else None for v in VARIANTS}
        yield f"loss fwd+bwd: Warcraft {name} (B 70, d = 144)", losses, warcraft(70), loss_step
    alg = RelaxedBellmanFord()
    yield ("whole Adam step, CombResNet18, relaxed Bellman-Ford (B 70 maps)",
           {"plain": alg.loss, "hessian": None, "fisher": NewtonAlgorithm(alg, "fisher", tikhonov).loss,
            "elementwise_hessian": None}, warcraft(70, maps=True), warcraft_step)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--step-repeats", type=int, default=10, help="repeats of the sorting / Warcraft steps")
    parser.add_argument("--tikhonov", type=float, default=0.01)
    parser.add_argument("--suite", choices=("all", "ch7"), default="all",
                        help="ch7: only the sorting steps and the Warcraft rows")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print(f"CPU, {args.threads} thread(s), torch {torch.__version__}, median of {args.repeats} steps, "
          f"tikhonov {args.tikhonov}; ms per step (× the plain loss)\n")
    print("| what is timed | plain | hessian | fisher | elementwise_hessian |")
    print("|---|---|---|---|---|")
    rows = [(f"loss fwd+bwd: {name}", {v: loss if v == "plain" else NewtonLoss(loss, v, args.tikhonov)
                                       for v in VARIANTS}, batch, loss_step) for name, loss, batch in cases()]
    ce = SoftmaxCrossEntropyLoss()
    rows.insert(1, ("whole SGD step of M1, softmax CE, MNIST shapes (B 128)",
                    {v: ce if v == "plain" else NewtonLoss(ce, v, args.tikhonov) for v in VARIANTS},
                    lambda: (None, torch.randint(0, 10, (128,))), m1_step))
    if args.suite == "ch7":
        rows = []
    rows += list(ch7_rows(args.tikhonov))
    for name, losses, make_batch, kind in rows:
        batch = make_batch()
        cells, base = [], None
        repeats = args.step_repeats if kind in (sorting_step, warcraft_step) else args.repeats
        for variant in VARIANTS:
            wrapped = losses[variant]
            if wrapped is None:
                cells.append("—")
                continue
            try:
                ms = _time(kind(wrapped, batch), repeats)
            except ValueError as err:
                cells.append("refused (custom autograd Function)" if "custom autograd" in str(err) else f"error: {err}")
                continue
            base = ms if variant == "plain" else base
            cells.append(f"{ms:.2f}" if variant == "plain" else f"{ms:.2f} (×{ms / base:.1f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
