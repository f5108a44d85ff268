"""Write the top-k rows of Petersen et al. (ICML 2022) Tables 1-6 (``configs/experiment/topk/icml2022_t<N>/``).

A thin command line: the generator is :mod:`diffrank.experiments.rows.topk`
(``python -m diffrank.experiments.rows.topk``).
"""

from diffrank.experiments.rows.topk import main

if __name__ == "__main__":
    main()
