"""Train with the top-k cross-entropy (or any experiment config): ``python train.py operator=sinkhorn pk=half_top5``."""

from diffrank.experiments.run.isa import pin_cpu_isa

pin_cpu_isa()  # before torch is imported: the same bits on every x86-64 CPU (diffrank.experiments.run.isa)

from diffrank.experiments.run.cli import require_experiments  # noqa: E402

require_experiments("python train.py")  # without the experiments extra: its install command, not No module named …

import hydra  # noqa: E402

from diffrank.experiments.run.resolvers import register_resolvers  # noqa: E402
from diffrank.experiments.run.stops import exit_after_stop  # noqa: E402
from diffrank.experiments.run.train import run  # noqa: E402

register_resolvers()  # ${beta_grid:…}, ${project_root:}, ${hydra_any:…} must exist before Hydra composes
exit_after_stop()  # a second kill / Ctrl-C while a run stops leaves the exit status that of the first


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg):
    """Hydra entry point; see configs/train.yaml and README.md."""
    return run(cfg)


if __name__ == "__main__":
    main()
