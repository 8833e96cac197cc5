"""The thread side, against its floors, in one run.

Floors, measured in the same process run:
- threads: a ``queue.PriorityQueue`` with 8 worker threads doing the same
  no-op work (one thread puts the tasks, then waits for them all);
- asyncio: an ``asyncio.Queue`` with 8 worker coroutines.

Two references for the asyncio path, to show what its target leaves room
for: the same queue whose workers resolve a plain asyncio future per item,
awaited with ``asyncio.gather`` over every future (the cost of gather
itself), and the engine alone (``bench/engine.py`` (a): submit, dispatch
and complete, sans-IO).

Paths (50,000 no-op tasks each by default, 8 slots):
- legacy: one thread calls ``ElasticPriorityScheduler.submit(Task(id,
  duration=0.0))`` for every task, then waits for ``completed_count``;
- blocking-1 / blocking-8: ``BlockingScheduler.submit`` from 1 and 8
  threads, then ``result()`` of every handle;
- asyncio-gather: ``Scheduler.submit_batch`` in batches of 1,000, then
  ``asyncio.gather`` over every handle.

And the start latency of one critical task submitted behind a backlog of
20,000 low tasks of 1 ms on 4 slots, on each path (p50/p99 over probes).

    python bench/threads.py [--tasks 50000] [--repeat 3] [--probes 100]
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cronoq  # noqa: E402
from engine import cycles_per_second  # noqa: E402  (bench/engine.py)
from cronoq_compat import ElasticPriorityScheduler, Priority, Task  # noqa: E402

SLOTS = 8


# ---------------------------------------------------------------- floors

def thread_floor(n: int) -> float:
    q: queue.PriorityQueue = queue.PriorityQueue()

    def worker() -> None:
        while True:
            item = q.get()
            if item[2] is None:
                q.task_done()
                return
            q.task_done()

    workers = [threading.Thread(target=worker) for _ in range(SLOTS)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    for i in range(n):
        q.put((2, i, object()))
    q.join()
    elapsed = time.perf_counter() - start
    for i in range(SLOTS):
        q.put((9, n + i, None))
    for w in workers:
        w.join()
    return n / elapsed


async def asyncio_floor(n: int) -> float:
    q: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            await q.get()
            q.task_done()

    workers = [asyncio.create_task(worker()) for _ in range(SLOTS)]
    start = time.perf_counter()
    for i in range(n):
        q.put_nowait(i)
    await q.join()
    elapsed = time.perf_counter() - start
    for w in workers:
        w.cancel()
    return n / elapsed


async def gather_floor(n: int) -> float:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            future = await q.get()
            future.set_result(None)
            q.task_done()

    workers = [asyncio.create_task(worker()) for _ in range(SLOTS)]
    start = time.perf_counter()
    futures = []
    for _ in range(n):
        future = loop.create_future()
        q.put_nowait(future)
        futures.append(future)
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    for w in workers:
        w.cancel()
    return n / elapsed


# ---------------------------------------------------------------- cronoq paths

def legacy(n: int) -> float:
    with ElasticPriorityScheduler(initial_workers=SLOTS, max_workers=SLOTS, min_workers=SLOTS) as sched:
        start = time.perf_counter()
        for i in range(n):
            sched.submit(Task(id=f"t{i}", duration=0.0))
        while sched.completed_count < n:
            time.sleep(0.0005)
        return n / (time.perf_counter() - start)


async def _noop(ctx, payload):
    return None


def blocking(n: int, threads: int) -> float:
    pool = cronoq.Pool("default", _noop, min=SLOTS, max=SLOTS, autoscale=False)
    with cronoq.BlockingScheduler([pool]) as sched:
        per = n // threads
        done = []
        start = time.perf_counter()

        def submit() -> None:
            handles = [sched.submit(None) for _ in range(per)]
            for h in handles:
                h.result()
            done.append(len(handles))

        pool_threads = [threading.Thread(target=submit) for _ in range(threads)]
        for t in pool_threads:
            t.start()
        for t in pool_threads:
            t.join()
        return sum(done) / (time.perf_counter() - start)


async def asyncio_gather(n: int, batch: int = 1000) -> float:
    pool = cronoq.Pool("default", _noop, min=SLOTS, max=SLOTS, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        start = time.perf_counter()
        handles = []
        for i in range(0, n, batch):
            handles.extend(await sched.submit_batch([cronoq.Task(None) for _ in range(min(batch, n - i))]))
        await asyncio.gather(*handles)
        return n / (time.perf_counter() - start)


# ---------------------------------------------------------------- latency under a backlog

BACKLOG = 20_000
LATENCY_SLOTS = 4


async def _one_ms(ctx, payload):
    if payload is not None:
        payload.append(time.perf_counter())
    else:
        await asyncio.sleep(0.001)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def latency_async(probes: int) -> list[float]:
    pool = cronoq.Pool("default", _one_ms, min=LATENCY_SLOTS, max=LATENCY_SLOTS, autoscale=False)
    out = []
    async with cronoq.Scheduler([pool], shutdown_grace=0) as sched:
        await sched.enqueue_batch([cronoq.Task(None, priority="low") for _ in range(BACKLOG)])
        for _ in range(probes):
            seen: list[float] = []
            sent = time.perf_counter()
            handle = await sched.submit(seen, priority="critical")
            await handle
            out.append(seen[0] - sent)
    return out


def latency_blocking(probes: int) -> list[float]:
    pool = cronoq.Pool("default", _one_ms, min=LATENCY_SLOTS, max=LATENCY_SLOTS, autoscale=False)
    out = []
    with cronoq.BlockingScheduler([pool], shutdown_grace=0) as sched:
        sched.enqueue_batch([cronoq.Task(None, priority="low") for _ in range(BACKLOG)])
        for _ in range(probes):
            seen: list[float] = []
            sent = time.perf_counter()
            sched.submit(seen, priority="critical").result(timeout=30)
            out.append(seen[0] - sent)
    return out


def latency_legacy(probes: int) -> list[float]:
    out = []
    started: dict[str, float] = {}

    class Timed(ElasticPriorityScheduler):
        async def _run(self, ctx, job):   # records when each probe starts
            if ctx.key in started:
                started[ctx.key] = time.perf_counter()
            return await super()._run(ctx, job)

    with Timed(initial_workers=LATENCY_SLOTS, max_workers=LATENCY_SLOTS, min_workers=LATENCY_SLOTS,
               shutdown_grace=0) as sched:
        for i in range(BACKLOG):
            sched.submit(Task(id=f"low{i}", duration=0.001, priority=Priority.LOW))
        for i in range(probes):
            key = f"probe{i}"
            started[key] = 0.0
            sent = time.perf_counter()
            sched.submit(Task(id=key, duration=0.0, priority=Priority.CRITICAL))
            while not started[key]:
                time.sleep(0.00005)
            out.append(started[key] - sent)
    return out


# ---------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    n = args.tasks
    runs: dict[str, list[float]] = {k: [] for k in (
        "thread floor", "asyncio floor", "legacy", "blocking-1", "blocking-8", "asyncio-gather", "gather floor",
        "engine")}
    for _ in range(args.repeat):   # interleaved, so noise hits every path alike
        runs["thread floor"].append(thread_floor(n))
        runs["legacy"].append(legacy(n))
        runs["blocking-1"].append(blocking(n, 1))
        runs["blocking-8"].append(blocking(n, 8))
        runs["asyncio floor"].append(asyncio.run(asyncio_floor(n)))
        runs["asyncio-gather"].append(asyncio.run(asyncio_gather(n)))
        runs["gather floor"].append(asyncio.run(gather_floor(n)))
        runs["engine"].append(cycles_per_second(n))
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{n:,} no-op tasks, {SLOTS} slots, median of {args.repeat} interleaved runs\n")
    print(f"  {'path':<38} {'tasks/s':>10} {'ratio':>8}  target")
    print(f"  {'queue.PriorityQueue + 8 threads (floor)':<38} {med['thread floor']:10,.0f}")
    for k, label, target in (("legacy", "legacy submit, 1 thread", 0.3),
                             ("blocking-1", "BlockingScheduler.submit, 1 thread", 0.3),
                             ("blocking-8", "BlockingScheduler.submit, 8 threads", 0.3)):
        ratio = med[k] / med["thread floor"]
        print(f"  {label:<38} {med[k]:10,.0f} {ratio:8.3f}  >= {target}")
    print(f"  {'asyncio.Queue + 8 workers (floor)':<38} {med['asyncio floor']:10,.0f}")
    ratio = med["asyncio-gather"] / med["asyncio floor"]
    print(f"  {'Scheduler, batches of 1,000 + gather':<38} {med['asyncio-gather']:10,.0f} {ratio:8.3f}  >= 0.1")
    print("\n  references for the asyncio path:")
    for k, label in (("gather floor", "gather over plain futures (8 workers)"),
                     ("engine", "engine alone (sans-IO cycles)")):
        print(f"  {label:<38} {med[k]:10,.0f} {med[k] / med['asyncio floor']:8.3f}")
    bound = 1 / (1 / med["gather floor"] + 1 / med["engine"])
    print(f"  {'both, one after the other (1/(1/a+1/b))':<38} {bound:10,.0f} {bound / med['asyncio floor']:8.3f}"
          f"  (a scheduler that adds nothing)")
    if not args.skip_latency:
        print(f"\nstart latency of a critical task behind {BACKLOG:,} low tasks of 1 ms on {LATENCY_SLOTS} slots "
              f"({args.probes} probes)\n")
        for label, lat in (("asyncio Scheduler", asyncio.run(latency_async(args.probes))),
                           ("BlockingScheduler", latency_blocking(args.probes)),
                           ("legacy", latency_legacy(args.probes))):
            print(f"  {label:<20} p50 {_pct(lat, 0.5) * 1e3:7.3f} ms   p99 {_pct(lat, 0.99) * 1e3:7.3f} ms"
                  f"   (target p99 < 2 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
