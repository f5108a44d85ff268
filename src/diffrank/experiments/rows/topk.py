"""Write the top-k classification rows of Petersen et al. (ICML 2022) Tables 1-6,
``configs/experiment/topk/icml2022_t<N>/<row>.yaml``, and the Lap-Top-k rows of LapSum (Struski et al., ICML 2025)
Tables 1-2, ``configs/experiment/topk/lapsum_t<N>/<row>.yaml``.

A row includes its protocol (hand-written: ``topk/cifar100`` for Tables 1 and 4; ``topk/imagenet1k``,
``topk/imagenet21kp`` and ``topk/imagenet1k_effnet_l2`` for the heads on frozen embeddings of Tables 2, 3, 5, 6)
and sets only the method: the operator and its temperature / sigmoid, P_K, the loss when it is a baseline,
``paper_method`` and the ``paper:`` key, whose fields are columns of
``src/diffrank/reference/topk_icml2022_table<N>.csv`` (one reference row per metric).

Temperatures are the difftopk README's ("(code)"; the paper only says "grid search, factor-2 resolution"):
CIFAR-100 DiffSortNets logistic + ART β = 0.5, λ = 0.5, NeuralSort β = 0.0625, SoftSort β = 0.0625, smooth
top-k τ = 1; ImageNet DiffSortNets logistic + ART β = 1, λ = 0.5, NeuralSort β = 0.5, SoftSort β = 0.5;
Table 5: ResNeXt P_K = [.2]*5, m = 16, DiffSortNets logistic + ART β = 1, λ = 0.5; Noisy-Student EfficientNet-L2
P_K = [.25,0,0,0,.75], m = 16, DiffSortNets plain logistic β = 0.5. "DiffSortNets" is the bitonic or the
splitter-selection network with the same settings (the paper does not say which number is which): the rows use
the bitonic network (``difftopk_bitonic``). SinkhornSort's temperature is not published: its rows start at
β = 128 and are meant to be swept with the factor-2 grid (docs/topk.md: ``hparams_search=beta_grid`` over the
table's ``sinkhorn_*`` rows); ``python -m diffrank.experiments.analysis.report`` then reports the β with the best
validation top-1.

LapSum Tables 1-2 (``lapsum_icml2025_table{1,2}.csv``): one row per Lap-Top-k cell over the same protocols, with
Appendix D Table 5's α as β = −1/α (CIFAR-100 and ImageNet-1K α = −1.5, ImageNet-21K-P α = −1.0), batch (100 / 500 /
500) and epochs (200 / 100 / 40); a row sets them only where they differ from its protocol. LapSum's learning rate is
lost (the LR grid and the "best LR" row of Table 5 did not survive in the text): the rows say so and keep the ICML
2022 protocol's. The other rows of those tables are copies of Petersen et al. 2022 Tables 1-2 (``copy_of=`` in
``setting``): their cells are run by the ``icml2022_t<N>`` rows, never by a second config.

Not generated: Table 5's literature rows (published numbers of other models, no run) and Table 7 (network depths,
a unit test).

Usage: ``python -m diffrank.experiments.rows.topk [--out DIR]`` (rewrites the table folders (:data:`FOLDERS`) of
:func:`diffrank.registry.config_dir`, the checkout's ``configs/`` in an editable install; commit them).
``tests/experiments/rows/test_rows.py`` checks that the committed files equal the generator's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from diffrank import reference
from diffrank.experiments.rows.writer import Row, generate, render_rows

PAPER = "petersen_difftopk_icml2022"
TABLES = {1: "icml2022_t1", 2: "icml2022_t2", 3: "icml2022_t3", 4: "icml2022_t4", 5: "icml2022_t5",
          6: "icml2022_t6"}
LAPSUM = "struski_lapsum_icml2025"
LAPSUM_TABLES = {1: "lapsum_t1", 2: "lapsum_t2"}
FOLDERS = (*TABLES.values(), *LAPSUM_TABLES.values())  # every folder this generator owns
# batch and epochs of the protocols (configs/experiment/topk/<protocol>.yaml; the test composes them): a LapSum row
# sets Table 5's value only where it differs
PROTOCOL_BATCH_EPOCHS = {"topk/cifar100": (128, 200), "topk/imagenet1k": (500, 20), "topk/imagenet21kp": (500, 40)}
PROTOCOL_LR = {"topk/cifar100": "1e-3", "topk/imagenet1k": "10^-4.5", "topk/imagenet21kp": "1e-4"}
# reference dataset / model -> our protocol (experiment config) and row-name prefix
PROTOCOLS = {("cifar100", "resnet18_cifar"): ("topk/cifar100", ""),
             ("imagenet1k", "resnext101_32x48d_wsl_linear_head"): ("topk/imagenet1k", "in1k_"),
             ("imagenet21kp", "resnext101_32x48d_wsl_linear_head"): ("topk/imagenet21kp", "in21kp_"),
             ("imagenet1k", "efficientnet_l2_ns_linear_head"): ("topk/imagenet1k_effnet_l2", "effnet_")}
# reference operator id -> our operator config
OPERATORS = {"neuralsort": "neuralsort", "softsort": "softsort", "sinkhorn": "sinkhorn", "dsn": "difftopk_bitonic"}
SINKHORN_START_BETA = 128.0  # a point of the factor-2 grid; the grid itself is a sweep (module docstring)
# baselines: their rows select the loss config; the protocols' top-k settings (topk_loss: m, top1_mode) are read
# by loss=topk_ce only
BASELINE_LOSSES = ("softmax_ce", "smooth_topk")
# P_K as printed in the CSVs -> our pk config, or its weights for the lengths without one
PK_NAMES = {"[1,0,0,0,0]": "top1", "[0,0,0,0,1]": "top5", "[.5,0,0,0,.5]": "half_top5",
            "[.25,0,0,0,.75]": "quarter_top5", "[.1,0,0,0,.9]": "tenth_top5", "[.2,.2,.2,.2,.2]": "uniform5",
            "[.5,0 x3,.5]": "half_top5", "[.25,0 x3,.75]": "quarter_top5", "[.1,0 x3,.9]": "tenth_top5",
            "[.5,0 x8,.5]": "half_top10", "[.5,0 x18,.5]": "half_top20"}


def pk_weights(printed: str) -> list[float]:
    """``"[.25,0 x8,.75]"`` → ``[0.25, 0, …, 0, 0.75]`` (the CSVs' compact P_K; ``0 xN`` = N zeros).

    Raises:
        ValueError: not a bracketed comma list of numbers and ``0 xN`` runs.
    """
    text = printed.split("(")[0].strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"not a P_K: {printed!r}")
    out: list[float] = []
    for part in text[1:-1].split(","):
        part = part.strip()
        if " x" in part:
            value, count = part.split(" x")
            out += [float(value)] * int(count)
        else:
            out.append(float(part))
    return out


def _pk_tag(printed: str) -> str:
    weights = pk_weights(printed)
    name = PK_NAMES.get(printed.split("(")[0].strip())
    if name:
        return name
    first = {0.5: "half", 0.25: "quarter", 0.1: "tenth", 1.0: "top1"}[weights[0]]
    return first if first == "top1" else f"{first}_top{len(weights)}"


@cache
def reference_rows(table: int, stem: str = "topk_icml2022_table") -> tuple[dict[str, str], ...]:
    """The rows of the reference table ``<stem><table>`` (:mod:`diffrank.reference`; strings; default Petersen
    et al. 2022)."""
    return tuple(reference.load_table(f"{stem}{table}"))


def _setting(row: dict[str, str]) -> dict[str, str]:
    """``"alpha=-1.5;batch=100"`` → ``{"alpha": "-1.5", "batch": "100"}``."""
    return dict(part.strip().split("=", 1) for part in row["setting"].split(";") if "=" in part)


def lapsum_rows() -> list[Row]:
    """One row per Lap-Top-k (dataset, P_K) cell of LapSum Tables 1-2; the copied baselines get none.

    Raises:
        ValueError: a LapSum table row that is neither a copy nor Lap-Top-k (nothing would run it).
    """
    out = []
    for table, folder in LAPSUM_TABLES.items():
        seen = set()
        for r in reference_rows(table, "lapsum_icml2025_table"):
            if reference.copy_source(r) is not None:
                continue
            if r["operator"] != "lapsum":
                raise ValueError(f"LapSum Table {table}: {r['method']!r} is neither Lap-Top-k nor a copy")
            cell = (r["dataset"], r["model"], r["method"], r["pk"])
            if cell in seen:
                continue
            seen.add(cell)
            protocol, prefix = PROTOCOLS[(r["dataset"], r["model"])]
            setting = _setting(r)
            alpha, batch, epochs = float(setting["alpha"]), int(setting["batch"]), int(setting["epochs"])
            overrides: dict[str, Any] = {}
            if batch != PROTOCOL_BATCH_EPOCHS[protocol][0]:
                overrides["data"] = {"batch_size": batch}
            if epochs != PROTOCOL_BATCH_EPOCHS[protocol][1]:
                overrides["trainer"] = {"max_epochs": epochs}
            key = {"paper": LAPSUM, "table": str(table), "dataset": r["dataset"], "model": r["model"],
                   "method": r["method"], "pk": r["pk"]}
            tag = _pk_tag(r["pk"])
            notes = [f"α = {alpha:g} (Table 5's best) is β = −1/α; batch {batch}, {epochs} epochs (Table 5).",
                     "LapSum's learning rate is lost: its LR grid and Table 5's best-LR row did not survive in the "
                     "text,",
                     f"so the row keeps the ICML 2022 protocol's Adam lr ({PROTOCOL_LR[protocol]}; docs/topk.md)."]
            if protocol != "topk/cifar100":
                notes += ["LapSum (§5.1) says it needs no m-subset but not whether Table 2 used one: the protocol's",
                          "m is kept (loss.m=null ranks all classes)."]
            out.append(_row(f"{folder}/{prefix}lapsum_{tag}",
                           f"Struski et al. 2025 (LapSum), Table {table}: {r['method']}, P_K = {r['pk']}; lapsum, "
                           f"α = {alpha:g}", protocol, key, operator="lapsum", params={"beta": -1.0 / alpha},
                           pk=PK_NAMES[r["pk"]], notes=notes, overrides=overrides))
    return out


def _params(table: int, dataset: str, op: str, sigmoid: str, model: str) -> dict[str, Any]:
    cifar = dataset == "cifar100"
    if op == "dsn":
        if model.startswith("efficientnet"):  # Table 5, Noisy-Student head: plain logistic β = 0.5
            return {"beta": 0.5, "sigmoid": "logistic"}
        if sigmoid not in ("logistic_art", ""):
            raise ValueError(f"Table {table}: DSN sigmoid {sigmoid!r} has no README setting")
        return {"beta": 0.5 if cifar else 1.0, "sigmoid": "logistic_phi", "art_lambda": 0.5}
    if op in ("neuralsort", "softsort"):
        return {"beta": 0.0625 if cifar else 0.5}
    if op == "sinkhorn":
        return {"beta": SINKHORN_START_BETA}
    raise ValueError(f"Table {table}: no operator for {op!r}")


def rows() -> list[Row]:
    """One row per (dataset, model, method, P_K) cell of Tables 1-6 (literature rows of Table 5 excepted), then
    :func:`lapsum_rows`."""
    out = []
    for table in TABLES:
        seen = set()
        for r in reference_rows(table):
            if r["method"] == "literature":
                continue
            cell = (r["dataset"], r["model"], r["method"], r["pk"])
            if cell in seen:
                continue
            seen.add(cell)
            protocol, prefix = PROTOCOLS[(r["dataset"], r["model"])]
            key = {"paper": PAPER, "table": str(table), "dataset": r["dataset"], "model": r["model"],
                   "method": r["method"], "pk": r["pk"]}
            op, tag = r["operator"], _pk_tag(r["pk"])
            where = f"Petersen et al. 2022, Table {table}: {r['method']}, P_K = {r['pk']}"
            if op in BASELINE_LOSSES:
                name = f"{prefix}{op}"
                if table == 6:  # Table 6 prints the softmax baseline once per P_K length block
                    name += f"_len{len(pk_weights(r['pk']))}"
                params_note = ", τ = 1, k = 5 (README)" if op == "smooth_topk" else ""
                out.append(_row(f"{TABLES[table]}/{name}", where + params_note, protocol, key, loss=op))
                continue
            ours = OPERATORS[op]
            params = _params(table, r["dataset"], op, r["sigmoid"], r["model"])
            short = "dsn" if op == "dsn" else op
            pk_name = PK_NAMES.get(r["pk"].split("(")[0].strip())
            pk: str | list[float] = pk_name or pk_weights(r["pk"])
            temp = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in params.items())
            note = "; β not published: sweep it (docs/topk.md)" if op == "sinkhorn" else " (README)"
            out.append(_row(f"{TABLES[table]}/{prefix}{short}_{tag}", f"{where}; {ours}, {temp}{note}", protocol,
                           key, operator=ours, params=params, pk=pk, sweep_beta=op == "sinkhorn"))
    return out + lapsum_rows()


# ---- rendering ----



def _row(name: str, title: str, protocol: str, paper: dict[str, Any], operator: str | None = None,
         loss: str | None = None, params: dict[str, Any] | None = None, pk: str | list[float] | None = None,
         sweep_beta: bool = False, notes: list[str] | None = None, overrides: dict[str, Any] | None = None) -> Row:
    """One top-k row: ``experiment=<protocol>`` with ``operator`` (None: a baseline ``loss`` of
    :data:`BASELINE_LOSSES` instead of the protocol's ``topk_ce``) and its ``params``, ``pk`` (a pk config name or
    the weights), a note on sweeping β where none is published (``sweep_beta``: SinkhornSort), comment ``notes``
    and the top-level keys (data, trainer) that differ from the protocol (``overrides``)."""
    choices = {**({"operator": operator} if operator else {}), **({"pk": pk} if isinstance(pk, str) else {}),
               **({"loss": loss} if loss else {})}
    notes = list(notes or [])
    if sweep_beta:
        notes.append(f"β not published: python train.py experiment=topk/{name} hparams_search=beta_grid "
                     "sweep.beta_min=4 sweep.beta_max=1024")
    keys = {"paper_method": operator, "paper": paper, **({"operator": params} if params else {}),
            **({"pk": {"weights": pk}} if isinstance(pk, list) else {}), **(overrides or {})}
    return Row(name, title, f"/experiment/{protocol}", choices, keys, notes)


def render() -> dict[str, str]:
    """``{path relative to configs/experiment/topk: yaml text}`` of every row.

    Raises:
        ValueError: two rows share a name.
    """
    return render_rows(rows(), "topk")


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """``python -m diffrank.experiments.rows.topk [--out DIR]``: rewrite the table folders (stale rows removed);
    returns what was written."""
    return generate("topk", FOLDERS, render, argv)


if __name__ == "__main__":
    main()
