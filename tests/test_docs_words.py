"""The documentation speaks of the project, and every ratio says which way it goes.

Read over every git-tracked ``*.md`` file and the docstrings and comments of every tracked ``src/**/*.py``:

- no absolute path of a development machine (``/work/``, ``/home/``, ``/root/``, ``/Users/``, ``/tmp/``,
  a sibling ``shared`` folder of the checkout): a command or a path in the docs is one a user can run or has;
- no words about the circumstances the text was written in (a work session, who else used the machine): a
  measured figure keeps its conditions (machine kind, thread count, load average, date) and nothing else;
- no ratio without a direction: ``0.10x torchsort's`` may be a time or a speed, so a number followed by ``x`` / ``×``
  and a word must say what it compares (``10× faster than``, ``3.2× the time of``, ``4x less``). A ratio closing a
  sentence or a table cell (``| 15.5× |`` under a "speed-up" header, ``(1.63×)`` after its comparison) is not
  matched;
- no number of the project's issues (the word followed by a number, after a space, ``-`` or ``_``), here and in
  the paths, names, docstrings and comments of every tracked ``tests/**/*.py``, and no test named for a case
  number (``test_case2_…``): a text or a test says the behaviour, which stays when the issue is closed. Another
  project's issue is cited with its name and ``#`` (``diffsort issue #7``).
"""

from __future__ import annotations

import ast
import functools
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PATHS = re.compile(r"(?<![\w.~])/(?:work|home|root|Users|tmp)/|\.\./shared\b")

CIRCUMSTANCES = [re.compile(p, re.IGNORECASE) for p in (
    r"\bsessions?\b",                                                 # "this session", "a later session"
    r"\bwork(?:ing)? (?:period|day)s?\b",
    r"\bother (?:jobs|work|engineers?|people|users|workers|sessions)\b",
    r"\bshared (?:the|this|its|a) (?:2-core )?(?:machine|cores?|cpus?)\b",  # "three runs shared the machine"
    r"\b(?:machine|cores?|cpus?),? (?:was |were )?shared with\b",   # "a machine shared with other work"
    r"\b(?:was|were) shared with\b",                                   # "It was shared with a training run"
    r"\bthe shared (?:\d+-core )?(?:machine|cores?|cpus?)\b",           # "on the shared 2-core machine"
    r"\b(?:jobs?|runs?) shared (?:them|it)\b|\bbeside (?:a|an|one) (?:third|other|another) job\b",
    r"\b(?:engineers|colleagues|helpers)' (?:work|benchmarks|runs|jobs)\b",
    r"\bloaded by (?:other|another)\b",
)]

# a number, then x / ×, then (across a line break too) a word that does not say which way the ratio goes
DIRECTION = (r"(?:faster|slower|more|less|fewer|larger|smaller|longer|shorter|higher|lower|bigger|"
             r"as (?:many|much|long|large|fast|slow)|the [\w' -]{1,30}? of|(?:that|those) of|"
             r"the (?:time|wall time|memory|compute|cost|error)|speed-?ups?|slow-?downs?)\b")
RATIO = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?[x×]\s+(?!\**" + DIRECTION + r")[`*'\"]*[^\W\d_]")

# a number of this project's issues; another project's is cited with its name and "#" (diffsort issue #7)
ISSUE = re.compile(r"(?<![A-Za-z])issues?[ _-]?\d+", re.IGNORECASE)
# a test named for the case of an issue, not for its behaviour
CASE_NAME = re.compile(r"^test_(?:\w*_)?case_?\d+", re.IGNORECASE)

# (file, an exact excerpt of the matched line) that a rule above matches but that is not what it is about
EXCEPTIONS: set[tuple[str, str]] = set()


def _tracked(pattern: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", pattern], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return sorted(ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file())


def _python_text(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every docstring and comment of a Python file."""
    source = path.read_text(encoding="utf-8")
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                parts.append((first.lineno, first.value.value))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            parts.append((tok.start[0], tok.string))
    return parts


@functools.lru_cache(maxsize=1)
def _texts() -> list[tuple[str, int, str]]:
    texts = [(p.relative_to(ROOT).as_posix(), 1, p.read_text(encoding="utf-8")) for p in _tracked("*.md")]
    for p in _tracked("src/*.py"):
        texts += [(p.relative_to(ROOT).as_posix(), line, text) for line, text in _python_text(p)]
    return texts


@functools.lru_cache(maxsize=1)
def _test_texts() -> list[tuple[str, int, str]]:
    """(file, line, text) of every tracked ``tests/**/*.py``: its path, its docstrings and comments, and the names of
    its functions and classes (string literals are left out: the patterns' own examples are literals)."""
    texts = []
    for p in _tracked("tests/*.py"):
        name = p.relative_to(ROOT).as_posix()
        texts += [(name, 1, name), *((name, line, text) for line, text in _python_text(p))]
        texts += [(name, node.lineno, node.name) for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return texts


def _findings(patterns: list[re.Pattern], texts=None) -> list[str]:
    found = []
    for name, first, text in _texts() if texts is None else texts:
        for pattern in patterns:
            for m in pattern.finditer(text):
                line = first + text.count("\n", 0, m.start())
                excerpt = text[text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0].strip()
                if (name, excerpt) not in EXCEPTIONS:
                    found.append(f"{name}:{line}: {m.group(0)!r} in {excerpt[:160]!r}")
    return found


def test_files_are_found():
    names = {name for name, _, _ in _texts()}
    assert "README.md" in names and "docs/index.md" in names
    assert any(n.startswith("src/diffrank/") for n in names)


def test_no_development_machine_paths():
    found = _findings([PATHS])
    assert not found, "absolute paths of a development machine:\n" + "\n".join(found)


def test_no_words_about_the_writing():
    found = _findings(CIRCUMSTANCES)
    assert not found, "text about the circumstances of writing, not the project:\n" + "\n".join(found)


def test_no_issue_numbers():
    """Docs, README, CONTRIBUTING, the library's docstrings and comments, and the tests say the behaviour, not the
    issue that asked for it; no test is named for a case number."""
    found = _findings([ISSUE], _texts() + _test_texts()) + _findings([CASE_NAME], _test_texts())
    assert not found, "issue numbers or case numbers (say the behaviour instead):\n" + "\n".join(found)


@pytest.mark.parametrize(("text", "bad"), [
    ("Issue 37: dim=1.0 raised", True),
    ("the front door (issue-43)", True),
    ("tests/experiments/test_issue37_runs.py", True),
    ("issues 25 and 28", True),
    ("diffsort issue #7", False),
    ("the issue's symptom, 37 runs", False),
])
def test_issue_pattern(text, bad):
    assert bool(ISSUE.search(text)) is bad


@pytest.mark.parametrize(("name", "bad"), [
    ("test_case2_new_run_is_refused", True),
    ("test_case_12_sigterm", True),
    ("test_a_new_run_into_a_finished_folder_is_refused", False),
    ("test_lowercase_labels", False),
])
def test_case_name_pattern(name, bad):
    assert bool(CASE_NAME.search(name)) is bad


def test_every_ratio_has_a_direction():
    found = _findings([RATIO])
    assert not found, ("a ratio without a direction (say '10× faster than', '3.2× the time of'):\n"
                       + "\n".join(found))


@pytest.mark.parametrize(("text", "bad"), [
    ("0.10x torchsort's CUDA extension, 3.2x `torch.sort`", True),
    ("at most 3x PyTorch's own error", True),
    ("measured at 625× the sets", True),
    ("(0.9–1.1× here, 0.8–1.1× in earlier runs)", True),
    ("10× faster than torchsort's CUDA extension", False),
    ("3.2× the time of `torch.sort`", False),
    ("0.8–1.1× the time in earlier runs", False),
    ("the kernel's error at most 3× that of float32 PyTorch", False),
    ("is **1.9x faster**", False),
    ("uint8 in memory (4x less)", False),
    ("| 15.5× | 12 MB |", False),
    ("on one thread (1.63×), but", False),
    ("the 32x48d backbone, 28×28 images, 2 x 512 loads", False),
    ("differed by up to 2×. For example", False),
])
def test_ratio_pattern(text, bad):
    assert bool(RATIO.search(text)) is bad


@pytest.mark.parametrize(("text", "bad"), [
    ("its report is in the session report", True),
    ("longer than a 3-hour session", True),
    ("It shared the cores with other engineers' work", True),
    ("on a machine shared with other work", True),
    ("while three training runs shared the machine", True),
    ("It was shared with a training run and a test suite", True),
    ("1 thread on the shared 2-core machine, 139 s", True),
    ("up to 14.5 min while a third job shared them", True),
    ("the parameters shared with RESGRO", False),
    ("on a shared CPU it moves with the load", False),
    ("load average 6–7, one thread", False),
])
def test_circumstance_patterns(text, bad):
    assert any(p.search(text) for p in CIRCUMSTANCES) is bad
