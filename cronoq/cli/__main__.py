"""``python -m cronoq.cli``: the same as the ``cronoq`` command."""

import sys

from . import main

sys.exit(main())
