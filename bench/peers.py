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
peers' workers are not started.

"With work running" (``--case running``): the same single submits while a
worker of one slot executes what was submitted (as a web handler submits
while workers run): each dispatch and completion is written to the store
too, beside the submits. cronoq runs a pool of 1 (``async def`` executor)
in the submitting process. The peers run their worker in the same process
(huey's consumer as a thread, procrastinate's worker on the same event
loop) and, on the next line, in a process of its own (as ``huey_consumer``
and ``procrastinate worker`` run). huey's consumer has one worker thread and
polls every millisecond (``HUEY_CONSUMER``); procrastinate's worker has
concurrency 1 and its defaults (LISTEN/NOTIFY). Each line says how many
tasks were executed while the submits ran, and cronoq's ratio to each peer
is given for each run.

huey and procrastinate are bench-only dependencies (``pip install huey
procrastinate``).

    python bench/peers.py [--single 2000] [--batches 20] [--runs 3] [--backend sqlite|postgres|all]
        [--case idle|running|all]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import builds  # noqa: E402  (bench/builds.py: the commit)
import cronoq  # noqa: E402

BATCH = 1000

# huey's consumer, one worker thread. It polls an empty queue after 0.1 s,
# then ever less often (up to 10 s): a consumer that found the queue empty
# once would sleep through most of a run of submits and execute nearly
# nothing. Polling every millisecond (``huey_consumer -d 0.001 -b 1 -m
# 0.001``) keeps it executing while the submits come.
HUEY_CONSUMER = dict(workers=1, worker_type="thread", initial_delay=0.001, backoff=1.0, max_delay=0.001)


class Executed:
    """How many tasks a worker executed while the submits ran."""

    def __init__(self) -> None:
        self.count = 0
        self.during = 0

    def done(self) -> None:
        self.count += 1

    def start(self) -> None:
        self.during = -self.count

    def stop(self) -> None:
        self.during += self.count


def _pool(slots: int = 0, executed: Executed | None = None) -> cronoq.Pool:
    async def noop(ctx, payload):
        if executed is not None:
            executed.done()
        return None
    return cronoq.Pool("default", noop, min=slots, max=max(slots, 1), initial=slots, autoscale=False)


async def cronoq_single(store: cronoq.SqliteStore | cronoq.PostgresStore, n: int,
                        executed: Executed | None = None) -> float:
    """Single awaited submits; with ``executed``, a pool of 1 runs them meanwhile."""
    pool = _pool(1, executed) if executed is not None else _pool()
    async with cronoq.Scheduler([pool], store=store) as sched:
        await sched.enqueue(-1)    # warm: the first commit prepares statements
        if executed is not None:
            executed.start()
        start = time.perf_counter()
        for i in range(n):
            await sched.enqueue(i)
        rate = n / (time.perf_counter() - start)
        if executed is not None:
            executed.stop()
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


def huey_single(path: str, n: int, executed: Executed | None = None) -> float:
    """huey's enqueue; with ``executed``, its consumer (one worker thread) runs meanwhile."""
    from huey import SqliteHuey

    huey = SqliteHuey(filename=path)

    @huey.task()
    def noop(x):
        if executed is not None:
            executed.done()
        return x

    consumer = None
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    if executed is not None:
        consumer = huey.create_consumer(**HUEY_CONSUMER)
        consumer.start()   # sets signal handlers: put back below
    try:
        noop(-1)
        if executed is not None:
            executed.start()
        start = time.perf_counter()
        for i in range(n):
            noop(i)
        rate = n / (time.perf_counter() - start)
        if executed is not None:
            executed.stop()
    finally:
        if consumer is not None:
            consumer.stop(graceful=True)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        huey.storage.close()
    return rate


def _procrastinate_app(url: str, schema: str, executed: Executed | None = None,
                       create: bool = True) -> tuple[Any, Any]:
    """A procrastinate app on its own schema (``create``: made now), and its task."""
    import procrastinate
    import psycopg

    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    if create:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    options = f"{conninfo}?options=-csearch_path%3D{schema}" if "?" not in conninfo else \
        f"{conninfo}&options=-csearch_path%3D{schema}"
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=options))

    @app.task(name="noop")
    async def noop(x):
        if executed is not None:
            executed.done()
        return x

    return app, noop


async def procrastinate_run(url: str, schema: str, n: int, batches: int) -> tuple[float, float]:
    app, noop = _procrastinate_app(url, schema)
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


def _huey_consumer_process(path: str, ready: Any, stop: Any, count: Any) -> None:
    """A huey consumer in a process of its own (as ``huey_consumer`` runs)."""
    from huey import SqliteHuey

    huey = SqliteHuey(filename=path)

    def noop(x):
        with count.get_lock():
            count.value += 1
        return x

    noop.__module__ = "peers"   # huey names a task after its module: the same in both processes
    huey.task(name="noop")(noop)

    consumer = huey.create_consumer(**HUEY_CONSUMER)
    consumer.start()
    ready.set()
    stop.wait()
    consumer.stop(graceful=True)


def _procrastinate_worker_process(url: str, schema: str, ready: Any, stop: Any, count: Any) -> None:
    """A procrastinate worker in a process of its own (as ``procrastinate worker`` runs)."""
    class Counter:
        def done(self) -> None:
            with count.get_lock():
                count.value += 1

    async def work() -> None:
        app, _ = _procrastinate_app(url, schema, Counter(), create=False)   # type: ignore[arg-type]
        async with app.open_async():
            worker = asyncio.create_task(app.run_worker_async(concurrency=1, wait=True,
                                                              install_signal_handlers=False))
            ready.set()
            await asyncio.to_thread(stop.wait)
            worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass

    asyncio.run(work())


class PeerProcess:
    """A peer's worker in a child process; ``executed`` counts what it ran."""

    def __init__(self, target: Any, *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self.ready, self.stop_event = context.Event(), context.Event()
        self.count = context.Value("l", 0)
        self.process = context.Process(target=target, args=(*args, self.ready, self.stop_event, self.count),
                                       daemon=True)

    def __enter__(self) -> PeerProcess:
        self.process.start()
        if not self.ready.wait(60):
            raise RuntimeError("the peer's worker process did not start")
        return self

    def wait_for_work(self) -> None:
        """Until the worker executed its first task."""
        give_up = time.monotonic() + 60
        while self.executed < 1:
            if time.monotonic() > give_up or not self.process.is_alive():
                raise RuntimeError("the peer's worker process executed nothing")
            time.sleep(0.001)

    @property
    def executed(self) -> int:
        return int(self.count.value)

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def huey_process_single(path: str, n: int, executed: Executed) -> float:
    """huey's enqueue while its consumer runs in another process."""
    from huey import SqliteHuey

    huey = SqliteHuey(filename=path)

    def task(x):
        return x

    task.__module__ = "peers"
    noop = huey.task(name="noop")(task)
    noop(-1)   # creates the database before the consumer opens it
    with PeerProcess(_huey_consumer_process, path) as peer:
        peer.wait_for_work()
        executed.during = -peer.executed
        start = time.perf_counter()
        for i in range(n):
            noop(i)
        rate = n / (time.perf_counter() - start)
        executed.during += peer.executed
    huey.storage.close()
    return rate


async def procrastinate_process_running(url: str, schema: str, n: int, executed: Executed) -> float:
    """Single defers while a worker in another process executes them."""
    app, noop = _procrastinate_app(url, schema)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        with PeerProcess(_procrastinate_worker_process, url, schema) as peer:
            await noop.defer_async(x=-1)
            await asyncio.to_thread(peer.wait_for_work)
            executed.during = -peer.executed
            start = time.perf_counter()
            for i in range(n):
                await noop.defer_async(x=i)
            rate = n / (time.perf_counter() - start)
            executed.during += peer.executed
    return rate


async def procrastinate_running(url: str, schema: str, n: int, executed: Executed) -> float:
    """Single defers while a worker (concurrency 1, same loop) executes them."""
    app, noop = _procrastinate_app(url, schema, executed)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(app.run_worker_async(concurrency=1, wait=True,
                                                          install_signal_handlers=False))
        try:
            await noop.defer_async(x=-1)
            while not executed.count:   # the worker is up
                await asyncio.sleep(0.001)
            executed.start()
            start = time.perf_counter()
            for i in range(n):
                await noop.defer_async(x=i)
            rate = n / (time.perf_counter() - start)
            executed.stop()
        finally:
            worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--case", choices=["idle", "running", "all"], default="all",
                        help="idle: nothing executes; running: a worker of one slot executes meanwhile")
    args = parser.parse_args()
    idle, running = args.case in ("idle", "all"), args.case in ("running", "all")
    temp = tempfile.mkdtemp(prefix="cronoq-peers-")
    runs: dict[str, list[float]] = {}
    executed: dict[str, list[int]] = {}
    pairs: list[tuple[str, str]] = []   # (cronoq's line, the peer's line): ratios per run

    def add(name: str, value: float, worker: Executed | None = None) -> None:
        runs.setdefault(name, []).append(value)
        if worker is not None:
            executed.setdefault(name, []).append(worker.during)

    load_before = os.getloadavg()
    try:
        if args.backend in ("sqlite", "all"):
            if running:
                pairs.append(("SQLite  cronoq full_sync=True, single, running",
                              "SQLite  huey SqliteHuey, single, running, consumer thread"))
                pairs.append(("SQLite  cronoq full_sync=True, single, running",
                              "SQLite  huey SqliteHuey, single, running, consumer process"))
            if idle:
                pairs.append(("SQLite  cronoq full_sync=True, single", "SQLite  huey SqliteHuey, single"))
            for r in range(args.runs):   # interleaved: noise hits each alike
                if running:
                    worker = Executed()
                    add("SQLite  huey SqliteHuey, single, running, consumer thread",
                        huey_single(os.path.join(temp, f"hr{r}.db"), args.single, worker), worker)
                    worker = Executed()
                    add("SQLite  huey SqliteHuey, single, running, consumer process",
                        huey_process_single(os.path.join(temp, f"hp{r}.db"), args.single, worker), worker)
                    worker = Executed()
                    add("SQLite  cronoq full_sync=True, single, running", asyncio.run(cronoq_single(
                        cronoq.SqliteStore(os.path.join(temp, f"cr{r}.db")), args.single, worker)), worker)
                if not idle:
                    continue
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
                if running:
                    pairs.append(("PostgreSQL  cronoq enqueue, single, running",
                                  "PostgreSQL  procrastinate defer, single, running, worker on the loop"))
                    pairs.append(("PostgreSQL  cronoq enqueue, single, running",
                                  "PostgreSQL  procrastinate defer, single, running, worker process"))
                if idle:
                    pairs.append(("PostgreSQL  cronoq enqueue, single", "PostgreSQL  procrastinate defer, single"))
                    pairs.append(("PostgreSQL  cronoq enqueue_batch x1000",
                                  "PostgreSQL  procrastinate batch_defer x1000"))
                server = PgServer(fsync=True).start()
                try:
                    for r in range(args.runs):
                        if running:
                            worker = Executed()
                            add("PostgreSQL  procrastinate defer, single, running, worker on the loop", asyncio.run(
                                procrastinate_running(server.url, f"prr{r}", args.single, worker)), worker)
                            worker = Executed()
                            add("PostgreSQL  procrastinate defer, single, running, worker process",
                                asyncio.run(procrastinate_process_running(server.url, f"prp{r}", args.single,
                                                                          worker)), worker)
                            worker = Executed()
                            add("PostgreSQL  cronoq enqueue, single, running", asyncio.run(cronoq_single(
                                cronoq.PostgresStore(server.url, schema=f"csr{r}"), args.single, worker)), worker)
                        if not idle:
                            continue
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
    load_after = os.getloadavg()
    print(f"commit {builds.commit()}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"median (min-max) of {args.runs} interleaved runs; single: {args.single:,} submits, batched: "
          f"{args.batches} x {BATCH:,}\n")
    for name, values in runs.items():
        line = (f"  {name:<66} {statistics.median(values):>8,.0f}/s  ({min(values):,.0f}-{max(values):,.0f})"
                f"   runs: {', '.join(f'{v:,.0f}' for v in values)}")
        if name in executed:
            line += f"   executed meanwhile: {', '.join(f'{v:,}' for v in executed[name])}"
        print(line)
    print()
    for ours, peer in pairs:
        if ours in runs and peer in runs:
            ratios = [a / b for a, b in zip(runs[ours], runs[peer])]
            print(f"  {ours} / {peer.split('  ', 1)[1]}: median {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f})   runs: {', '.join(f'{v:.2f}' for v in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
