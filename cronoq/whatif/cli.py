"""``cronoq simulate TRACE --config policies.toml`` (and ``python -m cronoq.whatif``).

``add_parser(subparsers)`` adds the ``simulate`` subcommand to a command
line's subparsers; ``run(args)`` carries it out and returns the exit code
(0, or 2 for input it cannot use, with the reason on stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from .policy import DURATION_MODES, PolicyError, load_policy_file
from .replay import ReplayError
from .trace import Trace, TraceError

__all__ = ["add_parser", "configure", "run", "main"]

DESCRIPTION = (
    "Replay a recorded workload (a trace: JSON lines written by cronoq.whatif.TraceRecorder, built "
    "from a store, or by hand) through the cronoq engine under virtual time, once per policy variant "
    "of the policy file, and report per variant the waits per class (p50/p90/p99), deadline misses, "
    "fixed-start hit rate, priority adherence, utilization, worker-seconds and cost, and what was "
    "shed, refused or never finished. See docs/whatif.md.")


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of the command to ``parser``."""
    parser.add_argument("trace", metavar="TRACE",
                        help="the trace file (JSON lines); with --store, a store to build it from: a "
                             "SQLite file or a sqlite:/// or postgresql:// URL")
    parser.add_argument("--config", "-c", metavar="POLICIES.toml",
                        help="the policy file: its [[variant]] tables are the policies to compare "
                             "(default: the recorded policy alone)")
    parser.add_argument("--store", action="store_true",
                        help="TRACE is a durable store: replay the history of its tasks")
    parser.add_argument("--schema", help="with --store and PostgreSQL: the schema of cronoq's tables")
    parser.add_argument("--durations", choices=DURATION_MODES,
                        help="attempts run as the trace recorded them (trace) or drawn, with the seed, "
                             "from the runs recorded for the same kind (sampled); default: the policy "
                             "file's [replay] durations, else trace")
    parser.add_argument("--seed", type=int, help="seed of the replays (retry jitter, sampled durations)")
    parser.add_argument("--start-delay", type=float, metavar="SECONDS",
                        help="time from each dispatch to its attempt's start, holding the slot (a durable "
                             "store's commit, the event loop: what the engine alone does not take); "
                             "default: the policy file's [replay] start_delay, else 0")
    parser.add_argument("--variant", action="append", metavar="NAME",
                        help="replay only this variant (repeat for several)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    parser.add_argument("--html", metavar="PATH",
                        help="write an HTML report to PATH, its plots (PNG) beside it (needs matplotlib: "
                             "pip install 'cronoq[whatif]')")
    parser.add_argument("--save-trace", metavar="PATH",
                        help="also write the trace (as read or built) to PATH")
    parser.add_argument("--quiet", "-q", action="store_true", help="print no table")
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``simulate`` to ``subparsers`` (what ``add_subparsers()`` returned)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help="replay a recorded workload against other scheduling policies",
        description=DESCRIPTION)
    configure(parser)
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Carry out ``simulate`` with parsed ``args``; returns the exit code."""
    from . import simulate
    from .store import trace_from_store

    try:
        if args.store:
            trace = trace_from_store(args.trace, schema=args.schema)
        else:
            if args.schema:
                raise PolicyError("--schema goes with --store")
            trace = Trace.load(args.trace)
        if args.save_trace:
            trace.save(args.save_trace)
        policies = load_policy_file(args.config) if args.config else None
        report = simulate(trace, policies, durations=args.durations, seed=args.seed,
                          start_delay=args.start_delay, only=args.variant)
    except (TraceError, PolicyError, ReplayError, ValueError, OSError) as exc:
        print(f"cronoq simulate: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        from rich.console import Console

        report.print(Console(width=max(130, Console().width)))
    try:
        if args.json:
            if args.json == "-":
                report.to_json(sys.stdout)
            else:
                with open(args.json, "w", encoding="utf-8") as f:
                    report.to_json(f)
        if args.html:
            from .html import write_html

            written = write_html(report, args.html)
            if not args.quiet:
                print(f"wrote {written[0]} and {len(written) - 1} plots beside it", file=sys.stderr)
    except (ImportError, OSError) as exc:
        print(f"cronoq simulate: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = configure(argparse.ArgumentParser(prog="python -m cronoq.whatif", description=DESCRIPTION))
    return run(parser.parse_args(argv))
