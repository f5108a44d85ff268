"""``results.json``: the versioned record of one run (:class:`RunRecord`), and the facts it records (git state,
package versions, the compute environment that decides the bits)."""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("torch", "lightning", "hydra-core", "torchmetrics", "timm", "numpy", "diffrank")


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """``{"git_sha": str | None, "git_dirty": bool | None}`` of the repository holding ``cwd``."""
    cwd = str(cwd or Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                    capture_output=True, text=True, timeout=10, check=True).stdout.strip())
        return {"git_sha": sha, "git_dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide a result."""
    out: dict[str, str | None] = {}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    out["python"] = platform.python_version()
    return out


# Environment variables that change which kernels run, or how many threads split a reduction.
COMPUTE_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR",
               "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "DIFFRANK_NATIVE_ISA", "CUBLAS_WORKSPACE_CONFIG",
               "CUDA_VISIBLE_DEVICES",
               "NVIDIA_TF32_OVERRIDE", "TORCH_CUDNN_V8_API_DISABLED")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _build_versions() -> dict[str, str | None]:
    """oneDNN, MKL and OpenMP versions and the BLAS that this PyTorch build was compiled with."""
    show = torch.__config__.show()
    found = {
        "onednn": re.search(r"(?:MKL-DNN|oneDNN) v([0-9][\w.]*)", show),
        "mkl": re.search(r"Math Kernel Library Version ([0-9][\w.]*)", show),
        "openmp": re.search(r"OpenMP (\d+)", show),
        "blas": re.search(r"BLAS_INFO=(\w+)", show),
    }
    return {k: m.group(1) if m else None for k, m in found.items()}


def compute_environment() -> dict[str, Any]:
    """What decides the bits of a run besides the code and the config.

    CPU model, the instruction set PyTorch's CPU kernels dispatch to (``cpu_capability``: DEFAULT, AVX2,
    AVX512, …), intra-op and inter-op thread counts and the environment variables that set them,
    the torch / CUDA / cuDNN / oneDNN / MKL versions, the CUDA devices, and the determinism switches
    (``torch.use_deterministic_algorithms``, cuDNN's deterministic / benchmark, TF32, matmul precision).
    Runs that differ in any of these may differ in the last bits, and training amplifies that.
    """
    cuda = torch.cuda.is_available()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        affinity = os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "env": {k: os.environ.get(k) for k in COMPUTE_ENV if k in os.environ},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **_build_versions(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
        "cuda_devices": [{"name": torch.cuda.get_device_name(i),
                          "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
                         for i in range(torch.cuda.device_count())] if cuda else [],
        "deterministic": {
            "algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        },
    }


def device_description(env: dict[str, Any] | None = None) -> str:
    """One line: the CUDA device, or the CPU model, its dispatched instruction set and the thread count."""
    env = env or compute_environment()
    if env["cuda_devices"]:
        d = env["cuda_devices"][0]
        return f"{d['name']} (CUDA {env['cuda']}, cuDNN {env['cudnn']})"
    n = env["num_threads"]
    return f"cpu ({env['cpu_model']}, {env['cpu_capability']}, {n} thread{'' if n == 1 else 's'})"


def to_float(v: Any) -> Any:
    """Tensors and numpy scalars → Python floats (for JSON)."""
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if hasattr(v, "item"):
        return v.item()
    return v


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through a temporary file in the same folder and an
    ``os.replace`` (atomic on POSIX), so that a reader, or a job killed mid-write, never leaves half a file.
    Folders are created. Returns the path.

    Raises:
        OSError: the folder cannot be created or written; a full disk as errno ENOSPC naming ``path`` (the bare
            error of the write names no file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        if e.errno == errno.ENOSPC:  # name the file (the write's own error names none, or the temporary one)
            raise OSError(errno.ENOSPC, "No space left on device (ENOSPC)", str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write or the rename failed
    return path


# data keys that say where the data lives or how fast it loads, not which data it is
LOADING_KEYS = frozenset({"data_dir", "root", "download", "num_workers", "pin_memory", "persistent_workers",
                          "device_resident", "eval_batch_size", "cache_dir"})
# config keys that say where a run writes, how it logs or how it was started, not what it computes: left out of its
# config hash (two runs differing only in these are the same config)
NOT_THE_CONFIG = frozenset({"paths", "hydra", "logger", "extras", "ckpt_path", "resume_with_changes", "skip_finished",
                            "tags", "task_name", "trainer.enable_progress_bar", "trainer.enable_model_summary",
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


def no_space_error(error: BaseException) -> OSError | None:
    """The ``OSError`` with errno ENOSPC (disk full) that is ``error`` or in its chain of causes, else None (torch's
    checkpoint writer reports a full disk as ``unexpected pos …``, the ENOSPC only in the chained cause)."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
        e = e.__cause__ or e.__context__
    return None


def describe_no_space(error: BaseException) -> str | None:
    """One line for a full disk (:func:`no_space_error` of ``error``): ``"no space left on device (ENOSPC) writing
    <file>: free disk space, then resume; <type>: <message>"`` (the file when known; the error's own text left out
    when it only repeats that, as :func:`write_atomic`'s does); None when ``error`` is not one."""
    full = no_space_error(error)
    if full is None:
        return None
    where = f" writing {full.filename}" if full.filename else ""
    head = f"no space left on device (ENOSPC){where}: free disk space, then resume"
    if error is full and full.filename and (full.strerror or "").lower().startswith("no space left on device ("):
        return head  # the error says nothing more
    return f"{head}; {type(error).__name__}: {error}"


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
