"""Former name of :mod:`diffrank.operators.aot` (the ahead-of-time CPU kernels), kept as an alias.

Older docs, scripts and the Makefile of earlier checkouts run ``python -m diffrank.operators._aot --build`` or
import ``diffrank.operators._aot``: the command runs :func:`diffrank.operators.aot.main`, and an import gets the
module :mod:`diffrank.operators.aot` itself (the same object, so that its state is shared).
"""

import sys

from diffrank.operators import aot

if __name__ == "__main__":
    aot.main()
else:
    sys.modules[__name__] = aot
