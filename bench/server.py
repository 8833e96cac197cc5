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

Then the HTTP/JSON gateway beside the gRPC API of the same server (``--http``,
on by default), in ``--http-rounds`` rounds (3, a fresh server each; the
figures are their medians): ``--http-clients`` (8) client processes, each an
``httpx.Client`` on one HTTP/1.1 keep-alive connection (or a grpcio channel),
submit no-op tasks into a pool that no worker serves (so the figure is the
transport and admission), one per request (``--http-single`` in all) and in
batches of ``--http-batch`` (1,000; ``--http-batches`` batches in all):
tasks/s from the start signal to the last answer, and the server process's
CPU time per task (user + system, from /proc: what the transport and
admission cost, whatever else runs on the machine); which transport goes
first alternates between rounds. The httpx clients set TCP_NODELAY, as curl
and grpcio do. Then the latency of a submit with wait for a
no-op task run by one worker process, one request at a time, alternating
HTTP (``POST /v1/tasks`` with ``wait: true``) and gRPC (``Submit`` with
``wait``), ``--http-probes`` of each, p50 and p99. Targets (HTTP): >= 3,000
single submits/s and >= 30,000 tasks/s in batches of 1,000.

With ``--shards`` (alone), in ``--shard-rounds`` rounds (3; a fresh set of
servers each): an unsharded server and two shards (a: pool default; b: pools
gpu and idle) side by side; the server CPU per task of admitting ``--tasks``
tasks in batches into pool idle, sent to the unsharded server and to shard
b's own server (calls landing on the right shard: the target is within 1.1x),
and ``--probes`` single submits into pool idle sent to b and sent to a, which
forwards them (the added p50 is the forwarding cost: the target is < 2 ms).
The throughput of N shards projects from the CPU per task: each shard's
server does its own pools' work alone.

    python bench/server.py --shards [--tasks 20000] [--probes 200] [--shard-rounds 3]
    python bench/server.py [--tasks 20000] [--batch 500] [--probes 200] [--workers 1,4] [--backlog 5000]
                           [--http-single 20000] [--http-batches 200] [--http-probes 500] [--http-rounds 3]
                           [--no-grpc] [--no-http]

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
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cronoq  # noqa: E402

PROBE = b"probe"
SLOW = b"slow"    # a task of 10 ms on average (0 to 20 ms, so that slots do not free in waves)


# ---------------------------------------------------------------- worker processes


def worker_main(target: str, slots: int, pool: str = "default") -> None:
    from cronoq.client import Worker

    async def handle(lease):
        if lease.payload == PROBE:
            return time.monotonic()
        if lease.payload == SLOW:
            await asyncio.sleep(random.uniform(0.0, 0.02))
        return None

    async def main() -> None:
        worker = Worker(target, pool, handle, slots=slots, name=f"bench-{os.getpid()}", grace=1.0)
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


# ---------------------------------------------------------------- the HTTP gateway


def submit_client_main(transport: str, port: int, mode: str, count: int, batch: int) -> None:
    """One benchmark client: warm up, wait for "go" on stdin, send ``count``
    requests on one connection (HTTP/1.1 keep-alive, or one gRPC channel),
    print when it finished."""
    if transport == "grpc":
        import grpc

        from cronoq._proto import cronoq_pb2 as pb
        from cronoq._proto import cronoq_pb2_grpc as pb_grpc

        def spec(n: int) -> Any:
            return pb.TaskSpec(pool="sink", payload=json.dumps({"n": n}).encode(), content_type="application/json")

        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.TasksStub(channel)
        if mode == "single":
            message: Any = pb.SubmitRequest(task=spec(1))
            call = stub.Submit
        else:
            message = pb.SubmitBatchRequest(tasks=[spec(i) for i in range(batch)])
            call = stub.SubmitBatch
        call(message, timeout=120)
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(count):
            call(message, timeout=120)
        print(time.monotonic(), flush=True)
        channel.close()
        return
    import httpx

    headers = {"content-type": "application/json"}
    if mode == "single":
        body = json.dumps({"pool": "sink", "payload": {"n": 1}}).encode()
        path = "/v1/tasks"
    else:
        body = json.dumps({"tasks": [{"pool": "sink", "payload": {"n": i}} for i in range(batch)]}).encode()
        path = "/v1/tasks:batch"
    # TCP_NODELAY, as curl and grpcio set it: httpx writes a request's head and
    # body separately, and Nagle's algorithm would hold the body back.
    nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=nodelay, timeout=120) as client:
        assert client.post(path, content=body, headers=headers).status_code == 200
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(count):
            response = client.post(path, content=body, headers=headers)
            if response.status_code != 200:
                raise SystemExit(f"HTTP {response.status_code}: {response.text}")
        print(time.monotonic(), flush=True)


def _start_server(config_text: str, directory: str, args: tuple[str, ...] = ()
                  ) -> tuple[subprocess.Popen[str], int, int]:
    config = Path(directory) / "bench.toml"
    config.write_text(config_text)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config), *args],
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    assert server.stderr is not None
    while True:
        line = server.stderr.readline()
        if not line:
            raise RuntimeError("the server exited")
        match = re.search(r"listening: grpc [^ ]+:(\d+), http http://[^ ]+:(\d+)", line)
        if match:
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()   # drain the log
            return server, int(match.group(1)), int(match.group(2))


def _stop(children: list[subprocess.Popen[str]]) -> None:
    for child in reversed(children):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in reversed(children):
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _clients_rate(transport: str, port: int, server_pid: int, clients: int, mode: str, requests: int,
                  batch: int) -> tuple[float, float]:
    """Tasks per second submitted by ``clients`` client processes, ``requests``
    requests in all, and the server's CPU time per task (microseconds)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    each = max(1, requests // clients)
    procs = [subprocess.Popen([sys.executable, __file__, "--submit-client", transport, str(port), mode, str(each),
                               str(batch)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(clients)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        cpu = _cpu_seconds(server_pid)
        begin = time.monotonic()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        ends = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("a benchmark client failed")
            ends.append(float(line))
        tasks = each * clients * (batch if mode == "batch" else 1)
        return tasks / (max(ends) - begin), (_cpu_seconds(server_pid) - cpu) / tasks * 1e6
    finally:
        _stop(procs)


def _wait_latencies(http_port: int, grpc_port: int, probes: int) -> dict[str, float]:
    """Submit-with-wait latency of a no-op task over HTTP and over gRPC,
    alternating one probe of each, one request at a time."""
    import grpc
    import httpx

    from cronoq._proto import cronoq_pb2 as pb
    from cronoq._proto import cronoq_pb2_grpc as pb_grpc

    body = json.dumps({"payload": None, "wait": True, "wait_timeout_s": 30}).encode()
    headers = {"content-type": "application/json"}
    message = pb.SubmitRequest(task=pb.TaskSpec(payload=b"null", content_type="application/json"), wait=True,
                               wait_timeout_s=30)
    http_times: list[float] = []
    grpc_times: list[float] = []
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pb_grpc.TasksStub(channel)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=60) as client:
            deadline = time.monotonic() + 30
            while not client.get("/v1/workers").json()["workers"]:
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker did not connect")
                time.sleep(0.05)
            for i in range(probes + 20):
                t0 = time.perf_counter()
                response = client.post("/v1/tasks", content=body, headers=headers)
                took = time.perf_counter() - t0
                assert response.status_code == 200 and response.json()["result"]["status"] == "succeeded"
                time.sleep(0.002)
                t1 = time.perf_counter()
                answer = stub.Submit(message, timeout=60)
                grpc_took = time.perf_counter() - t1
                assert answer.result.status == pb.TASK_STATUS_SUCCEEDED
                time.sleep(0.002)
                if i >= 20:   # the first ones warm up
                    http_times.append(took)
                    grpc_times.append(grpc_took)
    finally:
        channel.close()
    return {**_percentiles(http_times, "http_wait"), **_percentiles(grpc_times, "grpc_wait")}


def through_http(clients: int, single: int, batches: int, batch: int, probes: int, rounds: int) -> dict[str, Any]:
    """The gateway and the gRPC API of the same server, side by side: each
    round starts a fresh server and measures single submits and batches over
    both (which goes first alternates between rounds), then the latency of a
    submit with wait. Figures: the median over the rounds, and each round."""
    config = ('[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 1\n'
              f'[limits]\nmax_tasks_per_batch = {max(batch, 1000)}\nmax_pending_total = 100000000\n'
              '[[pools]]\nname = "default"\n[[pools]]\nname = "sink"\n')
    figures: dict[str, list[float]] = {}
    for round_number in range(rounds):
        with tempfile.TemporaryDirectory() as directory:
            server, grpc_port, http_port = _start_server(config, directory)
            children = [server]
            try:
                ports = {"http": http_port, "grpc": grpc_port}
                order = ("http", "grpc") if round_number % 2 == 0 else ("grpc", "http")
                for mode, requests, size in (("single", single, 1), ("batch", batches, batch)):
                    for transport in order:
                        rate, cpu = _clients_rate(transport, ports[transport], server.pid, clients, mode,
                                                  requests, size)
                        figures.setdefault(f"{transport}_{mode}", []).append(rate)
                        figures.setdefault(f"{transport}_{mode}_cpu_us", []).append(cpu)
                env = dict(os.environ, PYTHONPATH=str(ROOT))
                children.append(subprocess.Popen([sys.executable, __file__, "--worker", f"127.0.0.1:{grpc_port}",
                                                  "--slots", "8"], env=env, stdout=subprocess.DEVNULL, text=True))
                for name, value in _wait_latencies(http_port, grpc_port, probes).items():
                    figures.setdefault(name, []).append(value)
            finally:
                _stop(children)
    out: dict[str, Any] = {name: statistics.median(values) for name, values in figures.items()}
    out["rounds"] = figures
    return out


# ---------------------------------------------------------------- shards


def _shard_config(ports: dict[str, int], shard: str | None) -> str:
    """Two shards (a: pool default, b: pools gpu and idle) or, without ``shard``, one server with every pool."""
    head = (f'[server]\ngrpc_addr = "127.0.0.1:{ports[shard] if shard else 0}"\nhttp_addr = "127.0.0.1:0"\n'
            f'shutdown_grace_s = 1\n[limits]\nmax_tasks_per_batch = 10000\n'
            '[[pools]]\nname = "default"\n[[pools]]\nname = "gpu"\n[[pools]]\nname = "idle"\n')
    if shard is None:
        return head
    return head + "".join(f'[[shards]]\nname = "{name}"\nnumber = {number}\npools = {pools}\n'
                          f'endpoint = "http://127.0.0.1:{ports[name]}"\n'
                          for name, number, pools in (("a", 1, '["default"]'), ("b", 2, '["gpu", "idle"]')))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _admission_cpu(target: str, pid: int, tasks: int, batch: int) -> float:
    """Server CPU microseconds per task admitted into pool idle (no worker: the admission path alone)."""
    from cronoq.client import Client

    async with Client(target) as client:
        await client.submit_batch([{"payload": b"", "pool": "idle"} for _ in range(batch)])   # warm up
        before = _cpu_seconds(pid)
        for start in range(0, tasks, batch):
            await client.submit_batch([{"payload": b"", "pool": "idle"} for _ in range(min(batch, tasks - start))])
        return (_cpu_seconds(pid) - before) / tasks * 1e6


async def _submit_latencies(target: str, probes: int) -> list[float]:
    from cronoq.client import Client

    async with Client(target) as client:
        await client.submit(b"", pool="idle")
        out = []
        for _ in range(probes):
            t0 = time.perf_counter()
            await client.submit(b"", pool="idle")
            out.append((time.perf_counter() - t0) * 1000)
        return out


def through_shards(tasks: int, batch: int, probes: int, rounds: int) -> dict[str, Any]:
    """Rounds of: an unsharded server's admission CPU per task beside shard b's for its own pool (calls
    landing on the right shard), and single submits into shard b's pool sent to b and sent to a (forwarded)."""
    figures: dict[str, list[float]] = {k: [] for k in ("plain_cpu", "shard_cpu", "direct_p50", "direct_p99",
                                                       "forwarded_p50", "forwarded_p99")}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as directory:
            ports = {"a": _free_port(), "b": _free_port()}
            plain, plain_grpc, _ = _start_server(_shard_config(ports, None), _dir(directory, "plain"))
            a, _, _ = _start_server(_shard_config(ports, "a"), _dir(directory, "a"), ("--shard", "a"))
            b, _, _ = _start_server(_shard_config(ports, "b"), _dir(directory, "b"), ("--shard", "b"))
            try:
                # Both servers warmed first, then measured in turn, alternating which goes first by round.
                pair = [("plain_cpu", f"127.0.0.1:{plain_grpc}", plain.pid), ("shard_cpu", f"127.0.0.1:{ports['b']}",
                                                                            b.pid)]
                for _, target, pid in pair:
                    asyncio.run(_admission_cpu(target, pid, tasks // 4, batch))
                for key, target, pid in (pair if len(figures["plain_cpu"]) % 2 == 0 else pair[::-1]):
                    figures[key].append(asyncio.run(_admission_cpu(target, pid, tasks, batch)))
                direct = asyncio.run(_submit_latencies(f"127.0.0.1:{ports['b']}", probes))
                forwarded = asyncio.run(_submit_latencies(f"127.0.0.1:{ports['a']}", probes))
                for name, values in (("direct", direct), ("forwarded", forwarded)):
                    q = statistics.quantiles(values, n=100)
                    figures[f"{name}_p50"].append(statistics.median(values))
                    figures[f"{name}_p99"].append(q[98])
            finally:
                _stop([plain, a, b])
    return {k: statistics.median(v) for k, v in figures.items()} | {"rounds": figures}


def _start_workers(target: str, pool: str, count: int, slots: int) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return [subprocess.Popen([sys.executable, __file__, "--worker", target, "--worker-pool", pool, "--slots",
                              str(slots)], env=env, stdout=subprocess.DEVNULL, text=True) for _ in range(count)]


async def _fleet_round(targets: dict[str, str], pids: list[int], tasks: int, batch: int) -> tuple[float, list[float]]:
    """``tasks`` no-op tasks, half into pool default and half into gpu, each
    batch sent to the server of its pool: tasks/s until all succeeded, and
    each server's CPU microseconds per task it ran."""
    from cronoq.client import Client

    clients = {pool: Client(target) for pool, target in targets.items()}
    try:
        first = next(iter(clients.values()))   # (a sharded server's snapshot sums every shard's)

        async def succeeded() -> int:
            return int((await first.snapshot())["totals"].get("succeeded", 0))

        workers_wanted = 4
        deadline = time.monotonic() + 60
        while len(await first.workers()) < workers_wanted:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not connect")
            await asyncio.sleep(0.05)
        base = await succeeded()
        cpu = [_cpu_seconds(pid) for pid in pids]
        begin = time.perf_counter()
        for start in range(0, tasks, batch):
            size = min(batch, tasks - start) // 2
            await asyncio.gather(*(clients[pool].submit_batch([{"payload": b"", "pool": pool}] * size)
                                   for pool in ("default", "gpu")))
        sent = 2 * sum(min(batch, tasks - start) // 2 for start in range(0, tasks, batch))
        while await succeeded() - base < sent:
            await asyncio.sleep(0.05)   # (rarely: a sharded snapshot asks every shard)
        rate = sent / (time.perf_counter() - begin)
        per_server = sent / len(pids)
        return rate, [(_cpu_seconds(pid) - before) / per_server * 1e6 for pid, before in zip(pids, cpu)]
    finally:
        for client in clients.values():
            await client.close()


def through_shard_fleets(tasks: int, batch: int, rounds: int, slots: int = 8) -> dict[str, Any]:
    """Rounds of: one server with 4 workers (2 per pool) beside two shards of 2 workers each, all x ``slots``:
    tasks/s and each server's CPU per task (a shard's: per task of its own)."""
    figures: dict[str, list[float]] = {k: [] for k in ("plain_rate", "plain_cpu", "sharded_rate", "a_cpu", "b_cpu")}
    for index in range(rounds):
        with tempfile.TemporaryDirectory() as directory:
            ports = {"a": _free_port(), "b": _free_port()}

            def plain_round() -> None:
                server, grpc_port, _ = _start_server(_shard_config(ports, None), _dir(directory, "plain"))
                target = f"127.0.0.1:{grpc_port}"
                children = [server, *_start_workers(target, "default", 2, slots), *_start_workers(target, "gpu", 2, slots)]
                try:
                    rate, cpu = asyncio.run(_fleet_round({"default": target, "gpu": target}, [server.pid], tasks,
                                                         batch))
                    figures["plain_rate"].append(rate)
                    figures["plain_cpu"].append(cpu[0])
                finally:
                    _stop(children)

            def sharded_round() -> None:
                a, _, _ = _start_server(_shard_config(ports, "a"), _dir(directory, "a"), ("--shard", "a"))
                b, _, _ = _start_server(_shard_config(ports, "b"), _dir(directory, "b"), ("--shard", "b"))
                ta, tb = f"127.0.0.1:{ports['a']}", f"127.0.0.1:{ports['b']}"
                children = [a, b, *_start_workers(ta, "default", 2, slots), *_start_workers(tb, "gpu", 2, slots)]
                try:
                    rate, (cpu_a, cpu_b) = asyncio.run(_fleet_round({"default": ta, "gpu": tb}, [a.pid, b.pid],
                                                                    tasks, batch))
                    figures["sharded_rate"].append(rate)
                    figures["a_cpu"].append(cpu_a)
                    figures["b_cpu"].append(cpu_b)
                finally:
                    _stop(children)

            for run in ((plain_round, sharded_round) if index % 2 == 0 else (sharded_round, plain_round)):
                run()
    return {k: statistics.median(v) for k, v in figures.items()} | {"rounds": figures}


def _dir(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    os.makedirs(path, exist_ok=True)
    return path


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
    parser.add_argument("--http-clients", type=int, default=8, help="httpx client processes (HTTP part)")
    parser.add_argument("--http-single", type=int, default=20_000, help="single submits over HTTP, in all")
    parser.add_argument("--http-batches", type=int, default=200, help="batches over HTTP, in all")
    parser.add_argument("--http-batch", type=int, default=1000, help="tasks per HTTP batch")
    parser.add_argument("--http-probes", type=int, default=500,
                        help="submits with wait=true, one at a time, per transport and round")
    parser.add_argument("--http-rounds", type=int, default=3, help="rounds of the HTTP/gRPC comparison (a fresh "
                                                                  "server each); the figures are their medians")
    parser.add_argument("--no-http", dest="http", action="store_false", help="skip the HTTP part")
    parser.add_argument("--no-grpc", dest="grpc", action="store_false",
                        help="skip the in-process and gRPC part")
    parser.add_argument("--worker", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--worker-pool", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--submit-client", nargs=5, metavar=("TRANSPORT", "PORT", "MODE", "COUNT", "BATCH"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--shards", action="store_true",
                        help="only the sharded part: admission CPU per task of a shard's server for its own pool "
                             "beside an unsharded server's, and the latency a forwarded submit adds")
    parser.add_argument("--shard-rounds", type=int, default=3)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.slots, args.worker_pool)
        return
    if args.submit_client:
        transport, port, mode, count, batch = args.submit_client
        submit_client_main(transport, int(port), mode, int(count), int(batch))
        return
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    if args.shards:
        f = through_shards(args.tasks, args.batch, args.probes, args.shard_rounds)
        print(f"load average before: {load}; median of {args.shard_rounds} rounds (min-max)")
        r = f["rounds"]

        def spread(key: str, unit: str) -> str:
            return f"{f[key]:.2f} {unit} ({min(r[key]):.2f}-{max(r[key]):.2f})"

        print(f"admission CPU per task, unsharded server: {spread('plain_cpu', 'us')}")
        print(f"admission CPU per task, shard b, own pool: {spread('shard_cpu', 'us')}   "
              f"ratio {f['shard_cpu'] / f['plain_cpu']:.3f} (target <= 1.1)")
        print(f"single submit to shard b directly: p50 {spread('direct_p50', 'ms')}, p99 {spread('direct_p99', 'ms')}")
        print(f"single submit via shard a (forwarded): p50 {spread('forwarded_p50', 'ms')}, "
              f"p99 {spread('forwarded_p99', 'ms')}")
        print(f"added by forwarding: p50 {f['forwarded_p50'] - f['direct_p50']:.2f} ms (target < 2), "
              f"p99 {f['forwarded_p99'] - f['direct_p99']:.2f} ms")
        g = through_shard_fleets(args.tasks, args.batch, args.shard_rounds, args.slots)
        f, r = g, g["rounds"]
        print(f"{args.tasks} no-op tasks, half per pool, each batch to its pool's server; {args.slots} slots "
              f"per worker")
        print(f"one server, 4 workers: {spread('plain_rate', 'tasks/s')}, CPU per task {spread('plain_cpu', 'us')}")
        print(f"two shards, 2 workers each: {spread('sharded_rate', 'tasks/s')}, CPU per task of its own: "
              f"a {spread('a_cpu', 'us')}, b {spread('b_cpu', 'us')}")
        per_shard = max(g["a_cpu"], g["b_cpu"])
        # A server runs on one core (one asyncio loop): its CPU per task bounds what it can serve.
        print(f"shard CPU per task / unsharded: {per_shard / g['plain_cpu']:.3f}; server-bound ceiling, each "
              f"server on a core of its own: one server {1e6 / g['plain_cpu']:.0f} tasks/s, N shards "
              f"N x {1e6 / per_shard:.0f} tasks/s")
        return
    slow = max(args.batch, args.backlog // 3)
    rows = []
    if args.grpc:
        rows.append(("in-process, 32 slots", asyncio.run(in_process(args.tasks, args.batch, args.probes,
                                                                     args.backlog, slow))))
        for count in (int(w) for w in args.workers.split(",")):
            rows.append((f"server, {count} worker{'s' if count > 1 else ''} x {args.slots}",
                         asyncio.run(through_server(args.tasks, args.batch, args.probes, count, args.slots,
                                                    args.backlog, slow))))
    http = (through_http(args.http_clients, args.http_single, args.http_batches, args.http_batch,
                         args.http_probes, args.http_rounds) if args.http else None)
    if args.json:
        print(json.dumps({**dict(rows), **({"http": http} if http else {})}, indent=2))
        return
    print(f"load average before: {load}")
    if rows:
        print(f"{args.tasks} no-op tasks in batches of {args.batch}; {args.probes} high-priority probes")
        print(f"{'':<26} {'':>9} {'idle pool':>19} {'no-op backlog':>19} {'10 ms backlog':>19}")
        print(f"{'setup':<26} {'tasks/s':>9} {'p50':>9} {'p99':>9} {'p50':>9} {'p99':>9} {'p50':>9} {'p99':>9}")
        for name, row in rows:
            print(f"{name:<26} {row['rate']:>9.0f} " + " ".join(
                f"{row[f'{kind}_{q}']:>7.2f}ms" for kind in ("idle", "backlog", "slow") for q in ("p50", "p99")))
    if http:
        print(f"HTTP gateway and gRPC API of one server, {args.http_clients} client processes (httpx on HTTP/1.1 "
              f"keep-alive; a grpcio channel each); median of {args.http_rounds} rounds (each round's figures)")
        print(f"{'':<28} {'HTTP':>9} {'gRPC':>9} {'HTTP/gRPC':>10}")
        for mode, label, target in (("single", "single submits, tasks/s", "3,000"),
                                    ("batch", f"batches of {args.http_batch}, tasks/s", "30,000")):
            h, g = http[f"http_{mode}"], http[f"grpc_{mode}"]
            each = " / ".join(f"{a:.0f}:{b:.0f}" for a, b in zip(http["rounds"][f"http_{mode}"],
                                                               http["rounds"][f"grpc_{mode}"]))
            print(f"{label:<28} {h:>9.0f} {g:>9.0f} {h / g:>10.2f}   (HTTP target {target}; rounds {each})")
            h, g = http[f"http_{mode}_cpu_us"], http[f"grpc_{mode}_cpu_us"]
            print(f"{'  server CPU per task, us':<28} {h:>9.1f} {g:>9.1f} {h / g:>10.2f}")
        for q in ("p50", "p99"):
            h, g = http[f"http_wait_{q}"], http[f"grpc_wait_{q}"]
            print(f"{'submit with wait, ' + q + ', ms':<28} {h:>9.2f} {g:>9.2f} {h / g:>10.2f}")
        print(f"  (wait: {args.http_probes} no-op tasks per transport and round, one worker process, one at a time)")


if __name__ == "__main__":
    main()
