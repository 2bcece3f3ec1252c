"""``python -m lab.bench``: see :mod:`lab.bench.cli`."""

import sys

from lab.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
