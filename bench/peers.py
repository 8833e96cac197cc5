"""Durable submissions beside peer task queues, in one run.

SQLite, single submits one after another, each returning once it is on disk:
- huey's ``SqliteHuey`` (its defaults: WAL, synchronous=FULL), ``task(x)``;
- cronoq, ``await sched.enqueue(x)`` on a ``SqliteStore`` with
  ``full_sync=True`` (the default: the same fsync per commit), with
  ``full_sync=False``, and with ``inline_commits=False`` (every commit on
  the store's thread); and ``BlockingScheduler.enqueue(x)`` from a thread.

PostgreSQL (a throwaway server, fsync and synchronous_commit on):
- procrastinate, ``await task.defer_async(x=...)`` one at a time, and
  ``await task.batch_defer_async(...)`` in batches of 1,000;
- cronoq, ``await sched.enqueue(x)`` one at a time, and
  ``await sched.enqueue_batch([...1,000])``.

The cronoq pool has no capacity (the tasks are accepted, not run), as the
peers' workers are not started. huey and procrastinate are bench-only
dependencies (``pip install huey procrastinate``).

    python bench/peers.py [--single 2000] [--batches 20] [--runs 3] [--backend sqlite|postgres|all]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import cronoq  # noqa: E402

BATCH = 1000


def _pool() -> cronoq.Pool:
    async def noop(ctx, payload):
        return None
    return cronoq.Pool("default", noop, min=0, max=1, initial=0, autoscale=False)


async def cronoq_single(store: cronoq.SqliteStore | cronoq.PostgresStore, n: int) -> float:
    async with cronoq.Scheduler([_pool()], store=store) as sched:
        await sched.enqueue(-1)    # warm: the first commit prepares statements
        start = time.perf_counter()
        for i in range(n):
            await sched.enqueue(i)
        rate = n / (time.perf_counter() - start)
    await store.close()
    return rate


async def cronoq_batched(store: cronoq.PostgresStore, batches: int) -> float:
    async with cronoq.Scheduler([_pool()], store=store) as sched:
        await sched.enqueue(-1)
        start = time.perf_counter()
        for b in range(batches):
            await sched.enqueue_batch([cronoq.Task(b * BATCH + i) for i in range(BATCH)])
        rate = batches * BATCH / (time.perf_counter() - start)
    await store.close()
    return rate


def blocking_single(path: str, n: int, inline: bool = True) -> float:
    """The same from a plain thread, through ``BlockingScheduler.enqueue``."""
    store = cronoq.SqliteStore(path, inline_commits=inline)
    with cronoq.BlockingScheduler([_pool()], store=store) as sched:
        sched.enqueue(-1)
        start = time.perf_counter()
        for i in range(n):
            sched.enqueue(i)
        return n / (time.perf_counter() - start)


def huey_single(path: str, n: int) -> float:
    from huey import SqliteHuey

    huey = SqliteHuey(filename=path)

    @huey.task()
    def noop(x):
        return x

    noop(-1)
    start = time.perf_counter()
    for i in range(n):
        noop(i)
    return n / (time.perf_counter() - start)


async def procrastinate_run(url: str, schema: str, n: int, batches: int) -> tuple[float, float]:
    import procrastinate
    import psycopg

    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    options = f"{conninfo}?options=-csearch_path%3D{schema}" if "?" not in conninfo else \
        f"{conninfo}&options=-csearch_path%3D{schema}"
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=options))

    @app.task(name="noop")
    def noop(x):
        return x

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await noop.defer_async(x=-1)
        start = time.perf_counter()
        for i in range(n):
            await noop.defer_async(x=i)
        single = n / (time.perf_counter() - start)
        start = time.perf_counter()
        for b in range(batches):
            await noop.batch_defer_async(*({"x": b * BATCH + i} for i in range(BATCH)))
        batched = batches * BATCH / (time.perf_counter() - start)
    return single, batched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    args = parser.parse_args()
    temp = tempfile.mkdtemp(prefix="cronoq-peers-")
    runs: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    try:
        if args.backend in ("sqlite", "all"):
            for r in range(args.runs):   # interleaved: noise hits each alike
                add("SQLite  huey SqliteHuey, single", huey_single(os.path.join(temp, f"h{r}.db"), args.single))
                add("SQLite  cronoq full_sync=True, single", asyncio.run(cronoq_single(
                    cronoq.SqliteStore(os.path.join(temp, f"c{r}.db")), args.single)))
                add("SQLite  cronoq full_sync=False, single", asyncio.run(cronoq_single(
                    cronoq.SqliteStore(os.path.join(temp, f"n{r}.db"), full_sync=False), args.single)))
                add("SQLite  cronoq inline_commits=False, single", asyncio.run(cronoq_single(
                    cronoq.SqliteStore(os.path.join(temp, f"w{r}.db"), inline_commits=False), args.single)))
                add("SQLite  cronoq BlockingScheduler, single", blocking_single(
                    os.path.join(temp, f"b{r}.db"), args.single))
        if args.backend in ("postgres", "all"):
            from pgserver import PgServer, unavailable_reason

            reason = unavailable_reason()
            if reason:
                print(f"PostgreSQL skipped: {reason}")
            else:
                server = PgServer(fsync=True).start()
                try:
                    for r in range(args.runs):
                        single, batched = asyncio.run(procrastinate_run(server.url, f"pr{r}", args.single,
                                                                        args.batches))
                        add("PostgreSQL  procrastinate defer, single", single)
                        add("PostgreSQL  procrastinate batch_defer x1000", batched)
                        add("PostgreSQL  cronoq enqueue, single", asyncio.run(cronoq_single(
                            cronoq.PostgresStore(server.url, schema=f"cs{r}"), args.single)))
                        add("PostgreSQL  cronoq enqueue_batch x1000", asyncio.run(cronoq_batched(
                            cronoq.PostgresStore(server.url, schema=f"cb{r}"), args.batches)))
                finally:
                    server.stop()
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    print(f"median of {args.runs} interleaved runs; single: {args.single:,} submits, batched: "
          f"{args.batches} x {BATCH:,}\n")
    for name, values in runs.items():
        print(f"  {name:<46} {statistics.median(values):>10,.0f}/s   ({', '.join(f'{v:,.0f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
