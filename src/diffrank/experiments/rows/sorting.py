"""Write the sorting benchmark's table rows: ``configs/experiment/sorting/<table>/<row>.yaml``.

A row includes its protocol (``sorting/mnist`` or ``sorting/svhn``, hand-written: data, model with its loss and
selection metric, optimiser, steps; everything but the operator's own parameters), selects its operator and
writes only what differs from that composition: the operator's parameters, n, the table's deviations from the
protocol (steps, batch, learning rate, loss form), ``paper_method`` and the ``paper:`` key, whose fields are
columns of ``src/diffrank/reference/*.csv`` (``python -m diffrank.experiments.analysis.report`` matches a run to those
rows).

Sources: thesis Tables 2.1 (§2.3: relaxed bubble sort, with the Det. NeuralSort and Optimal Transport
baselines), 3.3, 3.4 (SVHN), 3.5, 3.6, 3.7, 7.2 (RESGRO) and 7.3 (Regular and Newton-loss rows), the β of
Table 3.8 read from ``sorting_thesis_table3_8_beta.csv`` and the ART rule β = 2 · layers; LapSum (ICML 2025)
Table 4 (all six methods). SVHN rows (name prefix ``svhn_``) use the MNIST β of Table 3.8 where the thesis gives
none.

Usage: ``python -m diffrank.experiments.rows.sorting [--out DIR]`` (rewrites the table folders (:data:`FOLDERS`)
of :func:`diffrank.registry.config_dir`, the checkout's ``configs/`` in an editable install; commit them).
``tests/experiments/rows/test_rows.py`` checks that the committed files equal the generator's output.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from diffrank import reference
from diffrank.experiments.rows.writer import Row, generate, render_rows
from diffrank.registry import config_dir

FOLDERS = ("thesis_t2_1", "thesis_t3_3", "thesis_t3_4", "thesis_t3_5", "thesis_t3_6", "thesis_t3_7", "thesis_t7_2",
          "thesis_t7_3", "lapsum_t4")
THESIS = "petersen_thesis_2022"
NETWORKS = ("odd_even", "bitonic")
# thesis sigmoid id (reference CSVs) -> (our operator's sigmoid, β_code / β_thesis, short name, Table 3.7 method)
SIGMOIDS = {"logistic": ("logistic", 1.0, "logistic", "Diffsort (Logistic)"),
            "logistic_art": ("logistic_phi", 1.0, "art", "Diffsort (Log. w/ ART)"),
            "reciprocal": ("reciprocal", 4.0, "reciprocal", "Reciprocal Sigmoid"),
            "cauchy": ("cauchy", 1.0, "cauchy", "Cauchy CDF"),
            "optimal": ("optimal", 1.0, "optimal", "Optimal Sigmoid")}
ART_METHOD = {"odd_even": "ART (odd-even)", "bitonic": "ART (bitonic)"}
# baselines without a published temperature: τ = 1 (β = 1) for NeuralSort / SoftSort / LapSum (LapSum's
# script: α = 1), ε = 0.01 on the squashed scores for Sinkhorn (its config default), ε = 1 for Fast Sort & Rank;
# the stochastic variants at their deterministic twin's β, so that they differ from it only by the noise
BASELINE_BETA = {"neuralsort": 1.0, "softsort": 1.0, "sinkhorn": 100.0, "fast_soft_sort": 1.0, "lapsum": 1.0,
                 "neuralsort_stochastic": 1.0, "gumbel_sinkhorn": 100.0}
# the stochastic baselines' samples per set: Grover et al.'s run_sort.py default (n_s = 5), for both
STOCHASTIC = {"neuralsort_stochastic": {"samples": 5}, "gumbel_sinkhorn": {"samples": 5}}
BASELINES_33 = (("neuralsort_stochastic", "Stoch. NeuralSort"), ("neuralsort", "Det. NeuralSort"),
                ("sinkhorn", "Optimal Transport"), ("fast_soft_sort", "Fast Sort & Rank"))
LOSS = {"fast_soft_sort": "sort_rank_mse",  # operators without P train on soft ranks
        "relaxed_bubble_sort": "sort_swaps"}  # thesis §2.3: the relaxed swap count is the loss
# thesis Table 7.3's Newton-loss rows: paper method -> the newton group's choice
NEWTON = {"NL (Hessian)": "hessian", "NL (Fisher)": "fisher"}


def layers(network: str, n: int) -> int:
    """Comparator layers: n (odd-even), log2 n (1 + log2 n) / 2 (bitonic, n a power of 2)."""
    if network == "odd_even":
        return n
    k = math.ceil(math.log2(n))
    return k * (k + 1) // 2


@cache
def table_3_8() -> dict[tuple[str, str, int], tuple[float, str]]:
    """Table 3.8 from the reference CSV: ``{(thesis sigmoid, network, n): (β, β as printed)}`` on the thesis
    scale; a Cauchy β noted as a multiple of π (``= 51pi``) is that exact multiple, printed ``51π``."""
    out = {}
    for r in reference.load_table("sorting_thesis_table3_8_beta"):
        pi = re.match(r"=\s*([\d.]+)\s*pi", r["note"])
        out[(r["sigmoid"], r["network"], int(r["n"]))] = \
            (float(pi[1]) * math.pi, f"{pi[1]}π") if pi else (float(r["value"]), r["value"])
    return out


def _dataset(protocol: str) -> str:
    return "mnist4" if protocol == "mnist" else "svhn"


def _prefix(protocol: str) -> str:
    return "" if protocol == "mnist" else "svhn_"


def art_rows(table: str, protocol: str, ns: dict[str, tuple[int, ...]]) -> list[Row]:
    """Tables 3.3 / 3.4: σ∘φ ART (λ = 0.25), β = 2 · layers, both networks."""
    return [_row(f"thesis_t{table.replace('.', '_')}/{_prefix(protocol)}{network}_art_n{n}",
                f"σ∘φ ART ({network}), n = {n}, λ = 0.25, β = 2·layers = {2 * layers(network, n)}",
                f"diffsort_{network}", {"paper": THESIS, "table": table, "dataset": _dataset(protocol),
                                        "method": ART_METHOD[network], "n": n}, n, protocol,
                {"beta": float(2 * layers(network, n)), "sigmoid": "logistic_phi", "art_lambda": 0.25})
            for network in NETWORKS for n in ns[network]]


def baseline_rows(table: str, protocol: str, methods: tuple[tuple[str, str], ...], ns: tuple[int, ...],
                  **settings: Any) -> list[Row]:
    """NeuralSort / Sinkhorn / Fast Sort & Rank rows of Tables 3.3, 3.4, 3.7."""
    return [_row(f"thesis_t{table.replace('.', '_')}/{_prefix(protocol)}{op}_n{n}", f"{method}, n = {n}", op,
                {"paper": THESIS, "table": table, "dataset": _dataset(protocol), "method": method, "n": n}, n,
                protocol, {"beta": BASELINE_BETA[op], **STOCHASTIC.get(op, {})}, settings)
            for op, method in methods for n in ns]


def ablation_rows(protocol: str) -> list[Row]:
    """Table 3.6: ART ablation, λ = 0 (plain logistic) vs 0.25, β = 2 · layers."""
    rows = []
    for network in NETWORKS:
        for n in (4, 32):
            for lam, sig in ((0, "logistic"), (0.25, "logistic_art")):
                beta = 2 * layers(network, n)
                params = {"beta": float(beta), "sigmoid": SIGMOIDS[sig][0], "art_lambda": float(lam) or 0.25}
                rows.append(_row(
                    f"thesis_t3_6/{_prefix(protocol)}{network}_lambda{str(lam).replace('.', '')}_n{n}",
                    f"ART ablation, {network}, n = {n}, λ = {lam}, β = 2·layers = {beta}", f"diffsort_{network}",
                    {"paper": THESIS, "table": "3.6", "dataset": _dataset(protocol), "network": network,
                     "sigmoid": sig, "n": n}, n, protocol, params))
    return rows


def monotonic_rows(protocol: str, steps: int) -> list[Row]:
    """Table 3.7: the five sigmoids × networks / n at the β of Table 3.8 (SVHN: n <= 16, MNIST's β)."""
    rows = []
    for sig, (ours, scale, short, method) in SIGMOIDS.items():
        for (s, network, n), (beta, printed) in table_3_8().items():
            if s != sig or (protocol == "svhn" and n == 32):  # SVHN n = 32 is omitted in the thesis
                continue
            source = "Table 3.8" + ("" if protocol == "mnist" else ", MNIST's: the thesis gives none for SVHN")
            rows.append(_row(
                f"thesis_t3_7/{_prefix(protocol)}{network}_{short}_n{n}",
                f"{method} ({network}), n = {n}, β = {printed} ({source}"
                + (f"; × {scale:g} for our reciprocal)" if scale != 1 else ")"),
                f"diffsort_{network}", {"paper": THESIS, "table": "3.7", "dataset": _dataset(protocol),
                                        "method": method, "network": network, "n": n}, n, protocol,
                {"beta": beta * scale, "sigmoid": ours, "art_lambda": 0.25}, {"trainer.max_steps": steps}))
    return rows


def table_2_1() -> list[Row]:
    """Table 2.1 (§2.3, MNIST, 10 runs): the relaxed bubble sort at β = 8 ("we only optimize the inverse
    temperature for n = 5, resulting in β = 8, and fix this for all other n"), Adam 10^-4, "between 1.5·10^5
    and 1.5·10^6" iterations -> 1.5·10^5 (the lower end); the baselines (copied from Cuturi et al. 2019) at
    the protocol's settings. The bubble sort trains on its relaxed swap count as in the thesis (loss=sort_swaps,
    :class:`diffrank.losses.sorting.BubbleSwapLoss`)."""
    bubble = [_row(f"thesis_t2_1/relaxed_bubble_sort_n{n}",
                  f"Relaxed Bubble Sort, n = {n}, β = 8 (tuned for n = 5), Adam 1e-4, 1.5e5 steps",
                  "relaxed_bubble_sort", {"paper": THESIS, "table": "2.1", "dataset": "mnist4",
                                          "method": "Relaxed Bubble Sort", "n": n}, n,
                  params={"beta": 8.0, "sigmoid": "logistic", "early_exit": True},
                  settings={"model.optimizer.lr": 1e-4, "trainer.max_steps": 150000})
              for n in (3, 5, 7)]
    baselines = baseline_rows("2.1", "mnist", BASELINES_33[:3], (3, 5, 7))
    return [*bubble, *baselines]


def table_3_5() -> list[Row]:
    """Table 3.5 (large n, bitonic σ∘φ, EM5 after 1e4 steps, 10 runs): one config per column; the β rows are a
    sweep ``operator.beta=30,32.5,35,37.5,40`` — the paper key's ``setting`` interpolates β, so each job
    matches its own cell (β must be given as printed: 30, not 30.0)."""
    columns = [(0.25, 32, 128, "fixed_images"), (0.4, 32, 128, "fixed_images"), (0.4, 64, 64, "fixed_images"),
               (0.4, 128, 32, "fixed_images"), (0.4, 256, 16, "fixed_images"), (0.4, 512, 8, "fixed_images"),
               (0.4, 1024, 4, "both"), (0.4, 32, 4, "fixed_batch"), (0.4, 64, 4, "fixed_batch"),
               (0.4, 128, 4, "fixed_batch"), (0.4, 256, 4, "fixed_batch"), (0.4, 512, 4, "fixed_batch")]
    return [_row(f"thesis_t3_5/bitonic_lambda{str(lam).replace('.', '')}_n{n}_b{batch}",
                f"bitonic σ∘φ ART, λ = {lam}, n = {n}, batch {batch}; sweep operator.beta=30,32.5,35,37.5,40",
                "diffsort_bitonic",
                {"paper": THESIS, "table": "3.5", "dataset": "mnist4", "n": n,
                 "setting": f"lambda={lam};batch={batch};beta=${{operator.beta}};steps=1e4;half={half}"}, n,
                params={"beta": 30, "sigmoid": "logistic_phi", "art_lambda": lam},
                # about 25 000 / 50 000 evaluation images whatever n (EM5 uses the n-sets' 5-chunks)
                settings={"data.batch_size": batch, "data.val_sets": max(10, 25000 // n),
                          "data.test_sets": max(10, 50000 // n), "data.eval_batch_size": max(1, min(100, 4096 // n)),
                          "trainer.max_steps": 10000})
            for lam, n, batch, half in columns]


def table_7_2() -> list[Row]:
    """Table 7.2: RESGRO with Kendall's τ as the objective (no ranking operator), n = 5, 10; Adam 1e-3, 1e5 steps,
    batch 100 as Table 7.3 (the thesis gives the setting for both tables together); one-set, 30 samples, σ = 1
    (``configs/loss/resgro.yaml``; not printed in the thesis)."""
    return [_row(f"thesis_t7_2/resgro_n{n}", f"RESGRO, Kendall's τ objective, n = {n}, Adam 1e-3", None,
                {"paper": THESIS, "table": "7.2", "dataset": "mnist4", "method": "RESGRO", "n": n}, n,
                settings={"model.optimizer.lr": 1e-3}, method_loss="resgro")
            for n in (5, 10)]


def table_7_3() -> list[Row]:
    """Table 7.3: Regular, NL (Hessian) and NL (Fisher) rows: Adam 1e-3, 1e5 steps, batch 100; DSNs odd-even
    (inferred) at the β of Table 3.8 for n = 5 (none is given for n = 10: the n = 9 value is used). The Newton rows
    select ``newton=hessian`` / ``fisher`` with the group's λ (the thesis does not print it). The Hessian rows of
    the sorting networks run the network in plain autograd ops (``operator.twice_differentiable``): the fused
    Function has no double backward (docs/newton.md)."""
    return [row for method in ("Regular", *NEWTON) for row in _table_7_3(method)]


def _table_7_3(method: str) -> list[Row]:
    newton = NEWTON.get(method)
    suffix = f"_{newton}" if newton else ""
    rows = []
    for n in (5, 10):
        for op, sig in (("diffsort_odd_even", "cauchy"), ("diffsort_odd_even", "logistic"),
                        ("neuralsort", None), ("softsort", None)):
            if sig:
                m = min(n, 9)
                beta, printed = table_3_8()[(sig, "odd_even", m)]
                params, key = {"beta": beta, "sigmoid": sig}, {"operator": "dsn", "sigmoid": sig}
                if newton in ("hessian", "elementwise_hessian"):  # the fused network has no double backward
                    params["twice_differentiable"] = True
                short = f"odd_even_{sig}"
                title = f"odd-even, {sig}, n = {n}, β = {printed} (Table 3.8, n = {m})"
            else:
                params, key, short, title = {"beta": BASELINE_BETA[op]}, {"operator": op}, op, f"{op}, n = {n}"
            rows.append(_row(f"thesis_t7_3/{short}_n{n}{suffix}", f"{title}, {method}, Adam 1e-3", op,
                            {"paper": THESIS, "table": "7.3", "dataset": "mnist4", "method": method, **key, "n": n},
                            n, params=params, settings={"model.optimizer.lr": 1e-3}, newton=newton))
    return rows


def table_4() -> list[Row]:
    """LapSum (ICML 2025) Table 4, one row per (method, n) of ``lapsum_icml2025_table4.csv``: the authors' script
    (gmum/LapSum ``experiments_of_paper/soft-permutation``): batch 20, Adam 1e-3, 200 epochs of 625 steps
    (= 125 000 steps; validation once per epoch), selection on the validation EM at n (no EM5 in the table, so no
    5-sets are drawn), the row-wise permutation CE (``loss.form=ce_rows``). LapSum α = 1 (their script: β = 1,
    not trained, no noise); the baselines, whose cells LapSum copies from Grover et al. (2019), at
    :data:`BASELINE_BETA` / :data:`STOCHASTIC` (docs/sorting_benchmark.md); the vanilla row-stochastic baseline is a
    model (``model=sorting_row_stochastic``, ``loss=sort_rows_ce``), no operator."""
    settings = {"data.batch_size": 20, "model.optimizer.lr": 1e-3, "trainer.max_steps": 125000,
                "trainer.val_check_interval": 625, "optimized_metric": "val/em", "data.em5": False}
    out, seen = [], set()
    for r in reference.load_table("lapsum_icml2025_table4"):
        op, n = r["operator"], int(r["n"])
        if (op, n) in seen:
            continue
        seen.add((op, n))
        paper = {"paper": r["paper"], "table": "4", "dataset": "mnist4", "method": r["method"], "n": n}
        if op == "row_stochastic":
            out.append(_row(f"lapsum_t4/{op}_n{n}", f"{r['method']}, n = {n}, CNN + 3 linear n² layers, row "
                            "softmax, CE over rows, batch 20, Adam 1e-3, 125 000 steps", None, paper, n,
                            settings=settings, method_loss="sort_rows_ce", model="sorting_row_stochastic"))
            continue
        params = {"beta": BASELINE_BETA[op], **STOCHASTIC.get(op, {})}
        out.append(_row(f"lapsum_t4/{op}_n{n}", f"{r['method']}, n = {n}, CE over rows, batch 20, Adam 1e-3, "
                        "125 000 steps", op, paper, n, params=params,
                        settings={**settings, "loss.form": "ce_rows"}))
    return out


def rows() -> list[Row]:
    """Every row of every table."""
    art_ns = {"odd_even": (2, 3, 4, 5, 7, 8, 9, 15, 16, 32), "bitonic": (2, 4, 8, 16, 32)}
    svhn_ns = {"odd_even": (2, 4, 8, 16, 32), "bitonic": (2, 4, 8, 16, 32)}
    baselines_37 = (("neuralsort", "NeuralSort"), ("sinkhorn", "Sinkhorn Sort"))
    return [
        *table_2_1(),
        # Table 3.3: 'up to 1e6' steps -> the code default 1e5 (the protocol's)
        *art_rows("3.3", "mnist", art_ns), *baseline_rows("3.3", "mnist", BASELINES_33, (3, 5, 7, 9, 15)),
        *art_rows("3.4", "svhn", svhn_ns), *baseline_rows("3.4", "svhn", BASELINES_33[1:], (2, 4, 8, 16, 32)),
        *table_3_5(), *ablation_rows("mnist"), *ablation_rows("svhn"),
        *monotonic_rows("mnist", 200000), *monotonic_rows("svhn", 1000000),
        *baseline_rows("3.7", "mnist", baselines_37, (3, 5, 7, 9, 15, 32), **{"trainer.max_steps": 200000}),
        *baseline_rows("3.7", "mnist", (("fast_soft_sort", "Fast Sort & Rank"),), (3, 5, 7, 9, 15),
                       **{"trainer.max_steps": 200000}),
        *table_7_2(), *table_7_3(), *table_4(),
    ]


# ---- rendering: only what differs from the protocol composed with the row's operator and loss ----

def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@cache
def _base(protocol: str, operator: str | None, loss: str | None, model: str | None = None) -> dict[str, Any]:
    """The flattened config of ``experiment=sorting/<protocol> operator=<operator or null> [loss=<loss>]
    [model=<model>]``."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = [f"experiment=sorting/{protocol}", f"operator={operator}" if operator else "~operator",
                 *([f"loss={loss}"] if loss else []), *([f"model={model}"] if model else [])]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    return _flatten(OmegaConf.to_container(cfg, resolve=False))




def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def _row(name: str, title: str, operator: str | None, paper: dict[str, Any], n: int, protocol: str = "mnist",
         params: dict[str, Any] | None = None, settings: dict[str, Any] | None = None, newton: str | None = None,
         method_loss: str | None = None, model: str | None = None) -> Row:
    """One sorting row: ``experiment=sorting/<protocol>`` with ``operator`` (None: a row whose method is its loss,
    ``method_loss``, e.g. RESGRO), the loss the operator needs (:data:`LOSS`; else the protocol's ``sort_bce``) and
    the Newton loss ``newton`` it trains with (Table 7.3) and its ``model`` (None: the protocol's; LapSum Table 4's
    vanilla row: ``sorting_row_stochastic``); its keys are only what differs from that composition:
    the operator's ``params``, n, the ``settings`` (dotted: ``{"trainer.max_steps": 200000}``), ``paper_method``
    and the ``paper`` key."""
    loss = method_loss or LOSS.get(operator)
    base = _base(protocol, operator, loss, model)
    wanted = {**{f"operator.{k}": v for k, v in (params or {}).items()}, **(settings or {})}
    differs = {k: v for k, v in wanted.items() if base.get(k) != v or type(base.get(k)) is not type(v)}
    keys = {"paper_method": operator or method_loss, "paper": paper,
            **_nest({**{k: v for k, v in differs.items() if k.startswith("operator.")}, "data.n": n,
                     **{k: v for k, v in differs.items() if not k.startswith("operator.")}})}
    source = "LapSum (Struski et al. 2025) Table 4" if paper["paper"] != THESIS else \
        f"Thesis Table {paper['table']} ({'MNIST' if protocol == 'mnist' else 'SVHN'})"
    choices = {"operator": operator, **({"model": model} if model else {}), **({"loss": loss} if loss else {}),
               **({"newton": newton} if newton else {})}
    return Row(name, f"{source}: {title}", f"/experiment/sorting/{protocol}", choices, keys)


def render() -> dict[str, str]:
    """``{path relative to configs/experiment/sorting: yaml text}`` of every row.

    Raises:
        ValueError: two rows share a name.
    """
    return render_rows(rows(), "sorting")


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """``python -m diffrank.experiments.rows.sorting [--out DIR]``: rewrite the table folders (stale rows
    removed); returns what was written."""
    return generate("sorting", FOLDERS, render, argv)


if __name__ == "__main__":
    main()
