"""Run benchmarks of two source trees alternately, in one run, and compare.

    git worktree add --detach /tmp/before <commit>
    python bench/before_after.py --before /tmp/before [--rounds 5]
        [--bench "runtime.py --tasks 50000" --bench "engine.py --quick" ...]

Each round runs every benchmark once from the other tree and once from this
one, in alternating order, so that the machine's noise falls on both alike.
A benchmark script imports cronoq from its own tree (each puts its tree
first on sys.path). A line is matched across runs by its text with the
numbers blanked; the numbers that never change are parameters (put back in
the label), the first that does is the line's figure. The table gives each
figure's median, min and max on both sides and the ratio of the medians
(this tree / the other), with the commits and the load averages before and
after.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import builds  # bench/builds.py: the commit of a tree

HERE = Path(__file__).resolve().parent.parent
DEFAULT_BENCHES = ("runtime.py", "threads.py --skip-latency", "engine.py --quick")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def figures(output: str) -> dict[str, list[float]]:
    """label -> the numbers of every line that holds one (repeated labels numbered)."""
    found: dict[str, list[float]] = {}
    for line in output.splitlines():
        numbers = [float(n.replace(",", "")) for n in NUMBER.findall(line)]
        if not numbers:
            continue
        label = re.sub(r"\s+", " ", NUMBER.sub("#", line)).strip()
        while label in found:
            label += " (again)"
        found[label] = numbers
    return found


def figure(label: str, runs: list[list[float]]) -> tuple[str, int] | None:
    """The label with the numbers that never change (parameters) put back, and
    the place of the first number that does (the measurement), or None."""
    if len({len(numbers) for numbers in runs}) != 1:
        return None
    varying = [i for i in range(len(runs[0])) if len({numbers[i] for numbers in runs}) > 1]
    if not varying:
        return None
    parts = label.split("#")
    text = parts[0]
    for i, part in enumerate(parts[1:]):
        text += ("<>" if i == varying[0] else "*" if i in varying else shown(runs[0][i])) + part
    return text, varying[0]


def run(tree: Path, bench: str, workdir: str) -> dict[str, list[float]]:
    script, *args = bench.split()
    done = subprocess.run([sys.executable, str(tree / "bench" / script), *args], cwd=workdir,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree / 'bench' / script} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return figures(done.stdout)


def shown(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def spread(values: list[float]) -> str:
    return f"{shown(statistics.median(values))} ({shown(min(values))}-{shown(max(values))})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, type=Path, help="the other source tree (a git worktree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bench", action="append", help="a script of bench/ and its arguments (repeatable)")
    args = parser.parse_args()
    benches = args.bench or list(DEFAULT_BENCHES)
    trees = {"before": args.before.resolve(), "after": HERE}
    for side, tree in trees.items():
        if not (tree / "cronoq" / "__init__.py").exists():
            parser.error(f"--{side} {tree}: not a cronoq source tree")
    results: dict[tuple[str, str], dict[str, list[list[float]]]] = {}
    print(f"before: {trees['before']} at {builds.commit(trees['before'])}")
    print(f"after:  {trees['after']} at {builds.commit(trees['after'])}")
    print(f"load average at the start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-") as workdir:
        for round_ in range(args.rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for bench in benches:
                for side in order:
                    for label, value in run(trees[side], bench, workdir).items():
                        results.setdefault((bench, label), {"before": [], "after": []})[side].append(value)
            print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr)
    print(f"load average at the end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(f"{args.rounds} rounds; median (min-max) on each side of the figure shown as <>; * marks other figures "
          f"of the line; ratio = after / before of the medians\n")
    current = None
    for (bench, label), sides in results.items():
        if len(sides["before"]) != len(sides["after"]) or not sides["before"]:
            continue   # a line only one side prints
        shown = figure(label, sides["before"] + sides["after"])
        if shown is None:
            continue   # a heading: nothing on it was measured
        text, at = shown
        before = [numbers[at] for numbers in sides["before"]]
        after = [numbers[at] for numbers in sides["after"]]
        if bench != current:
            print(f"== {bench}")
            current = bench
        ratio = statistics.median(after) / statistics.median(before) if statistics.median(before) else float("nan")
        print(f"  {text}\n      before {spread(before)}   after {spread(after)}   ratio {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
