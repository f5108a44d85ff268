"""Training throughput of the CIFAR-100 top-k protocol (images/s) or the ImageNet heads (``--head``, embeddings/s).

A thin command line for ``python -m diffrank.experiments.tools.throughput topk``
(:mod:`diffrank.experiments.tools.throughput`).
"""

import sys

from diffrank.experiments.tools.throughput import main

if __name__ == "__main__":
    main(["topk", *sys.argv[1:]])
