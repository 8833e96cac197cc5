"""Legacy-API throughput: tasks of duration 0 completed per second from 8
submitting threads, through cronoq_compat.ElasticPriorityScheduler, beside the
same workload through cronoq.BlockingScheduler directly.

    python bench/compat.py [--tasks 40000] [--threads 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cronoq  # noqa: E402
from cronoq_compat import ElasticPriorityScheduler, Task  # noqa: E402


def legacy(tasks: int, threads: int) -> float:
    per_thread = tasks // threads
    with ElasticPriorityScheduler(initial_workers=8, max_workers=8) as sched:
        start = time.perf_counter()

        def submit(k: int) -> None:
            for i in range(per_thread):
                sched.submit(Task(id=f"{k}-{i}", duration=0.0))

        pool = [threading.Thread(target=submit, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        while sched.completed_count < per_thread * threads:
            time.sleep(0.001)
        elapsed = time.perf_counter() - start
    return per_thread * threads / elapsed


def blocking(tasks: int, threads: int) -> float:
    async def noop(ctx, payload):
        return None

    per_thread = tasks // threads
    pool = cronoq.Pool("default", noop, min=8, max=8, autoscale=False)
    with cronoq.BlockingScheduler([pool]) as sched:
        handles: list = []
        start = time.perf_counter()

        def submit() -> None:
            mine = [sched.submit(None) for _ in range(per_thread)]
            handles.extend(mine)

        workers = [threading.Thread(target=submit) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        for h in handles:
            h.result(timeout=60)
        elapsed = time.perf_counter() - start
    return per_thread * threads / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name, fn in (("legacy ElasticPriorityScheduler", legacy), ("BlockingScheduler", blocking)):
        rates = [fn(args.tasks, args.threads) for _ in range(args.repeat)]
        rows.append((name, statistics.median(rates), min(rates), max(rates)))
    print(f"{args.tasks} tasks of duration 0 from {args.threads} submitting threads (median of {args.repeat})")
    for name, median, lo, hi in rows:
        print(f"  {name:34s} {median:10,.0f} tasks/s   (min {lo:,.0f}, max {hi:,.0f})")
    print(f"  ratio legacy / blocking: {rows[0][1] / rows[1][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
