"""Numba kernels compiled ahead of time (numba's ``pycc``) into plain extension modules, shared by the CPU kernel
files (:mod:`diffrank.operators.fast_soft_sort_cpu`, :mod:`diffrank.operators.lapsum_cpu`).

A fresh process that finds the module imports it without numba: its first call costs milliseconds, where numba's
cached JIT still spends about a second in ``import numba`` and in loading its typing registries and cache
(measured: fast soft sort 0.05 s vs 1.9 s; LapSum's top-k, see ``lapsum_cpu``). Each kernel file declares its
kernels as plain Python functions and a :class:`Kernels` over them:

- the module lives in ``$DIFFRANK_CACHE_DIR/aot`` (default ``~/.cache/diffrank/aot``), named by the kernel file's
  hash and the Python / numpy / platform versions its binary depends on (an edit or an upgrade builds anew);
- ``python -m diffrank.operators.aot --build`` builds every kernel file's module (seconds each, once per machine
  and kernel version; it needs a C compiler), and the install step of the Makefile runs it;
- ``$DIFFRANK_<FILE>_AOT``: ``build`` builds on first use when the module is missing, ``0`` ignores it;
- otherwise **numba's JIT** with ``cache=True`` serves (numba itself falls back to its user-wide cache directory
  when the package folder is read-only; ``NUMBA_CACHE_DIR`` overrides it).

``pycc``'s wrappers check only the arrays' item sizes, not their dtypes nor their layout: callers pass C-contiguous
arrays of the signature's dtypes (one exported entry per dtype).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np

#: the kernel files that ``python -m diffrank.operators.aot --build`` builds (each defines ``KERNELS``)
KERNEL_MODULES = ("diffrank.operators.fast_soft_sort_cpu", "diffrank.operators.lapsum_cpu")


def cache_dir() -> Path:
    """Where the ahead-of-time modules live: ``$DIFFRANK_CACHE_DIR/aot`` (default ``~/.cache/diffrank/aot``)."""
    root = os.environ.get("DIFFRANK_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "diffrank")
    return Path(root) / "aot"


class Kernels:
    """The compiled kernels of one kernel file: ahead of time when its module is built, else numba's JIT.

    Args:
        prefix: the module's name prefix (``"_diffrank_fss"``).
        source: the kernel file (its bytes key the module's name).
        namespace: the file's globals, where the kernels are plain Python functions; the JIT replaces each by its
            numba dispatcher there, so that kernels calling each other by name call compiled code.
        exports: entry point name → {suffix: pycc signature}; each is exported as ``<name>_<suffix>``.
        helpers: names of the kernels that only the entry points call (compiled into them, not exported).
        env: the environment variable of the switch (``"DIFFRANK_FSS_AOT"``: ``build`` / ``0``).
    """

    def __init__(self, prefix: str, source: str, namespace: dict, exports: dict[str, dict[str, str]],
                 helpers: tuple[str, ...], env: str):
        self.prefix, self.source, self.namespace = prefix, Path(source), namespace
        self.exports, self.helpers, self.env = exports, helpers, env
        self._table: dict[tuple[str, str], object] | None = None

    def path(self) -> Path:
        """The module's file: :func:`cache_dir` / prefix + hash of the source and versions + extension suffix."""
        key = b"|".join([self.source.read_bytes(), sys.version.encode(), np.__version__.encode(),
                         sysconfig.get_platform().encode()])
        name = f"{self.prefix}_{hashlib.sha256(key).hexdigest()[:16]}"
        return cache_dir() / (name + importlib.machinery.EXTENSION_SUFFIXES[0])

    def _jit(self) -> None:
        """Replace the kernels in the namespace by their numba dispatchers (``cache=True``), once."""
        import numba

        for name in (*self.helpers, *self.exports):
            fn = self.namespace[name]
            if not hasattr(fn, "py_func"):  # not yet a dispatcher
                self.namespace[name] = numba.njit(cache=True, nogil=True)(fn)

    def dispatcher(self, name: str):
        """numba's JIT dispatcher of the kernel ``name``, a helper included (which the module does not export):
        for tests of a helper in compiled code."""
        self._jit()
        return self.namespace[name]

    def build(self) -> Path:
        """Compile the entry points (with the helpers they call) ahead of time into :func:`cache_dir`; returns the
        module's path.

        Takes seconds (numba's ``pycc``, then the C compiler); the module is written under a temporary name and
        moved into place, so that a process loading it meanwhile never sees half a file.

        Raises:
            Whatever ``numba.pycc`` raises when it cannot compile (e.g. no C compiler).
        """
        import shutil
        import tempfile
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pycc's pending-deprecation notice
            from numba.pycc import CC

            self._jit()  # the helpers, called by name from the entry points, must be dispatchers
            target = self.path()
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=target.parent))
            try:
                cc = CC(target.name.split(".")[0])
                cc.output_dir = str(tmp)
                for name, sigs in self.exports.items():
                    for suffix, sig in sigs.items():
                        cc.export(f"{name}_{suffix}", sig)(self.namespace[name].py_func)
                cc.compile()
                os.replace(tmp / target.name, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return target

    def _load(self):
        """The ahead-of-time module, or None (not built, disabled by ``$env=0``, or unloadable); ``$env=build``
        builds it first when it is missing."""
        mode = os.environ.get(self.env, "auto")
        if mode == "0":
            return None
        path = self.path()
        if not path.exists() and mode == "build":
            self.build()
        if not path.exists():
            return None
        spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
        try:
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except ImportError:  # e.g. built against another numpy ABI under the same name: the JIT serves
            return None
        return mod

    def __call__(self, name: str, suffix: str):
        """The kernel ``name`` for the signature ``suffix``: the module's ``<name>_<suffix>`` when it loads, else
        numba's dispatcher (one for every suffix); resolved once per process."""
        if self._table is None:
            mod = self._load()
            if mod is not None:
                self._table = {(n, s): _c_contiguous_only(getattr(mod, f"{n}_{s}"), f"{n}_{s}")
                               for n, sigs in self.exports.items() for s in sigs}
            else:
                self._jit()
                self._table = {(n, s): self.namespace[n] for n, sigs in self.exports.items() for s in sigs}
        return self._table[name, suffix]


def _c_contiguous_only(kernel, name: str):
    """``kernel`` (an ahead-of-time entry point) refusing arrays that are not C-contiguous: pycc's wrappers check only
    item sizes and would read a Fortran-ordered or strided array as garbage, where numba's JIT dispatches on layout.

    Raises:
        ValueError: (when called) an array argument that is not C-contiguous, naming the kernel and the argument.
    """
    def call(*args):
        """The kernel on ``args`` after checking every numpy array is C-contiguous (raises ``ValueError``)."""
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
                raise ValueError(f"{name}: argument {i} is not C-contiguous (strides {a.strides}); the ahead-of-time "
                                 "kernels read every array as C-contiguous")
        return kernel(*args)

    return call


def main(argv: list[str] | None = None, modules: tuple[str, ...] = KERNEL_MODULES) -> None:
    """``python -m diffrank.operators.aot [--build]``: build (or list) the modules of the kernel files ``modules``
    (each defines a :class:`Kernels` ``KERNELS``); a file that fails to build is reported and the others still
    build (exit status 1 then)."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser(description="Compile the CPU kernels ahead of time (numba pycc).")
    parser.add_argument("--build", action="store_true", help="build the modules into the cache directory")
    args = parser.parse_args(argv)
    failed = False
    for modname in modules:
        kernels = importlib.import_module(modname).KERNELS
        if not args.build:
            print(f"{kernels.path()} ({'present' if kernels.path().exists() else 'not built'})")
            continue
        try:
            print(kernels.build())
        except Exception as err:  # noqa: BLE001 - report and go on: the JIT serves this file
            print(f"{modname}: ahead-of-time build failed ({type(err).__name__}: {err}); numba's JIT serves it",
                  file=sys.stderr)
            failed = True
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
