"""cronoq-server against the in-process scheduler, side by side in one run.

For each setup, no-op tasks are submitted in batches and awaited:

- ``in-process``: ``cronoq.Scheduler`` with one pool of 32 slots running an
  ``async def`` no-op executor; batches through ``submit_batch``, every handle
  awaited.
- ``server, W workers``: a ``cronoq-server`` process (in memory, no auth) on
  loopback, W worker processes (``cronoq.client.Worker``, 8 slots each), the
  client in this process: batches through ``SubmitBatch``, completion awaited
  by polling the snapshot's ``succeeded`` total every 20 ms.

Figures: tasks/s (submission of the first batch to the last completion),
and the start latency of a high-priority task: the time from the submit call
to the executor (or the remote handler) starting it, p50 and p99 over many
probes, on an idle pool (the baseline), under a standing backlog of normal
no-op tasks (every slot busy, the machine saturated), and under a backlog of
normal tasks of 10 ms on average (every slot busy, the CPU not). Before each
probe the backlog is topped up to ``--backlog`` pending tasks (a third of
that for the 10 ms tasks), so every probe meets one. The added latency is
the difference to the baseline. Targets: >= 5,000 tasks/s with 4 workers;
high-priority start p99 < 5 ms through the server.

    python bench/server.py [--tasks 20000] [--batch 500] [--probes 200] [--workers 1,4] [--backlog 5000]

Workers and the server are child processes of this one, stopped by pid at
the end. The machine is shared and noisy: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cronoq  # noqa: E402

PROBE = b"probe"
SLOW = b"slow"    # a task of 10 ms on average (0 to 20 ms, so that slots do not free in waves)


# ---------------------------------------------------------------- worker processes


def worker_main(target: str, slots: int) -> None:
    from cronoq.client import Worker

    async def handle(lease):
        if lease.payload == PROBE:
            return time.monotonic()
        if lease.payload == SLOW:
            await asyncio.sleep(random.uniform(0.0, 0.02))
        return None

    async def main() -> None:
        worker = Worker(target, "default", handle, slots=slots, name=f"bench-{os.getpid()}", grace=1.0)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()

    asyncio.run(main())


# ---------------------------------------------------------------- in-process


async def in_process(tasks: int, batch: int, probes: int, backlog_size: int, slow_size: int) -> dict[str, float]:
    started: dict[int, float] = {}

    async def run(ctx, payload):
        if payload == PROBE:
            started[ctx.id] = time.monotonic()
        elif payload == SLOW:
            await asyncio.sleep(random.uniform(0.0, 0.02))
        return None

    pool = cronoq.Pool("default", run, min=32, max=32, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        begin = time.perf_counter()
        handles = []
        for start in range(0, tasks, batch):
            handles += await sched.submit_batch([cronoq.Task(i) for i in range(start, min(tasks, start + batch))])
        for handle in handles:
            await handle
        rate = tasks / (time.perf_counter() - begin)

        async def probe_latencies(backlog: Any) -> list[float]:
            latencies = []
            size = backlog_size if backlog == b"" else slow_size
            for _ in range(probes):
                # Keep the backlog standing: top it up, in small steps, before the probe's clock starts.
                while backlog is not None and (await sched.snapshot()).pending < size:
                    await sched.enqueue_batch([cronoq.Task(backlog) for _ in range(batch)])
                t0 = time.monotonic()
                handle = await sched.submit(PROBE, priority="high")
                await handle
                latencies.append(started[handle.id] - t0)
                await asyncio.sleep(0.002)
            while True:   # clear what is left of the backlog
                left = await sched.list_tasks(statuses=["ready"], limit=5000)
                if not left:
                    break
                for task in left:
                    await sched.cancel(task.id)
            return latencies

        idle = await probe_latencies(None)
        loaded = await probe_latencies(b"")
        slow = await probe_latencies(SLOW)
    return {"rate": rate, **_percentiles(idle, "idle"), **_percentiles(loaded, "backlog"),
            **_percentiles(slow, "slow")}


def _percentiles(values: list[float], name: str) -> dict[str, float]:
    values = sorted(values)
    return {f"{name}_p50": statistics.median(values) * 1000,
            f"{name}_p99": values[min(len(values) - 1, int(len(values) * 0.99))] * 1000}


# ---------------------------------------------------------------- through the server


async def through_server(tasks: int, batch: int, probes: int, workers: int, slots: int, backlog_size: int,
                         slow_size: int) -> dict[str, float]:
    from cronoq.client import Client

    with tempfile.TemporaryDirectory() as directory:
        config = Path(directory) / "bench.toml"
        config.write_text('[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 1\n'
                          '[limits]\nmax_tasks_per_batch = 10000\n')
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        server = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config)],
                                  stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        children = [server]
        try:
            assert server.stderr is not None
            port = None
            while port is None:
                line = server.stderr.readline()
                if not line:
                    raise RuntimeError("the server exited")
                match = re.search(r"listening: grpc [^ ]+:(\d+)", line)
                if match:
                    port = int(match.group(1))
            # Drain the log from now on, so the server never blocks on a full pipe.
            asyncio.get_running_loop().run_in_executor(None, lambda: [None for _ in server.stderr])
            target = f"127.0.0.1:{port}"
            for _ in range(workers):
                children.append(subprocess.Popen([sys.executable, __file__, "--worker", target, "--slots", str(slots)],
                                                 env=env, stdout=subprocess.DEVNULL))
            async with Client(target) as client:
                deadline = time.monotonic() + 30
                while len(await client.workers()) < workers:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the workers did not connect")
                    await asyncio.sleep(0.05)

                async def succeeded() -> int:
                    return int((await client.snapshot())["totals"].get("succeeded", 0))

                base = await succeeded()
                begin = time.perf_counter()
                for start in range(0, tasks, batch):
                    await client.submit_batch([{"payload": b""} for _ in range(start, min(tasks, start + batch))])
                while await succeeded() - base < tasks:
                    await asyncio.sleep(0.02)
                rate = tasks / (time.perf_counter() - begin)

                async def probe_latencies(backlog: bytes | None) -> list[float]:
                    latencies = []
                    size = backlog_size if backlog == b"" else slow_size
                    for _ in range(probes):
                        # Keep the backlog standing: top it up, in batches, before the probe's clock starts.
                        while backlog is not None and (await client.snapshot())["pending"] < size:
                            await client.submit_batch([{"payload": backlog} for _ in range(batch)])
                        t0 = time.monotonic()
                        sub = await client.submit(PROBE, priority="high", wait=True, wait_timeout=30)
                        assert sub.result is not None and sub.result.ok, sub
                        latencies.append(sub.result.json() - t0)
                        await asyncio.sleep(0.002)
                    while True:   # clear what is left of the backlog
                        page = await client.list(statuses=["ready"], limit=1000)
                        if not page.tasks:
                            break
                        for task in page.tasks:
                            await client.cancel(task.id)
                    return latencies

                idle = await probe_latencies(None)
                loaded = await probe_latencies(b"")
                slow = await probe_latencies(SLOW)
            return {"rate": rate, **_percentiles(idle, "idle"), **_percentiles(loaded, "backlog"),
                    **_percentiles(slow, "slow")}
        finally:
            for child in reversed(children):
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child in reversed(children):
                try:
                    child.wait(20)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--workers", default="1,4", help="worker process counts to measure (comma-separated)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--backlog", type=int, default=5_000,
                        help="pending no-op tasks kept standing while probing (topped up before each probe); "
                             "the 10 ms backlog is a third of it")
    parser.add_argument("--worker", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.slots)
        return
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    slow = max(args.batch, args.backlog // 3)
    rows = [("in-process, 32 slots", asyncio.run(in_process(args.tasks, args.batch, args.probes, args.backlog,
                                                             slow)))]
    for count in (int(w) for w in args.workers.split(",")):
        rows.append((f"server, {count} worker{'s' if count > 1 else ''} x {args.slots}",
                     asyncio.run(through_server(args.tasks, args.batch, args.probes, count, args.slots,
                                                args.backlog, slow))))
    if args.json:
        print(json.dumps(dict(rows), indent=2))
        return
    print(f"{args.tasks} no-op tasks in batches of {args.batch}; {args.probes} high-priority probes")
    print(f"load average before: {load}")
    print(f"{'':<26} {'':>9} {'idle pool':>19} {'no-op backlog':>19} {'10 ms backlog':>19}")
    print(f"{'setup':<26} {'tasks/s':>9} {'p50':>9} {'p99':>9} {'p50':>9} {'p99':>9} {'p50':>9} {'p99':>9}")
    for name, row in rows:
        print(f"{name:<26} {row['rate']:>9.0f} " + " ".join(
            f"{row[f'{kind}_{q}']:>7.2f}ms" for kind in ("idle", "backlog", "slow") for q in ("p50", "p99")))


if __name__ == "__main__":
    main()
