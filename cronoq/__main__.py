"""``python -m cronoq demo``: see the scheduler at work."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cronoq", description="cronoq command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run a mixed workload through the scheduler and report how it went",
        description="Run a realistic mixed workload through a live scheduler: interactive clicks "
                    "(high priority, deadlines), reports, background re-indexing (low), chat turns "
                    "through a rate-limited API (token bucket), a fixed-start job, a small DAG whose "
                    "load step fails and triggers its failure handler, and a flaky task that retries. "
                    "A live view shows the pools; the run ends by itself with a per-pool table "
                    "(waits, adherence, fixed-start hit rate, utilization, cost) and waits by class.")
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
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.simulate:
            from .demo_simulated import main as simulate
            return simulate(seed=args.seed)
        if not args.seconds > 0 or not args.speed > 0:
            parser.error("--seconds and --speed must be positive")
        from .demo import run_demo
        return run_demo(seconds=args.seconds, seed=args.seed, speed=args.speed, live=not args.no_live,
                        store_path=args.store, record=args.record)
    return 2


if __name__ == "__main__":
    sys.exit(main())
