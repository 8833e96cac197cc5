"""``python -m cronoq.mcp``: the same as ``cronoq-mcp``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
