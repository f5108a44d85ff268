"""Without the ``experiments`` extra, ``diffrank-train`` and ``python train.py`` end with the commands that install it,
not with a bare ``No module named 'hydra'``.

They run in the library-only environment of ``devtools/library_env.py`` (the library's dependency closure, where
the framework's modules are really absent), and once in this environment with one module of the extra that the
entry does not check beforehand hidden by a meta-path finder (the runner's own imports then fail).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from devtools.library_env import build
from helpers import ROOT

INSTALL = ('pip install "diffrank[experiments]"', 'pip install -e ".[experiments]"')

# a Python where the modules named in argv[1] are not installed: importing them (or their find_spec) raises
# ModuleNotFoundError; then the diffrank-train entry point runs
HIDDEN = textwrap.dedent("""
    import importlib.abc, sys
    hidden = set(sys.argv[1].split(","))
    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in hidden:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Hide())
    module, attr = sys.argv[2].split(":")
    sys.argv = ["diffrank-train"]
    getattr(__import__(module, fromlist=[attr]), attr)()
""")


def _console_script(name: str) -> str:
    """``module:function`` of the console script ``name`` in pyproject.toml."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"][name]


@pytest.fixture(scope="module")
def library_python(tmp_path_factory):
    """The python of a library-only environment (built in about a second, no download)."""
    return build(tmp_path_factory.mktemp("library-env"))


def _run(python, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(ROOT / "src")
    return subprocess.run([str(python), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _assert_install_message(out: subprocess.CompletedProcess, command: str, missing: str) -> None:
    assert out.returncode == 1, (out.returncode, out.stderr[-3000:])
    assert f"{command} needs the experiment framework" in out.stderr, out.stderr[-3000:]
    assert all(line in out.stderr for line in INSTALL), out.stderr
    assert f"missing: {missing}" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_library_env_lacks_the_framework(library_python):
    code = "import importlib.util as u; print(u.find_spec('hydra'), u.find_spec('lightning'))"
    out = _run(library_python, "-c", code)
    assert out.stdout.split() == ["None", "None"], out.stderr


def test_diffrank_train_without_the_extra(library_python):
    module, attr = _console_script("diffrank-train").split(":")
    code = f"import sys; sys.argv = ['diffrank-train']; from {module} import {attr}; {attr}()"
    out = _run(library_python, "-c", code)
    _assert_install_message(out, "diffrank-train", "hydra-core, lightning, omegaconf, torchmetrics, torchvision")


def test_train_py_without_the_extra(library_python):
    out = _run(library_python, "train.py", "operator=sinkhorn")
    _assert_install_message(out, "python train.py", "hydra-core, lightning, omegaconf, torchmetrics, torchvision")


def test_diffrank_train_when_the_runner_misses_a_module_of_the_extra():
    """A module the entry does not check beforehand (matplotlib, which the runner imports): the same message."""
    out = subprocess.run([sys.executable, "-c", HIDDEN, "matplotlib", _console_script("diffrank-train")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    _assert_install_message(out, "diffrank-train", "matplotlib")
