"""Training throughput of the MNIST sorting benchmark (sets/s): ``OMP_NUM_THREADS=1 python
scripts/sorting_throughput.py --data-dir DIR --batch 20 --steps 30 [--precision bf16-mixed] EXPERIMENT...``.

A thin command line for ``python -m diffrank.experiments.tools.throughput sorting``
(:mod:`diffrank.experiments.tools.throughput`).
"""

import sys

from diffrank.experiments.tools.throughput import main

if __name__ == "__main__":
    main(["sorting", *sys.argv[1:]])
