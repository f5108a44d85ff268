"""Write the sorting benchmark's table rows (``configs/experiment/sorting/<table>/<row>.yaml``).

A thin command line: the generator is :mod:`diffrank.experiments.rows.sorting`
(``python -m diffrank.experiments.rows.sorting``).
"""

from diffrank.experiments.rows.sorting import main

if __name__ == "__main__":
    main()
