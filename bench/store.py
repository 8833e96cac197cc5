"""Durable submissions per second through a real ``cronoq.Scheduler`` with a store.

    python bench/store.py                    # SQLite and PostgreSQL, every scenario
    python bench/store.py --backend sqlite   # or postgres
    python bench/store.py --quick            # fewer tasks and runs
    python bench/store.py --profile batched --backend sqlite   # cProfile of one run

Scenarios (each acknowledged only once the submission is committed):

batched     one submitter, ``await enqueue_batch([...1,000 tasks])`` at a time
concurrent  100 submitters, each awaiting its own single ``enqueue`` in a loop
            (group commit: what is produced while a commit is in flight goes
            out together in the next transaction)
single      one submitter awaiting each single ``enqueue``

The pool has no capacity (``min=0, initial=0, autoscale=False``), so the
figures are for accepting work, not running it; ``--run`` gives the pool
eight slots and a no-op executor, so status changes are written as well.

SQLite runs on a file in a temporary directory with the store's defaults
(``full_sync=True``: every commit is synced to disk), and with
``full_sync=False`` as a second row. PostgreSQL is a throwaway server started
for the run (``tests/pgserver.py``: initdb + pg_ctl on a temporary directory
and a free port) with its default durability (fsync and synchronous_commit
on). Every figure is the median of several runs, each on a fresh file or
schema. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import cronoq  # noqa: E402

TARGETS = {("sqlite", "batched"): 50_000, ("postgres", "batched"): 30_000,
           ("sqlite", "single"): 5_000, ("sqlite", "concurrent"): 20_000}


async def _noop(ctx, payload):
    return None


def _pools(run: bool):
    if run:
        return [cronoq.Pool("default", _noop, min=8, max=8, autoscale=False)]
    return [cronoq.Pool("default", _noop, min=0, initial=0, autoscale=False)]


async def batched(sched, total: int) -> None:
    n = 0
    while n < total:
        await sched.enqueue_batch([cronoq.Task({"n": n + i}) for i in range(1000)])
        n += 1000


async def concurrent(sched, total: int, submitters: int = 100) -> None:
    each = total // submitters

    async def submitter(k: int) -> None:
        for i in range(each):
            await sched.enqueue({"n": i, "k": k})

    await asyncio.gather(*(submitter(k) for k in range(submitters)))


async def single(sched, total: int) -> None:
    for i in range(total):
        await sched.enqueue({"n": i})


SCENARIOS = {"batched": (batched, 50_000), "concurrent": (concurrent, 30_000), "single": (single, 5_000)}


async def one_run(make_store, scenario: str, total: int, run: bool, profile: cProfile.Profile | None):
    store = make_store()
    fn = SCENARIOS[scenario][0]
    try:
        sched = cronoq.Scheduler(_pools(run), store=store)
        await sched.start()
        try:
            await sched.enqueue({"warm": True})
            if profile is not None:
                profile.enable()
            start = time.perf_counter()
            await fn(sched, total)
            elapsed = time.perf_counter() - start
            if profile is not None:
                profile.disable()
            commits = sched._log.commits
        finally:
            await sched.shutdown(grace=0)
    finally:
        await store.close()
    return total / elapsed, commits


def measure(make_store, scenario: str, total: int, runs: int, run: bool) -> tuple[float, list[float], int]:
    rates = []
    commits = 0
    for _ in range(runs):
        rate, commits = asyncio.run(one_run(make_store, scenario, total, run, None))
        rates.append(rate)
    return statistics.median(rates), rates, commits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a fifth of the tasks, three runs")
    parser.add_argument("--run", action="store_true", help="let the pool run the tasks (8 slots, no-op)")
    parser.add_argument("--profile", choices=list(SCENARIOS), help="cProfile one run of this scenario")
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs
    scale = 0.2 if args.quick else 1.0
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]

    temp = tempfile.mkdtemp(prefix="cronoq-bench-")
    server = None
    counter = [0]

    def sqlite_store(full_sync: bool):
        def make():
            counter[0] += 1
            return cronoq.SqliteStore(os.path.join(temp, f"bench-{counter[0]}.db"), full_sync=full_sync)
        return make

    def postgres_store():
        counter[0] += 1
        return cronoq.PostgresStore(server.url, schema=f"bench_{counter[0]}")

    print(f"cronoq {cronoq.__version__}, Python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs; {'tasks run (8 slots)' if args.run else 'pool without capacity'}; "
          f"median of {runs} runs")
    try:
        makers = []
        for backend in backends:
            if backend == "sqlite":
                makers.append(("sqlite", "SQLite (full_sync=True)", sqlite_store(True)))
                makers.append(("sqlite", "SQLite (full_sync=False)", sqlite_store(False)))
            else:
                from pgserver import PgServer, unavailable_reason
                reason = unavailable_reason()
                if reason:
                    print(f"PostgreSQL skipped: {reason}")
                    continue
                server = PgServer(fsync=True).start()
                makers.append(("postgres", "PostgreSQL (fsync on)", postgres_store))
        if args.profile:
            backend, label, make = makers[0]
            profile = cProfile.Profile()
            total = int(SCENARIOS[args.profile][1] * scale)
            rate, _ = asyncio.run(one_run(make, args.profile, total, args.run, profile))
            print(f"{label} {args.profile}: {rate:,.0f}/s (under the profiler)")
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)
            return 0
        print(f"{'store':<26}{'scenario':<12}{'median/s':>10}{'target':>10}   "
              f"runs/s, commits in the last run")
        for backend, label, make in makers:
            for scenario in scenarios:
                total = int(SCENARIOS[scenario][1] * scale)
                median, rates, commits = measure(make, scenario, total, runs, args.run)
                target = TARGETS.get((backend, scenario))
                print(f"{label:<26}{scenario:<12}{median:>10,.0f}{(f'{target:,}' if target else '-'):>10}   "
                      f"{', '.join(f'{r:,.0f}' for r in rates)}; {commits} commits for {total:,} tasks",
                      flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(temp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
