"""End-to-end runtime benchmarks, side by side in one run.

1. Throughput: N no-op tasks submitted in batches of 1,000 through
   ``cronoq.Scheduler`` with 8 slots, against the floor, a bare
   ``asyncio.Queue`` with 8 worker coroutines doing the same no-op work.
   Reports tasks/s for both and their ratio (with handles, and with
   ``enqueue_batch``).
2. Latency under backlog: a high-priority task submitted into a backlog of
   20,000 low-priority 1 ms tasks on 4 slots; time from submission to the
   executor starting it (p50/p99 over many probes).
3. ``BlockingScheduler`` throughput from 8 submitting threads.

    python bench/runtime.py [--tasks 100000] [--repeat 5]

The machine is shared and noisy: medians of several runs, and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cronoq  # noqa: E402


async def _noop(ctx, payload):
    return None


async def floor(n: int) -> float:
    queue: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            item = await queue.get()
            await _noop(None, item)
            queue.task_done()

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    start = time.perf_counter()
    for i in range(n):
        queue.put_nowait(i)
    await queue.join()
    elapsed = time.perf_counter() - start
    for w in workers:
        w.cancel()
    return n / elapsed


async def cronoq_throughput(n: int, handles: bool) -> float:
    pool = cronoq.Pool("default", _noop, min=8, max=8, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        start = time.perf_counter()
        last = None
        for base in range(0, n, 1000):
            batch = [cronoq.Task(i) for i in range(base, min(n, base + 1000))]
            if handles:
                last = await sched.submit_batch(batch)
            else:
                await sched.enqueue_batch(batch)
        if handles:
            await last[-1]          # one class, FIFO: the last task ends last
        else:
            core = sched._driver.core   # no handles to wait on: watch the engine drain
            while core.pending or core.running:
                await asyncio.sleep(0)
        elapsed = time.perf_counter() - start
    return n / elapsed


async def latency(backlog: int, probes: int) -> list[float]:
    starts: dict[int, float] = {}

    async def run(ctx, payload):
        if payload == "probe":
            starts[ctx.id] = time.perf_counter()
            return None
        await asyncio.sleep(0.001)
        return None

    pool = cronoq.Pool("default", run, min=4, max=4, autoscale=False)
    waits = []
    async with cronoq.Scheduler([pool]) as sched:
        await sched.enqueue_batch([cronoq.Task("low", priority="low") for _ in range(backlog)])
        await asyncio.sleep(0.05)
        for _ in range(probes):
            submitted = time.perf_counter()
            handle = await sched.submit("probe", priority="high")
            await handle
            waits.append(starts[handle.id] - submitted)
            await asyncio.sleep(0.003)
        await sched.shutdown(grace=0)
    return waits


def blocking_threads(n: int, threads: int) -> float:
    pool = cronoq.Pool("default", _noop, min=8, max=8, autoscale=False)
    per_thread = n // threads
    with cronoq.BlockingScheduler([pool]) as sched:
        handles: list = []
        lock = threading.Lock()

        def submit() -> None:
            mine = [sched.submit(None) for _ in range(per_thread)]
            with lock:
                handles.extend(mine)

        start = time.perf_counter()
        workers = [threading.Thread(target=submit) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        for h in handles:
            h.result(timeout=60)
        elapsed = time.perf_counter() - start
    return per_thread * threads / elapsed


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--probes", type=int, default=300)
    args = parser.parse_args()
    n = args.tasks
    floors, handled, enqueued = [], [], []
    for _ in range(args.repeat):   # interleaved, so noise hits all three alike
        floors.append(asyncio.run(floor(n)))
        handled.append(asyncio.run(cronoq_throughput(n, True)))
        enqueued.append(asyncio.run(cronoq_throughput(n, False)))
    f, h, e = statistics.median(floors), statistics.median(handled), statistics.median(enqueued)
    print(f"throughput, {n:,} no-op tasks, 8 slots, median of {args.repeat}:")
    print(f"  asyncio.Queue + 8 workers (floor)  {f:12,.0f} tasks/s")
    print(f"  cronoq submit_batch (handles)      {h:12,.0f} tasks/s   ratio to floor {h / f:.3f}")
    print(f"  cronoq enqueue_batch               {e:12,.0f} tasks/s   ratio to floor {e / f:.3f}")
    waits = asyncio.run(latency(20_000, args.probes))
    print(f"high-priority start latency in a backlog of 20,000 low 1 ms tasks on 4 slots "
          f"({len(waits)} probes): p50 {pct(waits, 0.5) * 1e3:.2f} ms, p99 {pct(waits, 0.99) * 1e3:.2f} ms, "
          f"max {max(waits) * 1e3:.2f} ms")
    rates = [blocking_threads(40_000, 8) for _ in range(max(1, args.repeat // 2))]
    print(f"BlockingScheduler, 8 submitting threads, 40,000 tasks: {statistics.median(rates):,.0f} tasks/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
