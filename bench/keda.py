"""KEDA's external scaler on cronoq-server: the latency of GetMetrics.

A ``cronoq-server`` process (in memory, with tokens) on loopback with
``--pools`` pools (8); pool ``default`` autoscales and holds ``--pending``
(10,000) tasks that no worker serves, so its autoscaler asks for slots and
the snapshot the answer is read from is not empty. One client in this
process, on one grpcio channel, calls as KEDA's operator does: the metrics
token in the trigger's metadata (``scalerMetadata["token"]``), one call at a
time, ``--calls`` (500) GetMetrics, then as many IsActive, and as a
reference Admin.Snapshot (every pool) with the same token as a bearer
header, after 50 untimed calls of each. Figures: median and p99 per call,
with the load average of the machine before and after. Target: GetMetrics
p99 < 10 ms.

    python bench/keda.py [--calls 500] [--pending 10000] [--pools 8]

The server is a child process, stopped by pid at the end. The machine is
shared and noisy: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKEN = "bench-metrics-token-0123456789abcdef"
CLIENT_TOKEN = "bench-client-token-0123456789abcdef"


def _config(pools: int) -> str:
    text = f"""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
[[auth.tokens]]
token = "{TOKEN}"
role = "metrics"
[[auth.tokens]]
token = "{CLIENT_TOKEN}"
role = "client"
[[pools]]
name = "default"
max = 256
autoscale = {{ interval_s = 0.5 }}
"""
    for i in range(1, pools):
        text += f'[[pools]]\nname = "pool-{i}"\n'
    return text


def _start(config_text: str, directory: str) -> tuple[subprocess.Popen[str], int]:
    config = Path(directory) / "keda.toml"
    config.write_text(config_text)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config)],
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    assert server.stderr is not None
    while True:
        line = server.stderr.readline()
        if not line:
            raise RuntimeError("the server exited")
        match = re.search(r"listening: grpc [^ ]+:(\d+)", line)
        if match:
            # (the log drained on a thread)
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return server, int(match.group(1))


def _stop(server: subprocess.Popen[str]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


async def _timed(call: Callable[[], Awaitable[Any]], calls: int) -> list[float]:
    for _ in range(50):
        await call()
    took = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        took.append(time.perf_counter() - start)
    return took


def _row(name: str, took: list[float]) -> str:
    ordered = sorted(took)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{name:<34} {statistics.median(took) * 1000:8.2f} ms {p99 * 1000:8.2f} ms"


async def run(target: str, calls: int, pending: int) -> list[str]:
    import grpc

    from cronoq._proto import cronoq_pb2 as pb
    from cronoq._proto import cronoq_pb2_grpc as pb_grpc
    from cronoq._proto import externalscaler_pb2 as es
    from cronoq._proto import externalscaler_pb2_grpc as es_grpc

    async with grpc.aio.insecure_channel(target) as channel:
        tasks, admin = pb_grpc.TasksStub(channel), pb_grpc.AdminStub(channel)
        scaler = es_grpc.ExternalScalerStub(channel)
        for start in range(0, pending, 1000):
            keys = range(start, min(pending, start + 1000))
            batch = pb.SubmitBatchRequest(tasks=[pb.TaskSpec(key=f"t{i}") for i in keys])
            await tasks.SubmitBatch(batch, metadata=(("authorization", f"Bearer {CLIENT_TOKEN}"),))
        ref = es.ScaledObjectRef(name="workers", namespace="jobs",
                                 scalerMetadata={"pool": "default", "slotsPerReplica": "4", "token": TOKEN})
        request = es.GetMetricsRequest(scaledObjectRef=ref, metricName="cronoq-default-desired")
        deadline = time.monotonic() + 30
        async def desired() -> int:
            return int((await scaler.GetMetrics(request)).metricValues[0].metricValue)

        while await desired() <= 1 and time.monotonic() < deadline:   # the autoscaler asks
            await asyncio.sleep(0.1)
        bearer = (("authorization", f"Bearer {TOKEN}"),)
        return [f"desired slots of pool default: {await desired()} ({pending} pending)",
                _row("GetMetrics (token in metadata)",
                     await _timed(lambda: scaler.GetMetrics(request), calls)),
                _row("IsActive (token in metadata)", await _timed(lambda: scaler.IsActive(ref), calls)),
                _row("Admin.Snapshot (reference)", await _timed(
                    lambda: admin.Snapshot(pb.SnapshotRequest(), metadata=bearer), calls))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--pools", type=int, default=8)
    args = parser.parse_args()
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        server, port = _start(_config(args.pools), directory)
        try:
            rows = asyncio.run(run(f"127.0.0.1:{port}", args.calls, args.pending))
        finally:
            _stop(server)
    after = os.getloadavg()
    print(f"{args.calls} calls each, one at a time; load average {before[0]:.2f} before, "
          f"{after[0]:.2f} after ({os.cpu_count()} CPUs)")
    print(f"{'call':<34} {'median':>11} {'p99':>11}")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
