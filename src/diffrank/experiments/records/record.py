"""``results.json``: the versioned record of one run (:class:`RunRecord`), how it is written (atomically) and hashed,
and how a full disk is named. The facts it records besides metrics and config (git state, package versions, the
compute environment) are :mod:`diffrank.experiments.records.environment`."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from diffrank.experiments.records.disk import write_atomic


def to_float(v: Any) -> Any:
    """Tensors and numpy scalars → Python floats (for JSON)."""
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if hasattr(v, "item"):
        return v.item()
    return v


# data keys that say where the data lives or how fast it loads, not which data it is
LOADING_KEYS = frozenset({"data_dir", "root", "download", "num_workers", "pin_memory", "persistent_workers",
                          "device_resident", "eval_batch_size", "cache_dir"})
# config keys that say where a run writes, how it logs or how it was started, not what it computes: left out of its
# config hash (two runs differing only in these are the same config)
# (the two folders that interpolate the run folder: with them every run, or a copy resumed elsewhere, had a hash
# of its own)
NOT_THE_CONFIG = frozenset({"paths", "hydra", "logger", "extras", "ckpt_path", "resume_with_changes", "skip_finished",
                            "tags", "task_name", "trainer.enable_progress_bar", "trainer.enable_model_summary",
                            "trainer.default_root_dir", "callbacks.model_checkpoint.dirpath",
                            "callbacks.rich_progress_bar", *(f"data.{k}" for k in LOADING_KEYS)})
# command-line overrides that do not make a run a variant of its experiment's row: where it runs and writes, its
# seed, and what the report shows in a column of its own (budget, precision, data, β selection, Newton λ, device)
ROW_OVERRIDES = ("experiment", "seed", "paths.", "hydra.", "extras.", "logger", "ckpt_path", "resume_with_changes",
                 "skip_finished", "train", "test", "tags", "task_name", "hparams_search", "local",
                 "callbacks.rich_progress_bar", "trainer.enable_progress_bar", "trainer.enable_model_summary",
                 "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy",
                 "trainer.max_steps", "trainer.max_epochs", "trainer.precision", "data", "operator.beta",
                 "newton.tikhonov", *(f"data.{k}" for k in LOADING_KEYS))


def config_hash(config: dict[str, Any]) -> str:
    """A 16-hex-digit SHA-256 of a run's config (a JSON-like dict, ideally resolved) without the keys of
    :data:`NOT_THE_CONFIG`: equal for two runs of the same config and seed wherever they wrote."""
    def strip(node: Any, prefix: str) -> Any:
        """``node`` without the keys of :data:`NOT_THE_CONFIG` (dotted under ``prefix``), recursively."""
        if not isinstance(node, dict):
            return node
        return {str(k): strip(v, f"{prefix}{k}.") for k, v in node.items() if f"{prefix}{k}" not in NOT_THE_CONFIG}

    text = json.dumps(strip(config, ""), sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def code_version(sha: str | None, dirty: bool | None) -> str:
    """A code version as the report prints it: the first 10 digits of the git SHA, ``+dirty`` for uncommitted
    changes, ``?`` when unknown."""
    return f"{sha[:10]}{'+dirty' if dirty else ''}" if sha else "?"


SCHEMA = 2  # 1: records written before RunRecord (no "schema" key)
RECORD_FILE = "results.json"  # the name of a run's record in its run folder: every reader and writer uses this
# the field of a ``paper`` key that marks a cell of a published table's grid run on another dataset (its value)
BENCHMARK = "benchmark"


@dataclass
class RunRecord:
    """One run's ``results.json``: what it ran, what it measured, and under which conditions.

    The one reader and writer of the file: the training runner writes it (:meth:`write`); the paper report,
    the offline P_K report, the sweep summary and skip-finished read it (:meth:`read`), so field fallbacks live
    here only (:meth:`from_dict` upgrades older records).

    Fields (JSON types): ``status`` ("done" | "failed" | "incomplete" | "interrupted": stopped by SIGTERM / SIGINT,
    ``resume_command`` says how to go on | "diverged": stopped by the divergence guard, ``error`` says why; only
    "done" runs are results); ``schema`` (:data:`SCHEMA`);
    ``run_id`` (the run's identity: kept by a resume of it, new for every other run; the archive and the report
    tell runs apart by it, not by their folder), ``config_hash`` (:func:`config_hash` of the resolved config: one
    run per (config, seed) is pooled), ``segments`` (one per start or resume of the run: ``{"from_step",
    "git_sha", "git_dirty", "accumulate_grad_batches", "global_batch", "precision"}``), ``precision`` (the
    precision the trainer used, which is not always the one asked for: ``16-mixed`` on a CPU runs ``bf16-mixed``);
    ``metrics`` (``{"test/top1": fraction, ...}``); ``paper`` (the one key saying which published table the run
    belongs to, or None: a reference row's columns, :attr:`table_row`; or, with a ``benchmark`` field, a cell of a
    published grid on another dataset, :attr:`benchmark_cell`),
    ``variant_of`` (old records only: the row a run of it with another method varied; such runs are refused now);
    ``choices`` (config
    groups used), ``overrides`` (Hydra task overrides), ``config`` (unresolved config); ``seed``, ``split_seed``;
    ``optimizer_steps`` (steps actually taken, summed as one process sees them), ``global_step``,
    ``global_batch`` (sets / images per optimizer step over all ranks), ``world_size``, ``per_device_batch``,
    ``accumulate_grad_batches``; ``checkpoint`` / ``evaluated_checkpoint`` (which weights were tested);
    ``resumed_with_changes`` (how ``ckpt_path``'s choices differed, accepted by ``+resume_with_changes=true``);
    ``synthetic_data`` / ``synthetic_info``; ``git_sha``, ``git_dirty``, ``versions``, ``device``, ``compute``;
    ``wall_time_s`` (seconds), ``finished_at``; ``run_dir``, ``sweep_dir``; ``error`` (failed runs). Keys this
    class does not know are kept in ``extra`` and written back.
    """

    status: str = "incomplete"
    schema: int = SCHEMA
    run_id: str | None = None
    config_hash: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    task_name: str | None = None
    paper: Any = None
    variant_of: dict[str, Any] | None = None
    choices: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    split_seed: int | None = None
    synthetic_data: bool = False
    synthetic_info: dict[str, Any] | None = None
    global_step: int | None = None
    optimizer_steps: int | None = None
    world_size: int | None = None
    per_device_batch: int | None = None
    accumulate_grad_batches: int | None = None
    global_batch: int | None = None
    evaluated_checkpoint: bool = False
    checkpoint: dict[str, Any] | None = None
    resumed_with_changes: list[str] | None = None
    git_sha: str | None = None
    git_dirty: bool | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    compute: dict[str, Any] | None = None
    wall_time_s: float | None = None
    finished_at: str | None = None
    run_dir: str | None = None
    sweep_dir: str | None = None
    error: str | None = None
    resume_command: str | None = None
    precision: str | None = None
    segments: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """A record from its JSON object, upgrading schema 1 (records written before this class).

        Schema 1 fallbacks: ``optimizer_steps`` ← ``global_step``; ``global_batch`` ← ``data.batch_size`` of
        the overrides, then of the config; ``status`` ← "done" when it has metrics, else "incomplete";
        ``variant_of`` keys ``paper_operator`` / ``operator`` → ``paper_method`` / ``method``. Any schema: a run
        of a benchmark row written before the one ``paper`` key (``paper`` null, ``config.benchmark:
        {dataset, method, operator, pk}``) gets ``paper = {benchmark: <dataset>, method, operator, pk}``.
        """
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        rec = cls(**known, extra={k: v for k, v in data.items() if k not in names})
        if "schema" not in data:
            rec.schema = 1
            rec.status = data.get("status") or ("done" if rec.metrics else "incomplete")
            if rec.optimizer_steps is None:
                rec.optimizer_steps = rec.global_step
            if rec.global_batch is None:
                batch = rec.planned("data.batch_size", ("data", "batch_size"))
                rec.global_batch = None if batch is None else int(batch)
            if isinstance(rec.variant_of, dict) and "paper_operator" in rec.variant_of:  # the key held algorithms too
                v = dict(rec.variant_of)
                rec.variant_of = {"experiment": v.get("experiment"), "paper_method": v.get("paper_operator"),
                                  "method": v.get("operator"), "paper": v.get("paper")}
        rec.metrics = rec.metrics or {}
        rec.overrides = [str(o) for o in rec.overrides or []]
        rec.config = rec.config or {}
        rec.segments = list(rec.segments or [])
        bench = rec.config.get(BENCHMARK)
        if rec.paper is None and isinstance(bench, dict):
            rec.paper = {BENCHMARK: bench.get("dataset"), **{k: v for k, v in bench.items() if k != "dataset"}}
        return rec

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (unknown keys of an older record included)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, **out}

    @classmethod
    def read(cls, path: str | Path) -> RunRecord | None:
        """The record of a ``results.json``, or None when the file is missing or not a complete JSON object
        (a run killed before :meth:`write` renamed its file leaves none)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        return cls.from_dict(data) if isinstance(data, dict) else None

    def write(self, path: str | Path) -> Path:
        """Write the record as indented JSON (folders created; a temporary file renamed over ``path``, so a
        reader never sees half a file). Returns the path."""
        return write_atomic(path, json.dumps(self.to_dict(), indent=2, default=str))

    def planned(self, override: str, keys: tuple[str, ...]) -> Any:
        """A planned setting: the command line's ``override`` if given, else the config's value at ``keys``."""
        for o in self.overrides:
            if o.lstrip("+~").split("=", 1)[0] == override and "=" in o:
                return o.split("=", 1)[1]
        node: Any = self.config
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        return node

    @property
    def steps(self) -> Any:
        """Optimizer steps taken, else the planned ``trainer.max_steps`` (None when neither is known)."""
        return self.optimizer_steps if self.optimizer_steps is not None \
            else self.planned("trainer.max_steps", ("trainer", "max_steps"))

    @property
    def table_row(self) -> dict[str, Any] | None:
        """The reference row this run reproduces: its ``paper`` key, the columns of a row of
        :mod:`diffrank.reference` (``{"paper": "petersen_thesis_2022", "table": "7.1", "method": ..., ...}``); None
        for a run of no published row, or of a benchmark cell (:attr:`benchmark_cell`)."""
        return self.paper if isinstance(self.paper, dict) and BENCHMARK not in self.paper else None

    @property
    def benchmark_cell(self) -> dict[str, Any] | None:
        """The cell of a published grid this run measures on another dataset (``paper: {benchmark: <dataset>,
        method, operator, pk}``: Petersen et al. ICML 2022 Table 4's P_K x method grid on Fashion-MNIST pairs) as
        ``{"dataset": <dataset>, "method", "operator", "pk"}``; None for any other run."""
        if not isinstance(self.paper, dict) or BENCHMARK not in self.paper:
            return None
        return {"dataset": self.paper[BENCHMARK], **{k: v for k, v in self.paper.items() if k != BENCHMARK}}

    @property
    def optimized_metric(self) -> str | None:
        """The config's ``optimized_metric`` (the selection metric), if any."""
        return self.config.get("optimized_metric")

    @property
    def optimized_mode(self) -> str | None:
        """The config's ``optimized_mode`` (``"max"`` / ``"min"`` for :attr:`optimized_metric`), if any."""
        return self.config.get("optimized_mode")

    @property
    def budget(self) -> str:
        """``"<steps>×<global batch>"``: optimizer steps actually taken (:attr:`steps`) times the sets / images per
        step over all DDP ranks (``"?"`` when either is unknown), with the precision appended when it is not
        float32 (``"10000×4 bf16-mixed"``: such a run is not a seed of the float32 runs; the precision used,
        :attr:`precision`, else the one asked for). A run resumed with another global batch
        (``+resume_with_changes=true``) shows its :attr:`segments`: ``"4×128+2×256"``."""
        steps, batch = self.steps, self.global_batch
        budget = f"{steps}×{batch}" if steps is not None and batch is not None else "?"
        parts = self._segment_budgets()
        if parts and len({b for _, b in parts}) > 1:
            budget = "+".join(f"{s}×{b}" for s, b in parts)
        precision = str(self.precision or self.planned("trainer.precision", ("trainer", "precision")) or "32-true")
        return budget if precision in ("32-true", "32", "32-bit") else f"{budget} {precision}"

    def _segment_budgets(self) -> list[tuple[int, Any]]:
        """``(steps, global batch)`` per segment (when every start is known), the last ending at
        :attr:`optimizer_steps`."""
        starts = [s.get("from_step") for s in self.segments]
        if not starts or any(not isinstance(s, int) for s in starts) or not isinstance(self.optimizer_steps, int):
            return []
        ends = [*starts[1:], self.optimizer_steps]
        return [(e - s, seg.get("global_batch")) for s, e, seg in zip(starts, ends, self.segments) if e > s]

    @property
    def pool_key(self) -> str | None:
        """What makes two records the same run for pooling: the recorded :attr:`config_hash` of the resolved
        config and seed, else (older records) :func:`config_hash` of the recorded config, seed and the overrides
        that are not locations; None for a record that names no seed (nothing says which seed it is)."""
        if self.config_hash:
            return self.config_hash
        if self.seed is None and self.config.get("seed") is None:
            return None
        where = ("paths.", "hydra.", "extras.", "logger", "ckpt_path")
        overrides = sorted(o for o in self.overrides if not o.lstrip("+~").startswith(where))
        return config_hash({"config": self.config, "seed": self.seed, "overrides": overrides})

    @property
    def code(self) -> str:
        """The code version (:func:`code_version`) of the run; ``"a+b"`` when its segments ran different ones."""
        seen = [code_version(s.get("git_sha"), s.get("git_dirty")) for s in self.segments] \
            or [code_version(self.git_sha, self.git_dirty)]
        return "+".join(dict.fromkeys(seen))

    @property
    def variant(self) -> str:
        """The command-line overrides that make this run differ from its experiment's row (all but the seed, where
        it ran and what the report shows in columns of its own: :data:`ROW_OVERRIDES`), space-separated and sorted;
        ``""`` for a run of the row as configured."""
        def keep(o: str) -> bool:
            """Whether override ``o`` changes the experiment (not a key of :data:`ROW_OVERRIDES`)."""
            key = o.lstrip("+~").split("=", 1)[0]
            return not any(key == r or (r.endswith(".") and key.startswith(r)) for r in ROW_OVERRIDES)

        return " ".join(sorted(o for o in self.overrides if keep(o)))

    @property
    def beta(self) -> float | None:
        """The operator's inverse temperature β as configured (``config.operator.beta``, docs/conventions.md);
        None for a run without an operator or whose β is not a number."""
        op = self.config.get("operator")
        beta = op.get("beta") if isinstance(op, dict) else None
        try:
            return None if beta is None else float(beta)
        except (TypeError, ValueError):
            return None

    @property
    def tikhonov(self) -> str:
        """The Tikhonov λ of a Newton-loss run (``config.newton``, Petersen thesis §7.3) as printed (``"0.1"``);
        ``""`` for a run without a Newton loss."""
        newton = self.config.get("newton")
        if not isinstance(newton, dict) or newton.get("variant") in (None, "none") or newton.get("tikhonov") is None:
            return ""
        try:
            return f"{float(newton['tikhonov']):g}"
        except (TypeError, ValueError):
            return str(newton["tikhonov"])

    @property
    def device_kind(self) -> str:
        """The kind of device the run trained on: :attr:`device` up to its details (``"cpu"``, ``"NVIDIA H100
        80GB HBM3"``; ``""`` when not recorded)."""
        return str(self.device or "").split(" (", 1)[0].strip()

    @property
    def data_kind(self) -> str:
        """What the run's data was when it is not its row's: ``"synthetic"`` for generated stand-in data
        (:attr:`synthetic_data`), ``"data=<config>"`` for a data group swapped on the command line
        (``data=digits_sort``: an offline check of an MNIST row), ``""`` for the row's own data."""
        if self.synthetic_data:
            return "synthetic"
        swapped = [o.split("=", 1)[1] for o in self.overrides if o.lstrip("+~").startswith("data=")]
        return f"data={swapped[-1]}" if swapped else ""

    @property
    def val_score(self) -> float:
        """The run's validation score for choosing among its runs: ``val/top1_best``, else its
        :attr:`optimized_metric`, else ``val/top1`` (the first that is a number); NaN when none is."""
        for name in ("val/top1_best", self.optimized_metric, "val/top1"):
            if isinstance(name, str) and isinstance(self.metrics.get(name), (int, float)):
                return float(self.metrics[name])
        return math.nan
