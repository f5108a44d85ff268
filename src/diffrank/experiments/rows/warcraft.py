"""Write the Warcraft shortest-path rows of thesis chapter 7: ``configs/experiment/warcraft/thesis_t7_{4,5,6,7}/``.

A row includes the protocol ``warcraft/shortest_path`` (hand-written: data, CombResNet18, Adam 5e-4, 50 epochs, the
final epoch tested), selects its algorithm (``configs/algorithm/``) and, for the Newton-loss cells, its Newton loss
(``override /newton: hessian | fisher``, with the group's λ: the thesis does not print it), sets the parameters that
define its cell, and carries ``paper_method`` and the ``paper:`` key of one row of
``src/diffrank/reference/warcraft_thesis_tables.csv``:

- Table 7.4: relaxed Bellman-Ford, For / While loop × L1 / L2² loss, Regular and Fisher Newton (the thesis restricts
  the Bellman-Ford to Fisher: its Hessian is too expensive);
- Table 7.5: stochastic smoothing of the loss (Regular, Hessian, Fisher), of the algorithm (Regular, Fisher) and the
  perturbed optimizer with the Fenchel-Young loss (Regular, Hessian, Fisher), 3 / 10 / 30 samples;
- Table 7.6: bootstrapped RESGRO, M ∈ {6, 10, 20, 30, 60, 100} samples × S ∈ {3, 10, 30, 100} sets of K = M // 2
  (K is not printed in the thesis; our choice);
- Table 7.7: one-set RESGRO, 3 / 10 / 30 / 100 samples.

The Newton rows set their own λ (``newton.tikhonov``; the thesis prints none and the group's 0.01 collapsed the
training on the generated maps): :data:`TIKHONOV`, chosen on the validation EM of a 10-epoch pilot on the generated
12 × 12 set (docs/warcraft.md, "Chapter 7 rows").

Table 2.2's rows (``thesis_t2_2/``) stay hand-written. Usage: ``python -m diffrank.experiments.rows.warcraft
[--out DIR]`` (rewrites the table folders of the checkout's ``configs/``; commit them).
``tests/experiments/rows/test_rows.py`` checks that the committed files equal the generator's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diffrank.experiments.rows.writer import Row, generate, render_rows

FOLDERS = ("thesis_t7_4", "thesis_t7_5", "thesis_t7_6", "thesis_t7_7")
THESIS = "petersen_thesis_2022"
# reference CSV method label -> the newton group's choice
NEWTON = {"Regular": None, "Hessian Newton": "hessian", "Fisher Newton": "fisher"}
# Table 7.5 column family: (algorithm config, reference operator id, row name prefix, Newton methods in the thesis)
FAMILIES_7_5 = (("smoothed_loss", "stochastic_smoothing_of_loss", "smoothed_loss", tuple(NEWTON)),
                ("smoothed_algorithm", "stochastic_smoothing_of_algorithm", "smoothed_algorithm",
                 ("Regular", "Fisher Newton")),
                ("perturbed", "perturbed_optimizer_fenchel_young", "perturbed_fy", tuple(NEWTON)))
# λ of the Newton rows by algorithm: relaxed Bellman-Ford + Fisher, pilot λ ∈ {0.01, 1, 10, 100} -> 1 (val EM
# 0.2 / 46.3 / 42.3 / 41.4 %); PO w/ FY + Hessian, λ ∈ {0.01, 1, 10, 100} -> 10 (0.6 / 13.5 / 37.6 / 37.3 %); the
# stochastic-smoothing rows take 10 (one pilot run each, not a selection)
TIKHONOV = {"relaxed_bellman_ford": 1.0, "perturbed": 10.0, "smoothed_loss": 10.0, "smoothed_algorithm": 10.0}
SAMPLES_7_6 = (6, 10, 20, 30, 60, 100)
SETS_7_6 = (3, 10, 30, 100)


def _row(name: str, title: str, algorithm: str, paper: dict[str, Any], params: dict[str, Any] | None = None,
         newton: str | None = None) -> Row:
    """One Warcraft row: ``experiment=warcraft/shortest_path`` with ``algorithm`` and the parameters that define
    its cell (``params``), and the Newton loss ``newton`` with its λ (:data:`TIKHONOV`) where the thesis has one."""
    keys = {"paper_method": algorithm, "paper": paper,
            **({"newton": {"tikhonov": TIKHONOV[algorithm]}} if newton else {}),
            **({"algorithm": params} if params else {})}
    return Row(name, f"Thesis Table {paper['table']}: {title}", "/experiment/warcraft/shortest_path",
               {"algorithm": algorithm, **({"newton": newton} if newton else {})}, keys)


def _suffix(method: str) -> str:
    return f"_{NEWTON[method]}" if NEWTON[method] else ""


def table_7_4() -> list[Row]:
    """Table 7.4: relaxed Bellman-Ford (AlgoVision), loop × loss, Regular and Fisher Newton."""
    return [_row(f"thesis_t7_4/{loop}_{loss}{_suffix(method)}",
                f"relaxed Bellman-Ford, {loop} loop, {loss} loss, {method}", "relaxed_bellman_ford",
                {"paper": THESIS, "table": "7.4", "dataset": "warcraft12", "method": method,
                 "setting": f"loop={loop};loss={loss}"}, {"loop": loop, "loss": loss}, NEWTON[method])
            for method in ("Regular", "Fisher Newton") for loop in ("for", "while") for loss in ("l1", "l2sq")]


def table_7_5() -> list[Row]:
    """Table 7.5: stochastic smoothing of the loss / of the algorithm, perturbed optimizer with Fenchel-Young loss;
    3 / 10 / 30 samples; the Newton losses where the thesis has them."""
    return [_row(f"thesis_t7_5/{prefix}_s{s}{_suffix(method)}", f"{operator.replace('_', ' ')}, {s} samples, {method}",
                algorithm, {"paper": THESIS, "table": "7.5", "dataset": "warcraft12", "method": method,
                            "operator": operator, "setting": f"samples={s}"}, {"samples": s}, NEWTON[method])
            for algorithm, operator, prefix, methods in FAMILIES_7_5 for method in methods for s in (3, 10, 30)]


def table_7_6() -> list[Row]:
    """Table 7.6: bootstrapped RESGRO, M samples × S random K-subsets, K = M // 2."""
    return [_row(f"thesis_t7_6/resgro_m{m}_sets{s}", f"bootstrapped RESGRO, {m} samples, {s} sets of K = {m // 2}",
                "resgro", {"paper": THESIS, "table": "7.6", "dataset": "warcraft12", "method": "RESGRO bootstrapped",
                           "setting": f"samples={m};sets={s}"}, {"samples": m, "subset_size": m // 2, "sets": s})
            for m in SAMPLES_7_6 for s in SETS_7_6]


def table_7_7() -> list[Row]:
    """Table 7.7: one-set RESGRO, 3 / 10 / 30 / 100 samples."""
    return [_row(f"thesis_t7_7/resgro_s{m}", f"one-set RESGRO, {m} samples", "resgro",
                {"paper": THESIS, "table": "7.7", "dataset": "warcraft12", "method": "RESGRO one-set",
                 "setting": f"samples={m}"}, {"samples": m, "subset_size": None, "sets": None})
            for m in (3, 10, 30, 100)]


def rows() -> list[Row]:
    """Every row of Tables 7.4–7.7."""
    return [*table_7_4(), *table_7_5(), *table_7_6(), *table_7_7()]


def render() -> dict[str, str]:
    """``{path relative to configs/experiment/warcraft: yaml text}`` of every row.

    Raises:
        ValueError: two rows share a name.
    """
    return render_rows(rows(), "warcraft")


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """``python -m diffrank.experiments.rows.warcraft [--out DIR]``: rewrite the table folders (stale rows
    removed); returns what was written."""
    return generate("warcraft", FOLDERS, render, argv)


if __name__ == "__main__":
    main()
