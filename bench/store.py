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

recovery    a backlog of pending tasks (1,000,000; ``--quick``: 200,000) in a
            SQLite file: how fast a new leader recovers it (tasks/s, from
            ``start()`` called to returned) and the process's memory after
            recovery, next to the same backlog submitted to a scheduler without
            a store (the in-memory floor). Each side runs in its own child
            process, so the resident sizes (RSS, and the peak) compare alike.

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
RECOVERY_TARGET = 100_000      # tasks recovered per second
RECOVERY_MEMORY_TARGET = 1.5   # memory after recovery / the same backlog submitted in memory


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
            commits = sched._driver.log.commits
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


# ---------------------------------------------------------------- recovery


def _rss_mib() -> float:
    """The resident size of this process now (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def _peak_mib() -> float:
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux
    return peak / 1024


async def _fill(path: str, total: int) -> None:
    """A backlog of ``total`` pending tasks in a SQLite file."""
    store = cronoq.SqliteStore(path, full_sync=False)
    sched = cronoq.Scheduler(_pools(False), store=store)
    await sched.start()
    try:
        await batched(sched, total)
    finally:
        await sched.shutdown(grace=0)
        await store.close()


async def _child_recover(path: str) -> dict:
    import gc
    gc.collect()
    base = _rss_mib()
    store = cronoq.SqliteStore(path, full_sync=False)
    sched = cronoq.Scheduler(_pools(False), store=store)
    start = time.perf_counter()
    await sched.start()
    elapsed = time.perf_counter() - start
    pending = len(sched._driver.core.tasks)
    gc.collect()
    rss = _rss_mib()
    await sched.shutdown(grace=0)
    await store.close()
    return {"seconds": elapsed, "tasks": pending, "rss": rss - base, "peak": _peak_mib() - base}


async def _child_memory(total: int) -> dict:
    import gc
    gc.collect()
    base = _rss_mib()
    sched = cronoq.Scheduler(_pools(False))
    await sched.start()
    n = 0
    while n < total:
        await sched.enqueue_batch([cronoq.Task({"n": n + i}) for i in range(1000)])
        n += 1000
    gc.collect()
    rss = _rss_mib()
    pending = len(sched._driver.core.tasks)
    await sched.shutdown(grace=0)
    return {"tasks": pending, "rss": rss - base, "peak": _peak_mib() - base}


def _child(args) -> int:
    import json
    if args.child == "recover":
        result = asyncio.run(_child_recover(args.path))
    else:
        result = asyncio.run(_child_memory(args.total))
    print(json.dumps(result))
    return 0


def recovery(total: int, runs: int) -> None:
    import json
    import subprocess

    def child(*extra: str) -> dict:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *extra], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    temp = tempfile.mkdtemp(prefix="cronoq-bench-")
    try:
        path = os.path.join(temp, "backlog.db")
        start = time.perf_counter()
        asyncio.run(_fill(path, total))
        print(f"recovery: {total:,} pending tasks written in {time.perf_counter() - start:.1f} s "
              f"({os.path.getsize(path) / 2**20:,.0f} MiB file); median of {runs} runs, each in a "
              f"fresh process", flush=True)
        recovered = [child("--child", "recover", "--path", path) for _ in range(runs)]
        floor = [child("--child", "memory", "--total", str(total)) for _ in range(runs)]
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert all(r["tasks"] == total for r in recovered + floor), (recovered, floor)
    rate = statistics.median(total / r["seconds"] for r in recovered)
    rss = statistics.median(r["rss"] for r in recovered)
    peak = statistics.median(r["peak"] for r in recovered)
    floor_rss = statistics.median(r["rss"] for r in floor)
    floor_peak = statistics.median(r["peak"] for r in floor)
    rates = ", ".join(f"{total / r['seconds']:,.0f}" for r in recovered)
    sizes = ", ".join(f"{r['rss']:,.0f}" for r in recovered)
    floor_sizes = ", ".join(f"{r['rss']:,.0f}" for r in floor)
    print(f"{'':<34}{'figure':>12}{'target':>12}   runs")
    print(f"{'recovery, tasks/s':<34}{rate:>12,.0f}{RECOVERY_TARGET:>12,}   {rates}")
    print(f"{'RSS after recovery, MiB':<34}{rss:>12,.0f}{'':>12}   {sizes} (peak {peak:,.0f})")
    print(f"{'RSS, same backlog in memory, MiB':<34}{floor_rss:>12,.0f}{'':>12}   "
          f"{floor_sizes} (peak {floor_peak:,.0f})")
    print(f"{'ratio, recovered / in memory':<34}{rss / floor_rss:>12.2f}{RECOVERY_MEMORY_TARGET:>12}   "
          f"peak ratio {peak / floor_peak:.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a fifth of the tasks, three runs")
    parser.add_argument("--run", action="store_true", help="let the pool run the tasks (8 slots, no-op)")
    parser.add_argument("--profile", choices=list(SCENARIOS), help="cProfile one run of this scenario")
    parser.add_argument("--recovery", action="store_true",
                        help="only the recovery scenario (SQLite): speed and memory against the in-memory floor")
    parser.add_argument("--tasks", type=int, help="the recovery backlog (default 1,000,000)")
    parser.add_argument("--child", choices=["recover", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    runs = 3 if args.quick else args.runs
    scale = 0.2 if args.quick else 1.0
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    recovery_total = args.tasks or (200_000 if args.quick else 1_000_000)
    if args.recovery:
        recovery(recovery_total, args.runs if args.runs != 5 else 3)
        return 0

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
        if "sqlite" in backends:
            recovery(recovery_total, 3)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(temp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
