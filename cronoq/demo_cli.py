"""``cronoq demo`` (and ``python -m cronoq demo``): see the scheduler at work.

``add_parser`` and ``run`` follow the protocol of ``cronoq`` subcommands
(docs/cli.md, cronoq/cli/plugins.py); ``main`` is the ``cronoq-demo``
program, the demo's options alone.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to an argparse ``add_subparsers()`` object."""
    demo: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="run a mixed workload through the scheduler and report how it went",
        description="Run a realistic mixed workload through a live scheduler: interactive clicks "
                    "(high priority, deadlines), reports, background re-indexing (low), chat turns "
                    "through a rate-limited API (token bucket), a fixed-start job, a small DAG whose "
                    "load step fails and triggers its failure handler, a flaky task that retries, and a "
                    "checkpointed ingest whose retry resumes where it stopped. The live view tells what "
                    "happens as it happens (in a pipe, each moment is one line); the run ends by itself "
                    "with a report that explains its terms: the pools (desired workers, priority "
                    "adherence, fixed starts on time, busy share, cost), waits by class, totals, and "
                    "where to go next.")
    demo.add_argument("--seconds", type=float, default=20.0,
                      help="how long to submit work (default 20; the run ends a few seconds later)")
    demo.add_argument("--seed", type=int, default=7, help="random seed of the workload (default 7)")
    demo.add_argument("--speed", type=float, default=1.0,
                      help="multiply every task's run time by this factor (default 1.0)")
    demo.add_argument("--no-live", action="store_true", help="print only the final report")
    demo.add_argument("--store", metavar="PATH",
                      help="keep the scheduler's state in this SQLite file (kept afterwards; a second "
                           "run recovers from it); by default a file in a temporary directory, removed "
                           "at the end")
    demo.add_argument("--record", metavar="TRACE",
                      help="write a trace of the run to this file, to replay it against other policies "
                           "(python -m cronoq.whatif TRACE --config policies.toml)")
    demo.add_argument("--simulate", action="store_true",
                      help="instead, simulate ten minutes of a similar workload in virtual time "
                           "(deterministic, about a second of real time)")
    demo.set_defaults(demo_parser=demo)
    return demo


def run(args: argparse.Namespace) -> int:
    """Run the demo with the parsed arguments of ``add_parser``'s subcommand."""
    if args.simulate:
        from .demo_simulated import main as simulate
        return simulate(seed=args.seed)
    if not args.seconds > 0 or not args.speed > 0:
        args.demo_parser.error("--seconds and --speed must be positive")
    if args.store is not None:
        directory = os.path.dirname(os.path.abspath(args.store))
        if not os.path.isdir(directory):
            args.demo_parser.error(f"--store {args.store}: the directory {directory} does not exist")
        if os.path.isdir(args.store):
            args.demo_parser.error(f"--store {args.store}: a directory, not a SQLite file")
    from .demo import run_demo
    return run_demo(seconds=args.seconds, seed=args.seed, speed=args.speed, live=not args.no_live,
                    store_path=args.store, record=args.record)


def main(argv: list[str] | None = None) -> int:
    """``cronoq-demo [OPTIONS]``: the demo's options without the subcommand."""
    parser = argparse.ArgumentParser(prog="cronoq-demo")
    sub = parser.add_subparsers(dest="command")
    demo = add_parser(sub)
    demo.prog = "cronoq-demo"
    return run(demo.parse_args(argv))
