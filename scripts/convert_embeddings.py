"""Convert the paper's released embedding pickles (or a cache of ours) into the cache format (docs/topk_imagenet.md).

A thin command line: the logic is :mod:`diffrank.experiments.tools.convert_embeddings`
(``python -m diffrank.experiments.tools.convert_embeddings``); exit status 2 when the input is missing or refused.
"""

import sys

from diffrank.experiments.tools.convert_embeddings import main

if __name__ == "__main__":
    sys.exit(main())
