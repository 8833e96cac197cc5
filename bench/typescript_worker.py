"""The TypeScript worker (clients/typescript) beside the Python worker, on the same server.

For each round, one ``cronoq-server`` process (in memory, no auth) on
loopback; in it, for each worker count W (``--workers``, 1 and 4) and each
kind of worker (the order alternates between rounds), W worker processes with
``--slots`` (8) slots each serve pool ``default`` with a no-op handler: the
Python ones are ``cronoq.client.Worker`` (an ``async def`` handler returning
None), the TypeScript ones ``runWorker`` from the built package
(bench/typescript_noop_worker.mjs, a handler returning null). The client in
this process submits ``--tasks`` empty tasks in batches of ``--batch``
through SubmitBatch and polls the snapshot's ``succeeded`` total every 20 ms;
the figure is tasks/s from the first batch to the last completion. The
workers are then stopped by pid and the next setup starts.

Figures: the median (min-max) of the ``--rounds`` rounds (5). The machine is
shared and noisy: compare the rows of one run.

    python bench/typescript_worker.py [--tasks 20000] [--batch 500] [--workers 1,4] [--slots 8] [--rounds 5]

It needs Node 20 and the package built: ``cd clients/typescript && npm ci &&
npm run build`` (it runs the build itself when node_modules is there but
dist is not).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PACKAGE = ROOT / "clients" / "typescript"
TS_WORKER = Path(__file__).resolve().parent / "typescript_noop_worker.mjs"
KINDS = ("python", "typescript")

# SIGTERM drains it (Worker.run handles the signal).
PYTHON_WORKER = r"""
import asyncio, sys
from cronoq.client import Worker

async def noop(lease):
    return None

asyncio.run(Worker(sys.argv[1], "default", noop, slots=int(sys.argv[2]), name="python-bench").run())
"""


def _ensure_built() -> None:
    if shutil.which("node") is None:
        raise SystemExit("node is not installed: the TypeScript worker needs Node 20 (apt-get install -y nodejs npm)")
    if (PACKAGE / "dist" / "index.js").exists():
        return
    if not (PACKAGE / "node_modules").exists():
        raise SystemExit("the TypeScript package is not installed: cd clients/typescript && npm ci && npm run build")
    subprocess.run(["npm", "run", "build"], cwd=PACKAGE, check=True, stdout=subprocess.DEVNULL)


def _start_server(directory: str) -> tuple[subprocess.Popen[str], str]:
    config = Path(directory) / "bench.toml"
    config.write_text('[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 1\n'
                      '[limits]\nmax_tasks_per_batch = 10000\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("CRONOQ_CONFIG", None)
    server = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config)],
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    assert server.stderr is not None
    while True:
        line = server.stderr.readline()
        if not line:
            raise RuntimeError("the server exited before it listened")
        match = re.search(r"listening: grpc [^ ]+:(\d+)", line)
        if match:
            stream = server.stderr
            threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()   # drain the log
            return server, f"127.0.0.1:{match.group(1)}"


def _start_workers(kind: str, target: str, count: int, slots: int) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if kind == "python":
        command = [sys.executable, "-c", PYTHON_WORKER, target, str(slots)]
    else:
        command = ["node", str(TS_WORKER), target, str(slots)]
    return [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
            for _ in range(count)]


def _stop(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


async def _throughput(target: str, kind: str, workers: int, slots: int, tasks: int, batch: int) -> float:
    from cronoq.client import Client

    children = _start_workers(kind, target, workers, slots)
    try:
        async with Client(target) as client:
            deadline = time.monotonic() + 30
            while len(await client.workers()) < workers:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {kind} workers did not connect")
                if any(child.poll() is not None for child in children):
                    raise RuntimeError(f"a {kind} worker exited before it connected")
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
            # The next setup starts with no worker of this one connected.
            _stop(children)
            deadline = time.monotonic() + 30
            while await client.workers():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {kind} workers did not leave")
                await asyncio.sleep(0.05)
            return rate
    finally:
        _stop(children)


async def run(tasks: int, batch: int, worker_counts: list[int], slots: int, rounds: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    for number in range(rounds):
        kinds = KINDS if number % 2 == 0 else KINDS[::-1]
        with tempfile.TemporaryDirectory() as directory:
            server, target = _start_server(directory)
            try:
                for workers in worker_counts:
                    for kind in kinds:
                        rate = await _throughput(target, kind, workers, slots, tasks, batch)
                        figures.setdefault(f"{kind}, {workers} x {slots} slots", []).append(rate)
                        print(f"round {number + 1}: {kind}, {workers} x {slots} slots: {rate:,.0f} tasks/s",
                              file=sys.stderr, flush=True)
            finally:
                _stop([server])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--workers", default="1,4", help="worker counts, comma-separated")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    _ensure_built()
    counts = [int(part) for part in args.workers.split(",") if part]
    figures = asyncio.run(run(args.tasks, args.batch, counts, args.slots, args.rounds))
    print(f"no-op tasks through cronoq-server, {args.tasks} tasks a setup, median (min-max) of {args.rounds} rounds")
    print(f"{'setup':<34} tasks/s: median (min-max)")
    for name, values in figures.items():
        print(f"{name:<34} {statistics.median(values):>10,.0f} ({min(values):,.0f}-{max(values):,.0f})")


if __name__ == "__main__":
    main()
