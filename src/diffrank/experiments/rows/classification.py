"""Write thesis Table 7.1's rows: ``configs/experiment/classification/thesis_t7_1/<row>.yaml``.

Petersen, PhD thesis 2022, §7.5.1, Table 7.1: MNIST classification with the softmax cross-entropy, models
M1–M5 × optimizers SGD / Adam × Regular / Newton losses (e.w. H, H, F; Definitions 7.1–7.3) × tested after 1 or
200 epochs: 80 cells, one row each. A row includes the protocol ``classification/mnist`` (data, loss, batch,
learning rates, test after the last epoch) and writes only what differs: the net, the optimizer, the Newton
loss and its Tikhonov λ, the epochs and the ``paper:`` key (columns of
``src/diffrank/reference/newton_thesis_table7_1_classification.csv``).

Usage: ``python -m diffrank.experiments.rows.classification [--out DIR]`` (rewrites the folder under
:func:`diffrank.registry.config_dir`; commit it). ``tests/experiments/rows/test_rows.py`` checks that the committed
files equal the generator's output.
"""

from __future__ import annotations

from collections.abc import Sequence

from diffrank.experiments.rows.writer import Row, generate, render_rows

TABLE = "thesis_t7_1"
FOLDERS = (TABLE,)
# model label -> (net config, its parameters, the reference CSV's model id)
MODELS = {"m1": ("fc5_relu", {"width": 100}, "fc5_relu_100"),
          "m2": ("fc5_relu", {"width": 400}, "fc5_relu_400"),
          "m3": ("fc5_relu", {"width": 1600}, "fc5_relu_1600"),
          "m4": ("lenet5", {"activation": "sigmoid"}, "lenet5_sigmoid"),
          "m5": ("lenet5", {"activation": "relu"}, "lenet5_relu")}
# optimizer -> (torch class, learning rate): chosen once for Regular training (docs/newton.md, "Table 7.1")
OPTIMIZERS = {"sgd": ("torch.optim.SGD", 0.1), "adam": ("torch.optim.Adam", 0.001)}
# row suffix -> (newton choice, the thesis' method name)
METHODS = {"regular": ("none", "Regular"), "ewh": ("elementwise_hessian", "Newton L. (e.w. H)"),
           "hessian": ("hessian", "Newton L. (H)"), "fisher": ("fisher", "Newton L. (F)")}
# the Tikhonov λ of every Newton variant: the best validation accuracy of λ ∈ {0.1, 0.3, 1, 3} on M1 / SGD,
# epoch 1, seed 0, for each of the three variants (docs/newton.md); the thesis prints none
TIKHONOV = 0.3
EPOCHS = (1, 200)


def rows() -> list[Row]:
    """The 80 cells of Table 7.1, one row each."""
    out = []
    for label, (net, params, model_id) in MODELS.items():
        for opt, (target, lr) in OPTIMIZERS.items():
            for suffix, (newton, method) in METHODS.items():
                for epochs in EPOCHS:
                    name = f"{label}_{opt}_{suffix}" + ("" if epochs == 1 else f"_ep{epochs}")
                    setting = f"optimizer={opt};epochs={epochs};model_label={label.upper()}"
                    paper = {"paper": "petersen_thesis_2022", "table": "7.1", "dataset": "mnist",
                             "model": model_id, "method": method, "setting": setting}
                    optimizer = opt.upper() if opt == "sgd" else "Adam"
                    title = (f"Thesis Table 7.1: {label.upper()} ({model_id}), {optimizer}, {method}, tested after "
                             f"{epochs} epoch{'s' if epochs > 1 else ''}")
                    keys = {"paper": paper, "model": {"net": params, "optimizer": {"_target_": target, "lr": lr}},
                            **({"newton": {"tikhonov": TIKHONOV}} if newton != "none" else {}),
                            **({"trainer": {"max_epochs": epochs}} if epochs != 1 else {})}
                    out.append(Row(f"{TABLE}/{name}", title, "/experiment/classification/mnist",
                                   {"net": net, **({"newton": newton} if newton != "none" else {})}, keys))
    return out


def render() -> dict[str, str]:
    """``{"thesis_t7_1/<row>.yaml": text}`` of every row.

    Raises:
        ValueError: two rows share a name.
    """
    return render_rows(rows(), "classification")


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """``python -m diffrank.experiments.rows.classification [--out DIR]``: rewrite the table folder; returns what
    was written."""
    return generate("classification", FOLDERS, render, argv)


if __name__ == "__main__":
    main()
