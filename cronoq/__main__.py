"""``python -m cronoq``: the ``cronoq`` command line (docs/cli.md) under
another name, so that ``python -m cronoq demo`` works before the scripts are
on PATH."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m cronoq"))
