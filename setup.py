"""The build: pure Python, unless CRONOQ_MYPYC=1 asks for the compiled engine.

``CRONOQ_MYPYC=1 pip install .`` compiles the modules of cronoq.core and the
runtime's hot modules with mypyc (the in-tree backend, _build/backend.py, adds mypy to the build's
requirements then); without the variable the package is pure Python, as
every other install. The metadata lives in pyproject.toml.
"""

import os
import shutil
from pathlib import Path

from setuptools import setup

# The engine's modules, but for those that stay Python (none of them is on
# the hot path: the engine's actions are plain tuples):
# - the package's __init__: compiled, it crashes on import (its module
#   __getattr__ loads the engine lazily);
# - types: a TaskSpec keeps only the options it was given in its __dict__ and
#   reads the rest from class defaults (what keeps plain tasks small), and the
#   server and cronoq.whatif copy those dicts; a compiled class has no __dict__;
# - actions and snapshot: their objects compare, print and pickle by walking
#   their __slots__, which a compiled class does not keep;
# - errors: the exceptions inherit from two built-in bases (UnknownTask is a
#   LookupError too), which compiled classes cannot.
PURE = {"__init__.py", "types.py", "actions.py", "snapshot.py", "errors.py"}
COMPILED = sorted(str(path) for path in Path("cronoq", "core").glob("*.py") if path.name not in PURE)
# And the runtime's modules on the path of every task (the driver's pump, an
# async executor's worker and its context, the attempt, the handle and the
# results table): once the engine is compiled they are most of a task's cost.
# The rest of the runtime stays Python (it runs per call or per scheduler).
RUNTIME = ["context.py", "driver.py", "handle.py", "local.py", "results.py", "runner.py"]
COMPILED += [str(Path("cronoq", "runtime", name)) for name in RUNTIME]


COMPILE = os.environ.get("CRONOQ_MYPYC") == "1"
# Each variant builds in a directory of its own, emptied first: a wheel packs
# whatever the build directory holds, and the extension modules of an earlier
# compiled build would slip into a pure wheel (or stale ones into a compiled one).
BUILD_BASE = Path("build", "mypyc" if COMPILE else "pure")


def ext_modules() -> list:
    if not COMPILE:
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise SystemExit("CRONOQ_MYPYC=1 needs mypy (with mypyc) in the build environment: "
                         "`pip install .` adds it itself; with --no-build-isolation, install it first") from exc
    # (pyproject's mypy settings name every package; this run checks only the compiled modules)
    return mypycify(["--no-warn-unused-configs", *COMPILED], opt_level="3", target_dir=str(BUILD_BASE / "c"))


shutil.rmtree(BUILD_BASE, ignore_errors=True)
setup(ext_modules=ext_modules(), options={"build": {"build_base": str(BUILD_BASE)}})
