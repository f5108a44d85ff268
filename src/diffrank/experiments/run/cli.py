"""The ``diffrank-train`` command (and the check ``python train.py`` makes first): without the ``experiments`` extra
it ends with the command that installs the extra, not with a bare ``No module named 'hydra'`` from inside the runner.

This module imports only the standard library, so that it loads where only the library is installed; the runner
(:mod:`diffrank.experiments.run.train`, which imports Lightning and Hydra at module level) is imported after the
check.
"""

from __future__ import annotations

import importlib.util

#: what a training run imports as it starts (import name → distribution of the ``experiments`` extra); checked
#: before the runner is imported
NEEDED = {"hydra": "hydra-core", "omegaconf": "omegaconf", "lightning": "lightning", "torchmetrics": "torchmetrics",
          "torchvision": "torchvision"}
#: the other modules of the extra: one missing while the runner imports gets the same message
EXTRA = {**NEEDED, "pytorch_lightning": "lightning", "wandb": "wandb", "sklearn": "scikit-learn",
         "matplotlib": "matplotlib", "rich": "rich", "scikit_posthocs": "scikit-posthocs"}
#: the commands that install the extra: from the package index, and in a checkout (editable)
INSTALL = 'pip install "diffrank[experiments]"'
INSTALL_CHECKOUT = 'pip install -e ".[experiments]"'


def missing_modules(modules: dict[str, str] = NEEDED) -> list[str]:
    """The names of ``modules`` that cannot be imported here (no module spec found; nothing is imported)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked installation counts as missing
            found = False
        if not found:
            missing.append(name)
    return missing


def install_message(command: str, missing: list[str]) -> str:
    """What ``command`` prints when the modules ``missing`` (import names of :data:`EXTRA`) are not installed: the
    distributions missing and the commands that install the ``experiments`` extra."""
    dists = ", ".join(sorted({EXTRA.get(m, m) for m in missing}))
    return (f"{command} needs the experiment framework (the `experiments` extra of diffrank), which is not\n"
            f"installed in this environment (missing: {dists}). Install it:\n"
            f"    {INSTALL}\n"
            f"or, in a checkout of diffrank:\n"
            f"    {INSTALL_CHECKOUT}      # or: make install (.venv with every extra)")


def require_experiments(command: str) -> None:
    """Return when the modules a training run needs (:data:`NEEDED`) are importable, else exit.

    Raises:
        SystemExit: (status 1, :func:`install_message` on stderr) one of them is missing.
    """
    missing = missing_modules()
    if missing:
        raise SystemExit(install_message(command, missing))


def main() -> None:
    """Console entry point ``diffrank-train`` (same as ``python train.py``): the instruction-set pins
    (:func:`diffrank.experiments.run.isa.pin_cpu_isa`), :func:`require_experiments`, then
    :func:`diffrank.experiments.run.train.main`.

    Raises:
        SystemExit: (status 1, the install commands on stderr) a module of the ``experiments`` extra is missing.
    """
    from diffrank.experiments.run.isa import pin_cpu_isa

    pin_cpu_isa()  # before the runner imports torch: the same bits on every x86-64 CPU
    require_experiments("diffrank-train")
    try:
        from diffrank.experiments.run.train import main as train_main
    except ModuleNotFoundError as err:  # a module of the extra that the check does not look for
        if (err.name or "").split(".")[0] not in EXTRA:
            raise
        raise SystemExit(install_message("diffrank-train", [err.name.split(".")[0]])) from err
    train_main()


if __name__ == "__main__":
    main()
