"""The docs are tests: every fenced ``bash`` and ``python`` block of README.md, CONTRIBUTING.md and
docs/**/*.md runs as written, one pytest test per block (``docs/sweeps.md:22``), through Sybil's Markdown parsers.

- A ``python`` block runs in the page's namespace (Sybil's: the blocks of a page share their names, in order; an
  ``<!-- invisible-code-block: python -->`` comment sets up what a fragment takes from the surrounding text).
- A ``bash`` block runs as written with ``bash -e -o pipefail -c`` in a copy of the checkout's layout (its folders
  linked, docs/ and results/ copied, so that nothing a command writes lands in the checkout), with the one budget
  switch ``DIFFRANK_SMOKE=1`` (docs/experiments.md, "Smoke budget": every training run one epoch of two batches, an
  Optuna search two trials), ``DIFFRANK_ROOT`` there, ``WANDB_MODE=offline``, ``OMP_NUM_THREADS=2``, the
  virtual environment's ``python`` first on ``PATH``, and ``DATA`` = ``$DIFFRANK_DATA`` when that is set. The block
  passes when it exits with status 0.
- ``<!-- skip: next "reason" -->`` (Sybil's skip) before a block: not run (a signature listing, placeholders such
  as ``<folder>``).
- ``<!-- docs-test: compose "reason" -->`` before a bash block: checked as far as this machine allows (a GPU, real
  data that is absent, hours of training, SLURM, installing packages, the test suite itself). bash checks its
  syntax, then runs it with ``python``, ``diffrank-*`` and ``make`` standing in for checks: every
  ``python train.py ARGS`` / ``diffrank-train ARGS`` composes as ``--cfg job`` would; a multirun goes through its
  sweeper (the basic one, Optuna) with a launcher that composes each job instead of running it, the basic sweeper's
  jobs thinned to as many as the longest list of values so that every value of every swept key is composed;
  ``python -m M`` and another ``diffrank-*`` program run with ``--help``; ``make T`` runs as ``make -n T``; ``python``
  inside ``$(…)`` (or a pipeline) runs, its output being an argument; any other program is not run.
- ``<!-- docs-test: data MNIST/raw "reason" -->``: runs in full when ``$DIFFRANK_DATA/MNIST/raw`` is a folder,
  else as ``compose``.

``python tests/test_docs.py`` prints how many blocks run, how many are checked by composition and how many are
skipped, with their reasons.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import io
import math
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.doctest import DocTestEvaluator
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)
#: the pages whose blocks are tests
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
#: fenced languages that are programs (run); any other fenced language is text (yaml: a config shown, "": output)
RUN_LANGUAGES = ("bash", "python")
TEXT_LANGUAGES = ("yaml", "text", "")
BLOCK_TIMEOUT = 600
#: programs a compose check may run for real (inside ``$(…)``, loops): read-only text tools
SHELL_TOOLS = ("seq", "sort", "head", "tail", "cut", "tr", "basename", "dirname", "date", "wc")
#: what is copied (not linked) into the working folder of the blocks: commands may write there
COPIED = ("docs", "results")
NOT_LINKED = ("outputs", ".git", ".pytest_cache", ".ruff_cache", *COPIED)


# ----------------------------------------------------------------------------------------------------------------
# the working folder and the environment of a block


_WORKDIR: Path | None = None


def workdir() -> Path:
    """A folder laid out like the checkout (its entries linked, docs/ and results/ copied) where the blocks run:
    relative paths in a command (``hydra.sweep.dir=outputs/my_grid``, ``--out curves.png``) land here. Made once
    per process, removed at exit."""
    global _WORKDIR
    if _WORKDIR is None:
        folder = Path(tempfile.mkdtemp(prefix="diffrank-docs-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        for entry in ROOT.iterdir():
            if entry.name in NOT_LINKED:
                continue
            (folder / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
        for name in COPIED:
            shutil.copytree(ROOT / name, folder / name, symlinks=True)
        bin_dir = folder / ".docs-test-bin"  # the PATH of a compose check
        bin_dir.mkdir()
        for tool in SHELL_TOOLS:
            if found := shutil.which(tool):
                (bin_dir / tool).symlink_to(found)
        _WORKDIR = folder
    return _WORKDIR


def block_env() -> dict[str, str]:
    """The environment of a bash block: the user's, with the smoke budget switched on and outputs in
    :func:`workdir`."""
    drop = {"DIFFRANK_ROOT", "DIFFRANK_SWEPT_KEYS", "PYTEST_CURRENT_TEST", "TRITON_INTERPRET", "DATA"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(DIFFRANK_SMOKE="1", DIFFRANK_ROOT=str(workdir()), WANDB_MODE="offline", OMP_NUM_THREADS="2",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PATH=f"{PYTHON.parent}{os.pathsep}{env.get('PATH', '')}")
    if env.get("DIFFRANK_DATA"):
        env["DATA"] = env["DIFFRANK_DATA"]  # the docs' $DATA: the folder of the real data sets
    return env


def _tail(text: str, n: int = 6000) -> str:
    return text if len(text) <= n else "…" + text[-n:]


# ----------------------------------------------------------------------------------------------------------------
# bash blocks: run, or check as far as this machine allows

#: the functions that stand in for the programs of a compose-checked block (bash's ``command_not_found_handle``
#: answers for every program that is not on the restricted PATH)
COMPOSE_PRELUDE = r"""
__docs_record() { printf '%s\0' "$#" "$@" >> "$DOCS_TEST_QUEUE"; }
python() {
  if (( BASH_SUBSHELL > 0 )); then "$DOCS_TEST_PYTHON" "$@"; return; fi   # $(python …): its output is an argument
  __docs_record python "$@"
}
make() { echo "+ make -n $*"; "$DOCS_TEST_MAKE" -n "$@" > /dev/null; }
command_not_found_handle() {
  case "$1" in
    diffrank-*) __docs_record "$@" ;;
    *) echo "docs-test: not run in a compose check: $*" >&2 ;;
  esac
  return 0
}
PATH="$DOCS_TEST_BIN"
"""


def run_bash(example: Example) -> str | None:
    """Sybil's evaluator of a ``bash`` block: run it as written; a failure (exit status != 0) returns the message
    Sybil raises, with the tail of the output."""
    return _bash(str(example.parsed), compose=False)


def _bash(script: str, compose: bool) -> str | None:
    """Run a bash block (``compose``: check it as far as this machine allows, as the module docstring says)."""
    env, cwd = block_env(), workdir()
    syntax = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    if syntax.returncode:
        return f"bash -n: syntax error\n{syntax.stderr}"
    queue = None
    if compose:
        fd, queue = tempfile.mkstemp(prefix="queue-", dir=cwd)
        os.close(fd)
        env.update(DOCS_TEST_QUEUE=queue, DOCS_TEST_PYTHON=str(PYTHON), DOCS_TEST_BIN=str(cwd / ".docs-test-bin"),
                   DOCS_TEST_MAKE=shutil.which("make") or "false")
        script = COMPOSE_PRELUDE + script
    try:
        out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
        text, rc = out.stdout, out.returncode
        if compose and rc == 0:
            check = subprocess.run([str(PYTHON), str(Path(__file__).resolve()), "--check", queue], cwd=cwd, env=env,
                                   text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
            text, rc = text + check.stdout, check.returncode
    except subprocess.TimeoutExpired as e:
        out_text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return f"timed out after {BLOCK_TIMEOUT} s\n{_tail(out_text)}"
    finally:
        if queue:
            Path(queue).unlink(missing_ok=True)
    if rc:
        return f"exit status {rc}{' (compose check)' if compose else ''}; the output's tail:\n{_tail(text)}"
    return None


# ----------------------------------------------------------------------------------------------------------------
# the markers


@dataclass(frozen=True)
class Marker:
    """``<!-- docs-test: compose "reason" -->`` or ``<!-- docs-test: data MNIST/raw "reason" -->``."""

    mode: str  # "compose" | "data"
    reason: str
    data: str = ""  # for "data": the folder under $DIFFRANK_DATA whose presence runs the block in full

    def runs_in_full(self) -> bool:
        """Whether the next block runs in full here (a ``data`` marker whose data is present)."""
        root = os.environ.get("DIFFRANK_DATA")
        return self.mode == "data" and bool(root) and (Path(root) / self.data).is_dir()


MARKER = re.compile(r'^(?P<mode>compose|data)(?:\s+(?P<data>[^\s"]+))?\s+"(?P<reason>[^"]*)"\s*$')


class MarkerParser:
    """Sybil parser of the ``docs-test`` directives (Sybil's HTML-comment directive lexer): each yields a region
    whose evaluation hands the next example, a bash block, to the compose check (or, for a ``data`` marker whose
    data is present, runs it in full)."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="docs-test", arguments=".*?")

    def __call__(self, document: Document):
        for lexed in self.lexer(document):
            arguments = (lexed.lexemes.get("arguments") or "").strip()
            match = MARKER.match(arguments)
            if match is None or (match["mode"] == "data") != bool(match["data"]):
                raise ValueError(f"{document.path}: malformed docs-test marker {arguments!r}: expected "
                                 '\'compose "reason"\' or \'data <folder under $DIFFRANK_DATA> "reason"\'')
            marker = Marker(match["mode"], match["reason"].strip(), match["data"] or "")
            yield Region(lexed.start, lexed.end, marker, _install)


class _NextBlock:
    """Pushed on the document by a marker: evaluates the next example as the marker says, then removes itself."""

    def __init__(self, marker: Marker) -> None:
        self.marker = marker

    def __call__(self, example: Example) -> str | None:
        example.document.pop_evaluator(self)
        if example.region.evaluator is not run_bash:
            raise ValueError(f"line {example.line}: a docs-test marker must come right before a ```bash block")
        return _bash(str(example.parsed), compose=not self.marker.runs_in_full())


def _install(example: Example) -> None:
    example.document.push_evaluator(_NextBlock(example.parsed))


#: the one Sybil configuration of the doc tests (the planted-failure tests use it too)
SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="bash", evaluator=run_bash),
        SkipParser(),
        MarkerParser(),
    ],
    path=str(ROOT),
)


# ----------------------------------------------------------------------------------------------------------------
# the blocks of the pages


@dataclass
class Block:
    """One runnable example of a page and the marker examples right before it."""

    page: Path
    example: Example
    markers: tuple[Example, ...]

    @property
    def id(self) -> str:
        """``docs/sweeps.md:22``: the page and the line of the opening fence."""
        try:
            page = self.page.relative_to(ROOT).as_posix()
        except ValueError:
            page = self.page.name
        return f"{page}:{self.example.line}"

    @property
    def language(self) -> str:
        """``bash`` or ``python``."""
        return "bash" if self.example.region.evaluator is run_bash else "python"

    @property
    def invisible(self) -> bool:
        """An ``<!-- invisible-code-block: python -->`` (setup or check a page does not show)."""
        return self.example.document.text.startswith("<!--", self.example.start)

    def plan(self) -> tuple[str, str]:
        """(``run`` | ``compose`` | ``data`` | ``skip``, reason)."""
        for marker in self.markers:
            if isinstance(marker.parsed, Marker):
                return marker.parsed.mode, marker.parsed.reason
            action, reason = marker.parsed
            if action == "next":
                return "skip", _skip_reason(reason)
        return "run", ""


def _skip_reason(reason: str | None) -> str:
    try:
        value = ast.literal_eval(reason or "")
    except (ValueError, SyntaxError):
        return ""
    return value.strip() if isinstance(value, str) else ""


def _is_block(example: Example) -> bool:
    evaluator = example.region.evaluator
    return evaluator is run_bash or isinstance(evaluator, (PythonEvaluator, DocTestEvaluator))


def blocks_of(page: Path, sybil: Sybil = SYBIL) -> tuple[list[Block], list[Example]]:
    """The runnable blocks of a page, each with its markers, and the markers that precede no block."""
    document = sybil.parse(page)
    blocks: list[Block] = []
    pending: list[Example] = []
    for example in document.examples():
        if _is_block(example):
            blocks.append(Block(page, example, tuple(pending)))
            pending = []
        else:
            pending.append(example)
    return blocks, pending


_DONE: set[int] = set()  # ids of the examples evaluated in this process (a page's python blocks run once, in order)


def evaluate(block: Block, earlier: list[Block] = ()) -> None:
    """Evaluate a block the way Sybil would in page order: its markers, then the block. A python block first runs
    the page's earlier python blocks that have not run (the page's namespace), so that ``-k`` may pick one."""
    if block.language == "python":
        for prior in earlier:
            if prior.language == "python" and id(prior.example) not in _DONE:
                with contextlib.suppress(unittest.SkipTest):
                    _evaluate_one(prior)
    _evaluate_one(block)


def _evaluate_one(block: Block) -> None:
    _DONE.add(id(block.example))
    for marker in block.markers:
        marker.evaluate()
    block.example.evaluate()


_PAGE_BLOCKS = {page: blocks_of(page) for page in PAGES}
BLOCKS = [block for blocks, _ in _PAGE_BLOCKS.values() for block in blocks]


def tally(blocks: list[Block] = BLOCKS) -> dict[str, Counter]:
    """How the blocks are tested: ``{"run": Counter({"bash": n, "python": m}), "compose": Counter(reason: n), …}``
    (an invisible python block counts under ``run`` as ``python (invisible)``)."""
    out: dict[str, Counter] = {"run": Counter(), "compose": Counter(), "data": Counter(), "skip": Counter()}
    for block in blocks:
        mode, reason = block.plan()
        if mode == "run":
            out["run"][block.language + (" (invisible)" if block.invisible else "")] += 1
        else:
            out[mode][reason] += 1
    return out


def tally_text(blocks: list[Block] = BLOCKS) -> str:
    """:func:`tally` as lines of text, and the marked blocks with their reasons."""
    t = tally(blocks)
    data_full = sum(block.markers[-1].parsed.runs_in_full() for block in blocks if block.plan()[0] == "data")
    lines = [f"{len(blocks)} blocks on {len(_PAGE_BLOCKS)} pages: {sum(t['run'].values())} run in full "
             f"({dict(t['run'])}), {sum(t['compose'].values())} composed, {sum(t['data'].values())} need real data "
             f"({data_full} of them run in full here), {sum(t['skip'].values())} skipped"]
    for block in blocks:
        mode, reason = block.plan()
        if mode != "run":
            lines.append(f"  {block.id:34s} {mode:8s} {reason}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_block(block):
    """The block runs as written (or is checked as its marker says)."""
    earlier = _PAGE_BLOCKS[block.page][0]
    try:
        evaluate(block, earlier[:earlier.index(block)])
    except unittest.SkipTest as e:
        pytest.skip(str(e))


def test_every_marker_has_a_reason_and_a_block():
    """Every skip / docs-test marker names its reason and comes right before a block; a docs-test marker only
    before a bash block; every fenced block is a program we run or text in a known language."""
    problems = []
    for page, (blocks, dangling) in _PAGE_BLOCKS.items():
        problems += [f"{page.relative_to(ROOT)}:{m.line}: marker before no block" for m in dangling]
        for block in blocks:
            text = block.example.document.text
            for marker, after in zip(block.markers, [*block.markers[1:], block.example]):
                if not re.fullmatch(r"-*>?\s*", text[marker.end:after.start]):  # a marker's region ends before -->
                    problems.append(f"{page.relative_to(ROOT)}:{marker.line}: text between the marker and its block")
                if isinstance(marker.parsed, Marker):
                    if block.language != "bash":
                        problems.append(f"{block.id}: a docs-test marker before a {block.language} block")
                elif marker.parsed[0] != "next":
                    problems.append(f"{block.id}: use '<!-- skip: next \"reason\" -->', not skip: {marker.parsed[0]}")
            if block.plan()[0] != "run" and not block.plan()[1]:
                problems.append(f"{block.id}: a marker without a reason")
        problems += unknown_languages(page)
    assert not problems, "\n".join(problems)
    print(tally_text())


def unknown_languages(page: Path) -> list[str]:
    """Fenced blocks of a page in a language the doc tests neither run nor know as text (``sh``, ``console``…)."""
    document = Document(page.read_text(encoding="utf-8"), str(page))
    lexer = FencedCodeBlockLexer(language=r"[^\n]*", mapping={"language": "language"})
    return [f"{page.name}:{document.text.count(chr(10), 0, region.start) + 1}: ```{region.lexemes['language']} "
            f"(run it as ```bash / ```python, or mark it as text)"
            for region in lexer(document)
            if region.lexemes["language"].strip() not in RUN_LANGUAGES + TEXT_LANGUAGES]


def test_the_pages_have_blocks_that_run():
    """The pages' blocks are found: some run in full, some are composed (a parse that found none would pass)."""
    t = tally()
    assert sum(t["run"].values()) >= 5 and sum(t["compose"].values()) + sum(t["data"].values()) >= 5, tally_text()


def _planted(tmp_path: Path, text: str) -> Block:
    """docs/sweeps.md copied, with ``text`` appended: its last block."""
    page = tmp_path / "sweeps.md"
    page.write_text((ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8") + "\n" + text, encoding="utf-8")
    blocks, dangling = blocks_of(page)
    assert not dangling
    return blocks[-1]


def test_planted_broken_command_fails(tmp_path):
    """A page with a command that cannot run fails its doc test: an unknown operator, an unknown module."""
    from sybil.example import SybilFailure

    block = _planted(tmp_path, "```bash\npython train.py operator=no_such_operator\n```\n")
    assert block.plan() == ("run", "")
    with pytest.raises(SybilFailure, match="no_such_operator"):
        evaluate(block)
    block = _planted(tmp_path, "```bash\npython -m diffrank.no_such_module --help\n```\n")
    with pytest.raises(SybilFailure, match="No module named diffrank.no_such_module"):
        evaluate(block)


@pytest.mark.slow  # ~33 s: the harness's own check; every compose block of the docs runs in the default suite
def test_planted_broken_compose_block_fails(tmp_path):
    """A compose-checked block fails on a broken override in one job of a multirun, on an unknown key of a single
    run and on an unknown module, and passes when its commands are right."""
    from sybil.example import SybilFailure

    def page(*lines):
        return '<!-- docs-test: compose "planted" -->\n```bash\n' + "\n".join(lines) + "\n```\n"

    good = ["python train.py -m operator=neuralsort,softsort operator.beta=0.5,1 hydra/launcher=slurm_1gpu",
            "python train.py hparams_search=beta_grid sweep.beta_min=1 sweep.beta_max=4 operator=softsort",
            "python -m diffrank.experiments.analysis.sweep_summary outputs/no/such/sweep"]
    block = _planted(tmp_path, page(*good))
    assert block.plan() == ("compose", "planted")
    evaluate(block)
    for broken, match in [("python train.py -m operator=neuralsort,no_such_operator seed=0,1", "no_such_operator"),
                          ("python train.py operator.no_such_key=1", "no_such_key"),
                          ("diffrank-train hparams_search=beta_grid sweep.no_such_key=1", "no_such_key"),
                          ("python -m diffrank.experiments.no_such_module x", "no_such_module")]:
        block = _planted(tmp_path, page(good[-1], broken))  # a good line first: one bad command fails the block
        with pytest.raises(SybilFailure, match=match):
            evaluate(block)


def test_planted_marker_without_reason_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('<!-- docs-test: compose -->\n```bash\ntrue\n```\n', encoding="utf-8")
    with pytest.raises(ValueError, match="malformed docs-test marker"):
        blocks_of(page)


# ----------------------------------------------------------------------------------------------------------------
# the compose check (run as ``python tests/test_docs.py --check QUEUE`` by :func:`compose_bash`)


def _read_queue(path: Path) -> list[list[str]]:
    fields = path.read_bytes().split(b"\0")[:-1]
    commands, i = [], 0
    while i < len(fields):
        n = int(fields[i])
        commands.append([f.decode() for f in fields[i + 1:i + 1 + n]])
        i += 1 + n
    return commands


class _Checker:
    """Compose ``train.py`` command lines as Hydra would (``--cfg job``; a multirun: each job through the sweeper),
    and run every other program with ``--help`` (once)."""

    def __init__(self) -> None:
        self.helped: set[tuple[str, str]] = set()
        self._hydra = None

    def hydra(self):
        if self._hydra is None:
            from hydra._internal.hydra import Hydra
            from hydra._internal.utils import create_config_search_path

            from diffrank.experiments.run.resolvers import register_resolvers

            register_resolvers()  # as train.py does before Hydra composes
            self._hydra = Hydra.create_main_hydra2(task_name="train",
                                                   config_search_path=create_config_search_path(str(ROOT / "configs")))
        return self._hydra

    def check(self, argv: list[str]) -> str:
        prog, *args = argv
        if prog == "python" and args[:1] == ["-m"] and len(args) > 1:
            return self.help("module", args[1])
        if prog == "python" and args and Path(args[0]).name == "train.py":
            return self.compose(args[1:])
        if prog == "python" and args and args[0].endswith(".py"):
            return self.help("script", args[0])
        if prog == "diffrank-train":
            return self.compose(args)
        if prog.startswith("diffrank-"):
            return self.help("program", prog)
        raise ValueError(f"cannot check {' '.join(argv)!r} without running it")

    def help(self, kind: str, target: str) -> str:
        """``python -m target --help`` (kind ``module``) or ``python target --help`` (``script``) in this process
        (torch imported once for all of a block's programs); ``target --help`` (``program``) in a subprocess."""
        shown = {"module": f"python -m {target}", "script": f"python {target}", "program": target}[kind]
        if (kind, target) in self.helped:
            return "--help (checked above)"
        self.helped.add((kind, target))
        if kind == "program":
            out = subprocess.run([target, "--help"], capture_output=True, text=True, timeout=300)
            code, text = out.returncode, out.stdout + out.stderr
        else:
            argv, buffer = sys.argv, io.StringIO()
            sys.argv = [target, "--help"]
            try:
                with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                    if kind == "module":
                        runpy.run_module(target, run_name="__main__", alter_sys=True)
                    else:
                        runpy.run_path(target, run_name="__main__")
                code = "no exit: --help was not handled"
            except SystemExit as e:
                code = e.code or 0
            finally:
                sys.argv = argv
            text = buffer.getvalue()
        if code:
            raise RuntimeError(f"{shown} --help: exit status {code}\n{_tail(text, 3000)}")
        return "--help"

    def compose(self, args: list[str]) -> str:
        from hydra.types import RunMode

        multirun = any(a in ("-m", "--multirun") for a in args)
        overrides = [a for a in args if a not in ("-m", "--multirun")]
        if flags := [a for a in overrides if a.startswith("-")]:
            raise ValueError(f"Hydra flags the check does not know: {flags}")
        hydra = self.hydra()
        mode = hydra.get_mode(config_name="train", overrides=overrides)
        if not multirun and mode != RunMode.MULTIRUN:  # what --cfg job composes
            hydra.compose_config("train", overrides, run_mode=RunMode.RUN, with_log_configuration=False)
            return "composed (--cfg job)"
        if mode != RunMode.MULTIRUN:
            overrides = [*overrides, "hydra.mode=MULTIRUN"]
        return f"composed {self.multirun(overrides)} jobs (multirun)"

    def multirun(self, overrides: list[str]) -> str:
        """Hydra's multirun (``Hydra.multirun``) with a launcher that composes each job (as a launcher does before
        it runs the job) instead of running it; how many jobs it composed."""
        from hydra._internal.callbacks import Callbacks
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.plugins import Plugins
        from hydra.core.utils import JobReturn, JobStatus
        from hydra.plugins.launcher import Launcher
        from hydra.types import HydraContext, RunMode
        from omegaconf import OmegaConf, open_dict

        hydra = self.hydra()
        cfg = hydra.compose_config("train", overrides, run_mode=RunMode.MULTIRUN, with_log_configuration=False)
        Path(str(cfg.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)  # as SweepSummary.on_multirun_start
        loader = hydra.config_loader

        class ComposeOnly(Launcher):
            jobs = 0

            def setup(self, **kwargs) -> None:
                pass

            def launch(self, job_overrides, initial_job_idx):
                returns = []
                for idx, job in enumerate(job_overrides):
                    job_cfg = loader.load_sweep_config(cfg, list(job))
                    with open_dict(job_cfg):
                        job_cfg.hydra.job.num = initial_job_idx + idx
                        job_cfg.hydra.job.id = f"compose_{initial_job_idx + idx}"
                    HydraConfig.instance().set_config(job_cfg)
                    str(OmegaConf.select(job_cfg, "hydra.sweep.subdir"))  # the job's folder name resolves
                    returns.append(JobReturn(overrides=list(job), cfg=job_cfg, status=JobStatus.COMPLETED,
                                             _return_value=0.0))
                ComposeOnly.jobs += len(returns)
                return returns

        sweeper = Plugins.instance().instantiate_sweeper(
            config=cfg, hydra_context=HydraContext(config_loader=loader, callbacks=Callbacks()),
            task_function=lambda _cfg: None)
        getattr(sweeper, "sweeper", sweeper).launcher = ComposeOnly()  # Optuna's sweeper wraps its implementation
        counts = {}
        if isinstance(sweeper, BasicSweeper):
            sweeper.split_arguments = lambda overrides, _batch: _covering(overrides, counts)
            sweeper.validate_batch_is_legal = lambda batch: None  # ComposeOnly composes each job (once)
        sweeper.sweep(arguments=OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False))
        if not ComposeOnly.jobs:
            raise RuntimeError("the multirun has no job")
        if counts.get("jobs", ComposeOnly.jobs) > ComposeOnly.jobs:
            return f"{ComposeOnly.jobs} of its {counts['jobs']}"
        return str(ComposeOnly.jobs)


def _covering(overrides, counts: dict) -> list[list[list[str]]]:
    """The jobs of a basic sweep, as :meth:`BasicSweeper.split_arguments` lists them, thinned so that every value of
    every swept key is in at least one job (job i takes value i mod n of each key): a multirun of hundreds of jobs
    composes as many jobs as its longest list; ``counts["jobs"]``: how many jobs the sweep has."""
    lists = {}
    for override in overrides:
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                raise ValueError(f"the basic sweeper does not support {override.input_line}")
            lists[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            lists[key] = [f"{key}={override.get_value_element_as_str()}"]
    counts["jobs"] = math.prod(len(values) for values in lists.values())
    longest = max((len(values) for values in lists.values()), default=1)
    return [[[values[i % len(values)] for values in lists.values()] for i in range(longest)]]


def _check_queue(path: Path) -> int:
    checker, failed = _Checker(), 0
    commands = _read_queue(path)
    for argv in commands:
        try:
            print(f"ok: {checker.check(argv)}: {' '.join(argv)}", flush=True)
        except Exception as e:  # every command is checked; the block fails if one fails
            failed += 1
            print(f"FAILED: {' '.join(argv)}\n  {type(e).__name__}: {e}", flush=True)
    print(f"{len(commands) - failed} of {len(commands)} commands check out", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        sys.exit(_check_queue(Path(sys.argv[2])))
    print(tally_text())
