"""Run the library's tests in an environment that holds only the library's dependencies.

The library (:mod:`diffrank.operators`, ``.losses``, ``.functional``, ``.kernels``, ``.compat``, ``.reference``,
``.registry``) needs torch, numpy, numba and PyYAML; its tests add pytest, and hypothesis (``tests/operators/
test_fuzz.py``) and scipy (``tests/operators/test_fast_soft_sort.py``). This builds, in a few seconds and without
a download, a virtual environment that sees exactly the dependency closure of those distributions, taken from
the running interpreter's installed distributions (their ``importlib.metadata`` requirements, markers evaluated
here): a folder of symbolic links to their files, put on the new environment's path by a ``.pth`` file. Then
it runs pytest there on the library's tests, with ``src/`` as the only other path. A test that imports the
experiment framework (lightning, hydra, omegaconf, wandb, torchmetrics) fails with ``ModuleNotFoundError``.

    python devtools/library_env.py [PYTEST_ARGS...]     # default: the library's tests, not slow, not gpu

Exit status: pytest's; 2 when a distribution of the closure is not installed in the running interpreter.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LIBRARY_DEPS = ("torch", "numpy", "numba", "PyYAML")
TEST_DEPS = ("pytest", "hypothesis", "scipy")
TESTS = ("tests/operators", "tests/losses", "tests/test_functional.py")
FRAMEWORK = ("lightning", "pytorch_lightning", "hydra", "omegaconf", "wandb", "torchmetrics")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...]) -> dict[str, md.Distribution]:
    """The installed distributions that ``roots`` need, transitively (requirement markers evaluated for this
    interpreter, extras followed), keyed by normalised name.

    Raises:
        PackageNotFoundError: a required distribution is not installed.
    """
    env = default_environment()
    todo = [(_norm(r), frozenset()) for r in roots]
    seen: set[tuple[str, frozenset]] = set()
    found: dict[str, md.Distribution] = {}
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = found.get(name) or md.distribution(name)
        found[name] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
                todo.append((_norm(req.name), frozenset(req.extras)))
    return found


def link_site(dists: dict[str, md.Distribution], site: Path) -> int:
    """Symbolic links in ``site`` to every top-level entry (package, module, ``.libs``, ``.dist-info``) of
    ``dists`` inside their site-packages folder; returns how many."""
    site.mkdir(parents=True, exist_ok=True)
    n = 0
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in sorted(tops):
            src, dst = base / top, site / top
            if (src.exists() or src.is_symlink()) and not dst.exists():
                dst.symlink_to(src, target_is_directory=src.is_dir())
                n += 1
    return n


def build(where: Path) -> Path:
    """A virtual environment in ``where``/venv seeing only the closure of the library's and its tests'
    dependencies; returns its python."""
    dists = closure(LIBRARY_DEPS + TEST_DEPS)
    leaked = sorted(set(dists) & {_norm(f) for f in FRAMEWORK})
    if leaked:  # the closure itself would hide an upward import
        raise RuntimeError(f"the library's dependency closure holds framework packages: {leaked}")
    link_site(dists, where / "site")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(where / "venv")
    python = where / "venv" / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "diffrank_library_deps.pth").write_text(f"{where / 'site'}\n")
    print(f"library-only environment: {len(dists)} distributions ({', '.join(sorted(dists))})", flush=True)
    return python


def main(argv: list[str] | None = None) -> int:
    """Build the environment in a temporary folder, run pytest there (``argv`` or the library's tests, not slow
    and not gpu), print the build and run times, return pytest's exit status."""
    args = list(sys.argv[1:] if argv is None else argv) or [*TESTS, "-m", "not slow and not gpu", "-q"]
    with tempfile.TemporaryDirectory(prefix="diffrank-library-env-") as tmp:
        t0 = time.perf_counter()
        try:
            python = build(Path(tmp))
        except md.PackageNotFoundError as e:
            print(f"error: {e.name} is needed but not installed in {sys.executable}", file=sys.stderr)
            return 2
        t1 = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = str(ROOT / "src")
        rc = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env).returncode
        print(f"library-only environment: built in {t1 - t0:.1f} s, tests in {time.perf_counter() - t1:.1f} s",
              flush=True)
        return rc


if __name__ == "__main__":
    raise SystemExit(main())
