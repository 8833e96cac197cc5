"""Which HTTP stack for cronoq-server's gateway: the server's CPU per request.

The gateway runs in the scheduler's event loop, so every microsecond the HTTP
stack spends on a request is taken from the scheduler. This measures that
cost for the same small JSON route (parse a JSON object body, answer a JSON
object) on three stacks, each in its own server process with one asyncio
loop:

- ``lean``: ``cronoq.server.http.HttpListener`` (what cronoq-server uses);
- ``uvicorn``: uvicorn with httptools and a bare ASGI application;
- ``starlette``: uvicorn with httptools and a Starlette route (a framework).

``--clients`` client processes (httpx, one keep-alive connection each, with
TCP_NODELAY) send ``--requests`` requests in all; figures: the server
process's CPU time per request (user + system, from /proc), and requests/s.
Alternating rounds (``--rounds``); the medians are printed. uvicorn and
starlette are not dependencies of cronoq: ``pip install uvicorn[standard]
starlette`` to run those rows (missing ones are skipped).

    python bench/http_stack.py [--requests 6000] [--clients 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STACKS = ("lean", "uvicorn", "starlette")
ANSWER = b'{"id":"1","duplicate":false}'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(stack: str, port: int) -> None:
    """Run one server until SIGTERM."""
    if stack == "lean":
        import asyncio
        import signal

        from cronoq.server.http import HttpListener, Request, Response

        class App:
            max_body = 1 << 20

            def time_limit(self, request: Request) -> float:
                return 30.0

            def error(self, status: int, message: str, *, close: bool = False) -> Response:
                return Response(status, json.dumps({"error": message}).encode(), close=close)

            def closing(self) -> bool:
                return False

            async def __call__(self, request: Request) -> Response:
                json.loads(request.body)
                return Response(200, ANSWER)

        async def main() -> None:
            listener = HttpListener("127.0.0.1", port, App())
            await listener.start()
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            print("ready", flush=True)
            await stop.wait()
            await listener.stop()

        asyncio.run(main())
        return
    import uvicorn

    app: Any
    if stack == "uvicorn":
        async def bare(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            json.loads(body)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": ANSWER})
        app = bare
    else:
        from starlette.applications import Starlette
        from starlette.requests import Request as StarletteRequest
        from starlette.responses import Response as StarletteResponse
        from starlette.routing import Route

        async def submit(request: StarletteRequest) -> StarletteResponse:
            await request.json()
            return StarletteResponse(ANSWER, media_type="application/json")
        app = Starlette(routes=[Route("/v1/tasks", submit, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="asyncio", http="httptools", lifespan="off",
                            log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    async def main_uvicorn() -> None:
        import asyncio
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        await task

    import asyncio
    asyncio.run(main_uvicorn())


def client(port: int, count: int) -> None:
    import httpx

    body = json.dumps({"pool": "sink", "payload": {"n": 1}}).encode()
    headers = {"content-type": "application/json"}
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=transport, timeout=60) as http:
        for _ in range(20):
            assert http.post("/v1/tasks", content=body, headers=headers).status_code == 200
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(count):
            http.post("/v1/tasks", content=body, headers=headers)
        print("done", flush=True)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(stack: str, requests: int, clients: int) -> tuple[float, float]:
    """(server CPU microseconds per request, requests per second)."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen([sys.executable, __file__, "--serve", stack, str(port)], stdout=subprocess.PIPE,
                              text=True, env=env)
    procs: list[subprocess.Popen[str]] = []
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        each = requests // clients
        procs = [subprocess.Popen([sys.executable, __file__, "--client", str(port), str(each)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env) for _ in range(clients)]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        cpu = _cpu_seconds(server.pid)
        begin = time.monotonic()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        took = time.monotonic() - begin
        used = _cpu_seconds(server.pid) - cpu
        return used / (each * clients) * 1e6, each * clients / took
    finally:
        for proc in [*procs, server]:
            proc.terminate()
        for proc in [*procs, server]:
            proc.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, metavar=("STACK", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=2, metavar=("PORT", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.client:
        client(int(args.client[0]), int(args.client[1]))
        return
    stacks = []
    for stack in STACKS:
        try:
            if stack != "lean":
                __import__("uvicorn")
                __import__("httptools")
            if stack == "starlette":
                __import__("starlette")
            stacks.append(stack)
        except ImportError:
            print(f"{stack}: skipped (not installed)")
    results: dict[str, list[tuple[float, float]]] = {stack: [] for stack in stacks}
    for _ in range(args.rounds):
        for stack in stacks:
            results[stack].append(measure(stack, args.requests, args.clients))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"{args.requests} POSTs of a small JSON object from {args.clients} httpx clients, "
          f"median of {args.rounds} rounds; load average after: {load}")
    print(f"{'stack':<12} {'server CPU/request':>20} {'requests/s':>12}   rounds (us/request)")
    for stack, rows in results.items():
        cpu = statistics.median(r[0] for r in rows)
        rate = statistics.median(r[1] for r in rows)
        print(f"{stack:<12} {cpu:>17.0f} us {rate:>12.0f}   " + " / ".join(f"{r[0]:.0f}" for r in rows))


if __name__ == "__main__":
    main()
