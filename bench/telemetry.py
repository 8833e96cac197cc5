"""What a Prometheus scrape costs, and that it does not grow with the backlog.

    python bench/telemetry.py            # 100 pools x {0, 10k, 1M} pending tasks
    python bench/telemetry.py --quick    # 100 pools x {0, 10k, 100k}, fewer scrapes

A ``BlockingScheduler`` with 100 pools first runs a short warm-up workload
(so every pool's metrics window holds real waits and run times), then its
pools are set to capacity 0 and the backlog is filled to each size in turn,
spread over the pools and the four classes. At each size it times, as the
median (and minimum) of several repetitions:

- snapshot: ``BlockingScheduler.snapshot()`` from the main thread (one loop
  round trip plus ``Core.snapshot``);
- collect: ``generate_latest`` on a registry holding a ``PrometheusCollector``,
  from the main thread, as prometheus-client's HTTP server does (snapshot,
  metric families and the text format);
- http: a GET of ``/metrics`` from ``serve_metrics`` through urllib.

Not a test: nothing here asserts. The scheduler does no work for metrics
between scrapes, so there is no per-task figure to report.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from prometheus_client import generate_latest  # noqa: E402

import cronoq  # noqa: E402
from cronoq.telemetry import metrics_registry, serve_metrics  # noqa: E402

POOLS = 100
CLASSES = ("critical", "high", "normal", "low")


def noop(ctx, payload):
    return None


async def anoop(ctx, payload):
    return None


def timed(fn, repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), min(samples)


def fill(sched: cronoq.BlockingScheduler, names: list[str], count: int) -> None:
    """Add ``count`` plain tasks, round-robin over pools and classes."""
    chunk = 50_000
    done = 0
    while done < count:
        n = min(chunk, count - done)
        tasks = [cronoq.Task(None, pool=names[(done + i) % len(names)],
                             priority=CLASSES[((done + i) // len(names)) % 4]) for i in range(n)]
        sched.enqueue_batch(tasks)
        done += n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = (0, 10_000, 100_000) if args.quick else (0, 10_000, 1_000_000)
    repeat = 7 if args.quick else 15

    names = [f"pool-{i:03d}" for i in range(POOLS)]
    pools = [cronoq.Pool(name, anoop, min=0, max=4, initial=2, autoscale=False) for name in names]
    sched = cronoq.BlockingScheduler(pools)
    sched.start()
    try:
        # Warm-up: real dispatches, so the windows' histograms are not empty.
        warm = [cronoq.Task(None, pool=name, kind=f"k{j % 4}", priority=CLASSES[j % 4])
                for name in names for j in range(100)]
        sched.enqueue_batch(warm)
        deadline = time.monotonic() + 60
        while sched.snapshot().totals["succeeded"] < len(warm) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in names:
            sched.set_capacity(name, 0)

        registry = metrics_registry(sched)
        server = serve_metrics(sched, port=0)
        url = server.url
        print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
              f"{POOLS} pools; median (min) of {repeat} repetitions")
        print(f"{'pending':>10} | {'snapshot ms':>14} | {'collect ms':>14} | {'http ms':>14} | {'bytes':>7}")
        pending = 0
        try:
            for size in sizes:
                fill(sched, names, size - pending)
                pending = size
                snap = sched.snapshot()
                assert snap.pending == size, (snap.pending, size)
                gc.collect()
                body = generate_latest(registry)
                s_med, s_min = timed(sched.snapshot, repeat)
                c_med, c_min = timed(lambda: generate_latest(registry), repeat)
                h_med, h_min = timed(lambda: urllib.request.urlopen(url, timeout=30).read(), repeat)
                print(f"{size:>10,} | {s_med * 1e3:7.2f} ({s_min * 1e3:5.2f}) | "
                      f"{c_med * 1e3:7.2f} ({c_min * 1e3:5.2f}) | {h_med * 1e3:7.2f} ({h_min * 1e3:5.2f}) | "
                      f"{len(body):>7}")
        finally:
            server.shutdown()
    finally:
        sched.shutdown(grace=0)


if __name__ == "__main__":
    main()
