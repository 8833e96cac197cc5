"""How soon moving frozen time takes effect (freezegun), in real time.

For each path (BlockingScheduler, legacy ElasticPriorityScheduler, the
asyncio Scheduler on a frozen loop), a task waits for a fixed start one
frozen hour ahead; the bench moves frozen time by an hour and measures, on
the real monotonic clock, how long until the task runs. Reported: median and
p99 over the runs, next to the poll interval (the bound cronoq states).

    python bench/frozen.py [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from freezegun import freeze_time

import cronoq
from cronoq_compat import ElasticPriorityScheduler, Task


def real() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def blocking_path(runs: int) -> list[float]:
    out = []
    ran = threading.Event()
    seen = [0.0]

    def job(ctx, x):
        seen[0] = real()
        ran.set()

    with freeze_time("2026-01-01 09:00:00") as frozen:
        with cronoq.BlockingScheduler([cronoq.Pool("default", job)]) as sched:
            for _ in range(runs):
                ran.clear()
                sched.submit(None, start_in=3600)
                moved = real()
                frozen.tick(3600)
                ran.wait(10)
                out.append(seen[0] - moved)
    return out


def legacy_path(runs: int) -> list[float]:
    out = []
    with freeze_time("2026-01-01 09:00:00") as frozen:
        sched = ElasticPriorityScheduler(max_workers=2)
        sched.start()
        for i in range(runs):
            sched.submit(Task(id=f"t{i}", duration=0.0, fixed_start=time.time() + 3600))
            moved = real()
            frozen.tick(3600)
            while sched.completed_count <= i:
                time.sleep(0.0002)
            out.append(real() - moved)
        sched.stop()
    return out


def native_path(runs: int) -> list[float]:
    out: list[float] = []

    async def job(ctx, x):
        return real()

    async def main(frozen) -> None:
        async with cronoq.Scheduler([cronoq.Pool("default", job)]) as sched:
            for _ in range(runs):
                handle = await sched.submit(None, start_in=3600)
                moved = real()
                frozen.tick(3600)
                out.append(await handle - moved)

    with freeze_time("2026-01-01 09:00:00") as frozen:
        asyncio.run(main(frozen))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    poll = cronoq.SystemClock().poll_interval
    print(f"poll interval {poll * 1e3:.0f} ms; {args.runs} runs per path\n")
    print(f"{'path':<34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, path in (("BlockingScheduler", blocking_path), ("legacy ElasticPriorityScheduler", legacy_path),
                       ("asyncio Scheduler, frozen loop", native_path)):
        lat = sorted(path(args.runs))
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        print(f"{name:<34} {statistics.median(lat) * 1e3:8.2f} {p99 * 1e3:8.2f} {lat[-1] * 1e3:8.2f}")


if __name__ == "__main__":
    main()
