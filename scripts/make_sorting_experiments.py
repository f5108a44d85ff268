"""Write the sorting benchmark's table rows (``configs/experiment/sorting/<table>/<row>.yaml``).

A thin command line: the generator is :mod:`diffrank.experiments.generate_sorting`
(``python -m diffrank.experiments.generate_sorting``).
"""

from diffrank.experiments.generate_sorting import main

if __name__ == "__main__":
    main()
