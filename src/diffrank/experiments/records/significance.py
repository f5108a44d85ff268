"""Each method against Regular training of the same cell, as thesis ch. 7 compares them (Table 7.1): paper − Regular,
ours − Regular and Welch's t-test (:func:`significance`), on the lines of a paper table
(:func:`diffrank.experiments.records.matching.collect_runs`)."""

from __future__ import annotations

import math
from typing import Any

from diffrank import reference
from diffrank.experiments.records.table_cells import LABEL_COLUMNS

SIGNIFICANCE = 0.05  # thesis §7.5.1: "significance tests (significance level 0.05)"


def _baseline(line: dict[str, Any], baselines: list[dict[str, Any]],
              regular_operators: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The one "Regular" line of the same cell as ``line``: equal labels but the method (Table 7.3: the
    operator is the cell's), else, when ``line``'s operator is none of ``regular_operators`` (those of the
    table's published Regular rows), equal labels but method and operator (Table 7.1: the operator column names
    the Newton loss); same metric, budget, data and device. A Table 7.3 / 7.5 line whose own operator's Regular
    was not run has no baseline (never another operator's Regular)."""
    operator_is_the_cell = line["row"].get("operator", "") in regular_operators
    for ignored in (("method",),) if operator_is_the_cell else (("method",), ("method", "operator")):
        def cell(ln: dict[str, Any], ignored: tuple[str, ...] = ignored) -> tuple:
            """A line's cell key without the ``ignored`` label columns."""
            return (*(ln["row"].get(c, "") for c in LABEL_COLUMNS if c not in ignored), ln["metric"], ln["budget"],
                    ln.get("data", ""), ln.get("device", ""), ln.get("variant", ""))
        found = [b for b in baselines if cell(b) == cell(line)]
        if len(found) == 1:
            return found[0]
    return None


def significance(lines: list[dict[str, Any]], alpha: float = SIGNIFICANCE) -> None:
    """Compare each method with Regular training of the same cell, as thesis ch. 7 does (Table 7.1: "significance
    tests between regular training and the Newton methods", level 0.05), in place: a line with a "Regular" line
    of the same cell gets ``vs_regular = {"paper": paper − Regular's paper value, "ours": our mean − Regular's
    mean, "p": Welch's t-test p-value (scipy ``ttest_ind(equal_var=False)``; None below two runs on either side
    or for equal constant samples), "significant": p < alpha}``. The thesis does not name its test; Welch's makes
    no equal-variance assumption. Tables without "Regular" lines are left as they are."""
    baselines = [ln for ln in lines if ln["row"].get("method") == "Regular"]
    if not baselines:
        return
    from scipy.stats import ttest_ind

    paper, table = baselines[0]["row"]["paper"], baselines[0]["row"]["table"]
    regular_operators = frozenset(r["operator"] for r in reference.all_rows()
                                  if r["paper"] == paper and r["table"] == table and r["method"] == "Regular")
    for ln in lines:
        base = None if any(ln is b for b in baselines) else _baseline(ln, baselines, regular_operators)
        if base is None:
            continue
        p = None
        if len(ln["ours"]) > 1 and len(base["ours"]) > 1:
            value = float(ttest_ind(ln["ours"], base["ours"], equal_var=False).pvalue)
            p = None if math.isnan(value) else value
        ln["vs_regular"] = {"paper": ln["paper"] - base["paper"],
                            "ours": ln["mean"] - base["mean"] if ln["ours"] and base["ours"] else math.nan,
                            "p": p, "significant": p is not None and p < alpha}
