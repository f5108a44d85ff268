"""Print the experiment configs matching glob patterns, comma-joined (the value of a Hydra multirun).

A thin command line: the logic is :mod:`diffrank.experiments.rows.list_experiments`
(``python -m diffrank.experiments.rows.list_experiments``).
"""

from diffrank.experiments.rows.list_experiments import main

if __name__ == "__main__":
    main()
