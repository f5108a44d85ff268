"""Extract penultimate embeddings of a timm backbone into the cache format (ImageNet heads, docs/topk_imagenet.md).

A thin command line: the logic is :mod:`diffrank.experiments.tools.extract_embeddings`
(``python -m diffrank.experiments.tools.extract_embeddings``); exit status 2 when weights or input files are missing.
"""

import sys

from diffrank.experiments.tools.extract_embeddings import main

if __name__ == "__main__":
    sys.exit(main())
