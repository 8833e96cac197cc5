"""The build: pure Python, unless CRONOQ_MYPYC=1 asks for the compiled engine.

``CRONOQ_MYPYC=1 pip install .`` compiles the modules of cronoq.core with
mypyc (the in-tree backend, _build/backend.py, adds mypy to the build's
requirements then); without the variable the package is pure Python, as
every other install. The metadata lives in pyproject.toml.
"""

import os
from pathlib import Path

from setuptools import setup

# The package's __init__ stays Python: compiled, it crashes on import (its
# module __getattr__ loads the engine lazily), and it costs nothing at run time.
COMPILED = sorted(str(path) for path in Path("cronoq", "core").glob("*.py") if path.name != "__init__.py")


def ext_modules() -> list:
    if os.environ.get("CRONOQ_MYPYC") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise SystemExit("CRONOQ_MYPYC=1 needs mypy (with mypyc) in the build environment: "
                         "`pip install .` adds it itself; with --no-build-isolation, install it first") from exc
    # (pyproject's mypy settings name every package; this run checks only the engine)
    return mypycify(["--no-warn-unused-configs", *COMPILED], opt_level="3")


setup(ext_modules=ext_modules())
