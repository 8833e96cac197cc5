"""``python -m cronoq demo``: see the scheduler at work."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cronoq", description="cronoq command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a mixed workload through the scheduler and report how it went",
                          description="Run a deterministic, virtual-time simulation of a mixed workload "
                                      "(interactive and batch priorities, deadlines, a rate-limited API, "
                                      "a fixed start, a DAG with a failure handler, a flaky task) through "
                                      "the engine, and print what each class experienced.")
    demo.add_argument("--seed", type=int, default=7, help="random seed of the workload (default 7)")
    demo.add_argument("--minutes", type=int, default=10, help="virtual minutes to simulate (default 10)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo_simulated import main as run_demo
        return run_demo(seed=args.seed, minutes=args.minutes)
    return 2


if __name__ == "__main__":
    sys.exit(main())
