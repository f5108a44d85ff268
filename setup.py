"""The wheel's package list, found on disk (everything else is in pyproject.toml).

configs/ installs as ``diffrank.configs`` (``package-dir`` in pyproject.toml) and each of its folders as a
data-only package of its own: a folder holding package data that is not listed as a package makes setuptools warn
("Package 'diffrank.configs.…' is absent from the `packages` configuration"), and a list written by hand would need a
new line for every new table folder. configs/local/ (one machine's untracked overrides) is not shipped.
"""

from pathlib import Path

from setuptools import find_packages, setup

CONFIGS = Path(__file__).resolve().parent / "configs"


def config_packages() -> list[str]:
    """``diffrank.configs`` and ``diffrank.configs.<a>.<b>`` for every folder of configs/ that holds yaml."""
    folders = [CONFIGS, *sorted(p for p in CONFIGS.rglob("*") if p.is_dir())]
    return [".".join(("diffrank", "configs", *d.relative_to(CONFIGS).parts)) for d in folders
            if d.name not in ("__pycache__", "local") and any(d.rglob("*.yaml"))]


setup(packages=find_packages("src") + config_packages())
