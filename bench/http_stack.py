"""Which HTTP stack for cronoq-server's gateway: the server's CPU per request.

The gateway runs in the scheduler's event loop, so every microsecond the HTTP
stack spends on a request is taken from the scheduler. Three parts, in one run:

1. **The parser alone**, in this process: one typical request (``POST
   /v1/tasks`` with eight header fields and a small JSON body; and the same
   with a chunked body) parsed ``--parses`` times by the hand-written parser
   cronoq-server used until 7d8fb0c (``handwritten``, kept here as it was: it
   accepted request-smuggling inputs), by llhttp through httptools with the
   callbacks the listener uses (``httptools``), and by h11. Microseconds per
   request, median of ``--rounds`` with min and max, and the ratio to the
   hand-written parser.
2. **The same small JSON route on three stacks**, each in its own server
   process with one asyncio loop: ``lean`` (``cronoq.server.http.HttpListener``,
   what cronoq-server uses), ``uvicorn`` (with httptools, a bare ASGI app),
   ``starlette`` (uvicorn with a Starlette route: a framework).
3. **The gateway's single submits**: a real ``cronoq-server`` (in memory, no
   authentication, a pool no worker serves: the figure is the transport and
   admission), ``POST /v1/tasks`` one task per request. With ``--compare REF``
   the same runs against the server of git commit REF (a temporary worktree),
   alternating which goes first, so a change is measured before and after in
   one run.

For 2 and 3, ``--clients`` client processes (httpx, one keep-alive connection
each, with TCP_NODELAY) send ``--requests`` requests in all; figures: the
server process's CPU time per request (user + system, from /proc), and
requests/s, the median of ``--rounds`` rounds with min and max. uvicorn and
starlette are not dependencies of cronoq: ``pip install uvicorn[standard]
starlette`` to run those rows (missing ones are skipped).

    python bench/http_stack.py [--requests 6000] [--clients 4] [--rounds 5] [--parses 20000]
                               [--compare 7d8fb0c] [--only parsers,stacks,gateway]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
STACKS = ("lean", "uvicorn", "starlette")
ANSWER = b'{"id":"1","duplicate":false}'
BODY = json.dumps({"pool": "sink", "payload": {"n": 1}}).encode()
REQUEST = (b"POST /v1/tasks HTTP/1.1\r\nhost: 127.0.0.1:7071\r\naccept: */*\r\naccept-encoding: gzip, deflate\r\n"
           b"connection: keep-alive\r\nuser-agent: python-httpx/0.28.1\r\n"
           b"authorization: Bearer client-token-0123456789abcdef0123\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))
CHUNKED = (REQUEST.partition(b"content-length")[0] + b"transfer-encoding: chunked\r\n\r\n"
           + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------- 1. the parser alone


def handwritten(data: bytes) -> tuple[str, str, dict[str, str], bytes]:
    """The parser of cronoq-server until 7d8fb0c (its head and body framing),
    as it was: the baseline of the parser rows, not for use."""
    end = data.find(b"\r\n\r\n")
    text = data[:end].decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise ValueError("malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0") or not target.startswith("/") or len(lines) - 1 > 100:
        raise ValueError("malformed request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise ValueError("malformed header field")
        name = name.lower()
        value = value.strip(" \t")
        if name in headers:
            if name in ("content-length", "host", "authorization", "content-type", "transfer-encoding"):
                raise ValueError(f"the {name} header is given more than once")
            headers[name] += ", " + value
        else:
            headers[name] = value
    rest = bytearray(data[end + 4:])
    if "transfer-encoding" in headers:
        body = bytearray()
        while True:
            line_end = rest.find(b"\r\n")
            size = int(bytes(rest[:line_end]).partition(b";")[0].strip(), 16)
            if size == 0:
                break
            start = line_end + 2
            body += rest[start:start + size]
            del rest[:start + size + 2]
        return method, target, headers, bytes(body)
    length = headers.get("content-length", "0")
    if not length.isdigit():
        raise ValueError("invalid content-length")
    return method, target, headers, bytes(rest[:int(length)])


class _Collect:
    """The callbacks cronoq.server.http's connection gives llhttp, doing the same work."""

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.done: tuple[str, dict[str, str], bytes] | None = None

    def on_message_begin(self) -> None:
        self.url = b""
        self.fields = []
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        headers: dict[str, str] = {}
        for name, value in self.fields:
            key = name.lower().decode("ascii")
            if key in headers:
                headers[key] += ", " + value.decode("latin-1")
            else:
                headers[key] = value.decode("latin-1")
        self.headers = headers

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = (self.url.decode("latin-1"), self.headers, b"".join(self.body))


def parse_h11(data: bytes) -> tuple[dict[str, str], bytes]:
    import h11

    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    event = conn.next_event()
    assert isinstance(event, h11.Request)
    headers = {name.decode("ascii"): value.decode("latin-1") for name, value in event.headers}
    body = b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return headers, body


def parsers(count: int, rounds: int) -> None:
    import httptools

    try:
        import h11  # noqa: F401
        with_h11 = True
    except ImportError:
        with_h11 = False
    for name, data in (("content-length", REQUEST), ("chunked", CHUNKED)):
        collect = _Collect()
        parser = httptools.HttpRequestParser(collect)   # one per connection, reused for each request

        def with_httptools(data: bytes = data) -> Any:
            parser.feed_data(data)
            return collect.done

        runs: dict[str, Callable[[], Any]] = {"handwritten": lambda: handwritten(data), "httptools": with_httptools}
        if with_h11:
            runs["h11"] = lambda: parse_h11(data)
        assert handwritten(data)[3] == BODY and with_httptools()[2] == BODY
        timings: dict[str, list[float]] = {key: [] for key in runs}
        for _ in range(rounds):
            for key, run in runs.items():
                begin = time.perf_counter()
                for _ in range(count):
                    run()
                timings[key].append((time.perf_counter() - begin) / count * 1e6)
        base = statistics.median(timings["handwritten"])
        print(f"the parser alone, one {len(data)}-byte request ({name}), {count} parses, median (min-max) of "
              f"{rounds} rounds:")
        for key, values in timings.items():
            median = statistics.median(values)
            print(f"  {key:<12} {median:7.2f} us/request ({min(values):.2f}-{max(values):.2f})"
                  f"   {median / base:5.2f}x the hand-written parser")


# ---------------------------------------------------------------- 2. and 3. servers


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

            def admit(self, request: Request) -> Response | None:
                return None

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

    headers = {"content-type": "application/json"}
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=transport, timeout=60) as http:
        for _ in range(20):
            assert http.post("/v1/tasks", content=BODY, headers=headers).status_code == 200
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(count):
            http.post("/v1/tasks", content=BODY, headers=headers)
        print("done", flush=True)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


GATEWAY_CONFIG = """
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:%d"
[[pools]]
name = "default"
[[pools]]
name = "sink"
"""


def _start_server(stack: str, port: int, tree: Path, scratch: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    if stack.startswith("gateway"):
        import httpx

        config = scratch / f"gateway-{port}.toml"
        config.write_text(GATEWAY_CONFIG % port)
        server = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config),
                                   "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  text=True, env=env, cwd=tree)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"{stack}: the server did not become ready")
            time.sleep(0.05)
    server = subprocess.Popen([sys.executable, __file__, "--serve", stack, str(port)], stdout=subprocess.PIPE,
                              text=True, env=env)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


def measure(stack: str, requests: int, clients: int, tree: Path, scratch: Path) -> tuple[float, float]:
    """(server CPU microseconds per request, requests per second)."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = _start_server(stack, port, tree, scratch)
    procs: list[subprocess.Popen[str]] = []
    try:
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


def _report(title: str, results: dict[str, list[tuple[float, float]]], base: str | None) -> None:
    print(title)
    print(f"  {'':<22} {'server CPU/request, us':>24} {'requests/s':>24}")
    base_rate = statistics.median(r[1] for r in results[base]) if base in results else None
    for stack, rows in results.items():
        cpus = [r[0] for r in rows]
        rates = [r[1] for r in rows]
        cpu, rate = statistics.median(cpus), statistics.median(rates)
        ratio = f"   {rate / base_rate:.3f}x {base}" if base_rate and stack != base else ""
        print(f"  {stack:<22} {cpu:8.0f} ({min(cpus):.0f}-{max(cpus):.0f}) {rate:12.0f} "
              f"({min(rates):.0f}-{max(rates):.0f}){ratio}")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=ROOT).stdout
    return head.strip() + (" with uncommitted changes" if dirty.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parses", type=int, default=20000)
    parser.add_argument("--compare", metavar="REF", help="also run the gateway of this git commit (before/after)")
    parser.add_argument("--only", default="parsers,stacks,gateway", help="which parts, comma-separated")
    parser.add_argument("--serve", nargs=2, metavar=("STACK", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=2, metavar=("PORT", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.client:
        client(int(args.client[0]), int(args.client[1]))
        return
    parts = set(args.only.split(","))
    print(f"commit {_commit()}; load average before: {_load()}")
    if "parsers" in parts:
        parsers(args.parses, args.rounds)
    with tempfile.TemporaryDirectory(prefix="cronoq-http-stack-") as scratch_dir:
        scratch = Path(scratch_dir)
        if "stacks" in parts:
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
                    results[stack].append(measure(stack, args.requests, args.clients, ROOT, scratch))
            _report(f"{args.requests} POSTs of a small JSON object from {args.clients} httpx clients, "
                    f"median (min-max) of {args.rounds} rounds:", results, "lean")
        if "gateway" in parts:
            trees = {"gateway": ROOT}
            worktree = None
            if args.compare:
                worktree = scratch / "compare"
                subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), args.compare], cwd=ROOT,
                               check=True)
                trees[f"gateway@{args.compare}"] = worktree
            try:
                gateway: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
                for round_ in range(args.rounds):
                    order = list(trees.items())
                    if round_ % 2:
                        order.reverse()   # neither goes first every time
                    for name, tree in order:
                        gateway[name].append(measure(name, args.requests, args.clients, tree, scratch))
                _report(f"cronoq-server's gateway: {args.requests} single submits (POST /v1/tasks) from "
                        f"{args.clients} httpx clients, median (min-max) of {args.rounds} rounds:", gateway,
                        f"gateway@{args.compare}" if args.compare else None)
            finally:
                if worktree is not None:
                    subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)
    print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
