"""Builds of cronoq to measure side by side: the pure-Python tree and the
compiled engine (mypyc, ``CRONOQ_MYPYC=1``; see setup.py).

A bench runs its measurements under each build in a subprocess whose
``PYTHONPATH`` starts with that build, interleaving the builds round by
round so that the machine's noise hits both alike::

    import builds
    builds.put_tree_on_path()               # instead of sys.path.insert(0, <repo>)
    ...
    table = builds.compare([builds.pure(), builds.compiled()],
                           [("cycles/s", "engine", "cycles_per_second", (200_000,))], rounds=5)
    builds.print_table(table)

``compiled()`` builds the variant once per state of the sources, with
``pip install --no-deps --target`` into ``build/bench-mypyc-<hash>/`` (about
two minutes on two cores), and reuses it while the sources of the engine and
of the runtime, setup.py and the build backend stay the same. The rest of the package runs from that
copy too, as it was at build time: after changing another module, pass
``rebuild=True`` (``--rebuild``). Each measurement is a function of a
bench module (bench/ is on the subprocess's path) that takes JSON arguments
and returns a number or a list of numbers; the subprocess checks
``cronoq.core.COMPILED`` against the build it was meant to run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
# Set in the subprocesses: the build under measurement is already first on the path.
BUILD_ENV = "CRONOQ_BENCH_BUILD"


class Build(NamedTuple):
    name: str          # "pure" or "compiled": the column's heading
    path: Path         # the directory that goes first on PYTHONPATH
    compiled: bool     # what cronoq.core.COMPILED must say under it


def put_tree_on_path() -> None:
    """Run a bench script against this tree, unless a build under comparison
    already comes first on the path (the subprocesses of ``compare``)."""
    if BUILD_ENV not in os.environ:
        sys.path.insert(0, str(REPO))


def pure() -> Build:
    return Build("pure", REPO, False)


def tree(path: Path, name: str) -> Build:
    """Another pure-Python tree (a checkout of another commit, say), to
    compare with this one."""
    return Build(name, path.resolve(), False)


def _sources_key() -> str:
    """What the compiled build is made of: the engine's sources, the
    runtime's (setup.py compiles its hot modules; all of them here, so that
    the key need not repeat setup.py's list), the build scripts and the
    interpreter."""
    digest = hashlib.sha256(platform.python_version().encode())
    paths = sorted((REPO / "cronoq" / "core").glob("*.py")) + sorted((REPO / "cronoq" / "runtime").glob("*.py")) \
        + [REPO / "cronoq" / "_mypyc.py", REPO / "setup.py", REPO / "_build" / "backend.py"]
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def compiled(target: Path | None = None, rebuild: bool = False) -> Build:
    """The compiled variant of this tree, built if it is missing or stale.

    Prints how long the build took. The whole package is installed into the
    target (pure modules, the compiled engine's extension modules and their
    shared library), so that nothing of the source tree is on the path.
    """
    target = target or REPO / "build" / f"bench-mypyc-{_sources_key()}"
    done = target / ".built"
    if done.exists() and not rebuild:
        return Build("compiled", target, True)
    print(f"building the compiled engine into {target.relative_to(REPO) if target.is_relative_to(REPO) else target}"
          f" (CRONOQ_MYPYC=1 pip install --no-deps --target ...)", file=sys.stderr, flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                    str(target), str(REPO)], check=True, env={**os.environ, "CRONOQ_MYPYC": "1"})
    print(f"built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    done.touch()
    return Build("compiled", target, True)


_RUNNER = """
import json, sys
import cronoq.core
build, expected, module, function, args = json.loads(sys.argv[1])
compiled = getattr(cronoq.core, "COMPILED", False)   # (older trees have no COMPILED: pure)
if compiled is not expected:
    raise SystemExit(f"{build}: cronoq.core.COMPILED is {compiled}, from {cronoq.core.__file__}")
result = getattr(__import__(module), function)(*args)
print(json.dumps(result))
"""


def run(build: Build, module: str, function: str, args: Sequence[Any] = ()) -> Any:
    """``module.function(*args)`` in a fresh interpreter under ``build``."""
    env = {**os.environ, BUILD_ENV: build.name,
           "PYTHONPATH": os.pathsep.join([str(build.path), str(BENCH), os.environ.get("PYTHONPATH", "")])}
    # -P: the current directory does not come before the build on the path.
    out = subprocess.run([sys.executable, "-P", "-c", _RUNNER,
                          json.dumps([build.name, build.compiled, module, function, list(args)])],
                         env=env, check=True, stdout=subprocess.PIPE, text=True, cwd=BENCH).stdout
    return json.loads(out.splitlines()[-1])


Measure = tuple[str, str, str, Sequence[Any]]   # (label, module, function, args)


def compare(builds: Sequence[Build], measures: Sequence[Measure], rounds: int,
            progress: bool = True) -> dict[str, dict[str, list[float]]]:
    """Every measure under every build, ``rounds`` times, interleaved: per
    round, each measure runs under each build in turn (the order of the
    builds alternates between rounds). A function that returns a list gives
    one row per element, labelled ``label[i]`` unless the label is a list.

    Returns {row label: {build name: [value per round]}}.
    """
    table: dict[str, dict[str, list[float]]] = {}
    for r in range(rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        for label, module, function, args in measures:
            for build in order:
                value = run(build, module, function, args)
                values = value if isinstance(value, list) else [value]
                labels = label if isinstance(label, (list, tuple)) else \
                    [label] if len(values) == 1 else [f"{label}[{i}]" for i in range(len(values))]
                for row, v in zip(labels, values):
                    table.setdefault(row, {}).setdefault(build.name, []).append(v)
        if progress:
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return table


def commit(path: Path = REPO) -> str:
    try:
        out = subprocess.run(["git", "-C", str(path), "describe", "--always", "--dirty"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.strip()


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _cell(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def print_table(table: dict[str, dict[str, list[float]]], builds: Sequence[Build],
                formats: dict[str, str] | None = None, lower_is_better: Sequence[str] = ()) -> None:
    """One row per measure: each build's median (min-max), then the ratio of
    each later build's median to the first build's (inverted for the rows in
    ``lower_is_better``, so that > 1 always means faster than the first)."""
    formats = formats or {}
    first = builds[0].name
    rows = []
    for label, by_build in table.items():
        fmt = formats.get(label, ",.0f")
        cells = [_cell(by_build[b.name], fmt) for b in builds]
        base = statistics.median(by_build[first])
        ratios = []
        for b in builds[1:]:
            other = statistics.median(by_build[b.name])
            ratio = (base / other if label in lower_is_better else other / base) if base and other else float("nan")
            ratios.append(f"{ratio:.2f}x")
        rows.append((label, *cells, *ratios))
    heads = ("", *(f"{b.name}: median (min-max)" for b in builds), *(f"{b.name} / {first}" for b in builds[1:]))
    widths = [max(len(str(r[i])) for r in [heads, *rows]) for i in range(len(heads))]
    for row in [heads, *rows]:
        print("  " + "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
