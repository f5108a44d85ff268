"""Write a Warcraft-like shortest-path set: ``python scripts/make_warcraft_like.py --out DATA_DIR [--grid 12]``.

A thin command line: the generator is :mod:`diffrank.experiments.data.warcraft_like`
(``python -m diffrank.experiments.data.warcraft_like``).
"""

from diffrank.experiments.data.warcraft_like import main

if __name__ == "__main__":
    main()
