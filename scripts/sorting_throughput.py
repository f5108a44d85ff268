"""Training throughput of the MNIST sorting benchmark (sets/s): ``OMP_NUM_THREADS=1 python
scripts/sorting_throughput.py --data-dir DIR --batch 20 --steps 30 [--precision bf16-mixed] EXPERIMENT...``.

A thin command line for ``python -m diffrank.experiments.throughput sorting`` (:mod:`diffrank.experiments.throughput`).
"""

import sys

from diffrank.experiments.throughput import main

if __name__ == "__main__":
    main(["sorting", *sys.argv[1:]])
