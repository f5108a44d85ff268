"""Train with the top-k cross-entropy (or any experiment config): ``python train.py operator=sinkhorn pk=half_top5``."""

import hydra

from diffrank.experiments.run.resolvers import register_resolvers
from diffrank.experiments.run.train import run

register_resolvers()  # ${beta_grid:…} and ${short_hash:…} must exist before Hydra resolves a sweep


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg):
    """Hydra entry point; see configs/train.yaml and README.md."""
    return run(cfg)


if __name__ == "__main__":
    main()
