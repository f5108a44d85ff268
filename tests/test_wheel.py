"""The wheel works outside the checkout: configs ship inside it, the library layer needs none of the experiment
stack, and the experiment configs compose from the installed copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from helpers import CONFIGS, ROOT

HEAVY = ("lightning", "pytorch_lightning", "hydra", "omegaconf", "torchmetrics", "wandb", "timm", "datasets",
         "sklearn", "matplotlib")

LIBRARY = textwrap.dedent("""
    import sys, torch
    import diffrank, diffrank.functional as F, diffrank.losses.topk_cross_entropy, diffrank.losses.sorting
    import diffrank.losses.knn, diffrank.losses.smooth_topk, diffrank.losses.pk, diffrank.reference
    from diffrank.operators import LapSum, available, load
    from diffrank.registry import config_dir, list_options
    assert diffrank.__file__.startswith(sys.argv[1]), diffrank.__file__
    assert str(config_dir()).startswith(sys.argv[1]), config_dir()
    names = available()
    assert len(names) >= 11 and "sinkhorn" in names, names
    for name in names:
        op = load(name)
        x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
        caps = op.capabilities
        outs = []
        if "soft_sort" in caps:
            outs.append(F.soft_sort(x, method=op, dim=1))
        if "soft_rank" in caps:
            outs.append(F.soft_rank(x.T, method=op, dim=0, descending=True))
        if "topk_membership" in caps:
            outs.append(F.topk_membership(x, 2, method=op))
        if "permutation" in caps:
            outs.append(F.permutation_matrix(x, method=op, k=3))
        assert outs, name
        sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
        assert x.grad is not None and torch.isfinite(x.grad).all(), name
    assert isinstance(load("lapsum", beta=2.0), LapSum)
    assert "sorting/mnist" in list_options("experiment") and (config_dir() / "train.yaml").is_file()
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[2].split(",")))
    heavy += [m for m in sys.modules if m.startswith("diffrank.experiments")]
    assert not heavy, heavy
    print("library ok", len(names))
""")

EXPERIMENTS = textwrap.dedent("""
    import sys
    from hydra import compose, initialize_config_dir
    from diffrank.registry import config_dir
    from diffrank.experiments.run.train import main  # the diffrank-train entry point imports
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=sorting/thesis_t3_5/bitonic_lambda04_n32_b4"])
    assert cfg.data.n == 32 and cfg.operator._target_.endswith("ComparatorNetwork"), cfg.operator
    print("experiments ok")
""")


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory):
    """The wheel built (``pip wheel --no-deps --no-build-isolation``, a few seconds) from a copy of the checkout's
    tracked sources, so that no stale ``build/`` folder of the checkout leaks into it and none is left behind,
    unpacked: ``(site folder, the build's output)``."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "checkout"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("src", "devtools", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=600)
    (wheel,) = (tmp / "dist").glob("diffrank-*.whl")
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site, out.stdout + out.stderr


@pytest.fixture(scope="module")
def wheel_site(wheel_build):
    return wheel_build[0]


def _run(site, code: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DIFFRANK_CONFIG_DIR")}
    env["PYTHONPATH"] = str(site)  # before site-packages, so the editable checkout is not what imports
    out = subprocess.run([sys.executable, "-c", code, str(site), *args], cwd=site.parent, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_wheel_carries_configs_and_kernels(wheel_site):
    assert (wheel_site / "diffrank" / "configs" / "train.yaml").is_file()
    assert (wheel_site / "diffrank" / "configs" / "operator" / "lapsum.yaml").is_file()
    assert list((wheel_site / "diffrank" / "configs" / "experiment" / "sorting" / "thesis_t3_5").glob("*.yaml"))
    assert (wheel_site / "diffrank" / "kernels" / "lapsum.py").is_file()
    assert not (wheel_site / "devtools").exists()  # the compile checks are developer tooling, not the package
    assert (wheel_site / "diffrank" / "reference" / "sorting_thesis_table3_5.csv").is_file()


def test_wheel_carries_every_tracked_config(wheel_site):
    """Every yaml of configs/ (git's list where the checkout is a git one, else the files), and not the machine's
    own overrides (configs/local/, in .gitignore)."""
    try:
        listed = subprocess.run(["git", "ls-files", "configs"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = [p.relative_to(ROOT).as_posix() for p in CONFIGS.rglob("*.yaml")]
    tracked = {p.removeprefix("configs/") for p in listed if p.endswith(".yaml")}
    shipped = {p.relative_to(wheel_site / "diffrank" / "configs").as_posix()
               for p in (wheel_site / "diffrank" / "configs").rglob("*.yaml")}
    assert tracked and tracked <= shipped, sorted(tracked - shipped)[:10]
    assert not any(p.startswith("local/") for p in shipped)


def test_build_prints_no_setuptools_warning(wheel_build):
    """No "Package 'diffrank.configs.…' is absent from the `packages` configuration" per config folder, no
    ``project.license`` deprecation: the build backend's output holds no warning (pip's own
    ``WARNING:`` lines about the machine's index configuration are not the build's)."""
    _, log = wheel_build
    warnings = [line.strip() for line in log.splitlines()
                if "warning" in line.lower() and not line.startswith("WARNING: ")]
    assert not warnings, warnings[:5]


def test_config_packages_are_found_on_disk():
    """setup.py lists configs/ and each folder of it that holds yaml as a package (data only), found on disk: a
    new table folder needs no line anywhere, and the build never warns that it "is absent from the `packages`
    configuration"."""
    import runpy
    from unittest import mock

    with mock.patch("setuptools.setup"):
        found = set(runpy.run_path(str(ROOT / "setup.py"))["config_packages"]())
    folders = {".".join(("diffrank", *d.relative_to(ROOT).parts)) for d in [CONFIGS, *CONFIGS.rglob("*")]
               if d.is_dir() and d.name not in ("__pycache__", "local") and any(d.rglob("*.yaml"))}
    assert folders == found and "diffrank.configs.experiment.topk.icml2022_t1" in found


def test_library_from_the_wheel_without_the_experiment_stack(wheel_site):
    assert "library ok" in _run(wheel_site, LIBRARY, ",".join(HEAVY))


def test_experiment_configs_from_the_wheel(wheel_site):
    assert "experiments ok" in _run(wheel_site, EXPERIMENTS)
