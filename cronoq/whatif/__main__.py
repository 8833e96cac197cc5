"""``python -m cronoq.whatif TRACE --config policies.toml``: see cronoq.whatif.cli."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
