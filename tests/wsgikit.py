"""Real WSGI servers for the tests of many processes (tests/test_wsgi_servers.py)
and the benchmark (bench/wsgi.py): start one on a free loopback port, drive
bounded load with retried keys, read the execution log the app's handler
writes, stop what was started (by pid, never by name)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPS = os.path.join(REPO, "tests", "wsgi_apps")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process (and its children: its own process group)."""

    def __init__(self, argv: list[str], *, env: dict[str, str], port: int, cwd: str, log_path: str) -> None:
        self.argv = argv
        self.port = port
        self.log_path = log_path          # the execution log
        self.out_path = os.path.join(os.path.dirname(log_path), f"server-{port}.out")
        self._out = open(self.out_path, "wb")
        full_env = dict(os.environ, **env)
        full_env["PYTHONPATH"] = os.pathsep.join([APPS, REPO, os.environ.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        with open(self.out_path, "rb") as f:
            return f.read().decode(errors="replace")

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path, headers={"Connection": "close"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited ({self.proc.returncode}):\n{self.output()[-3000:]}")
            try:
                status, _ = self.get("/whoami", timeout=5)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the server did not answer within {timeout} s:\n{self.output()[-3000:]}")

    def whoami(self, tries: int = 40) -> dict[int, bool]:
        """pid -> leading, for the processes that answered ``tries`` requests."""
        seen: dict[int, bool] = {}
        for _ in range(tries):
            try:
                status, body = self.get("/whoami", timeout=10)
            except OSError:
                continue
            if status == 200:
                data = json.loads(body)
                seen[data["pid"]] = data["leading"]
        return seen

    def leader(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [pid for pid, leading in self.whoami(10).items() if leading]
            if leaders:
                return leaders[0]
            time.sleep(0.1)
        raise AssertionError("no process leads")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the server and wait for it; then kill what is left of its group."""
        self.signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = -999
        self.kill_group()
        self._out.close()
        return code

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # the group this test started (its own session)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def gunicorn(tmp: str, app: str, *, workers: int = 2, threads: int = 8, preload: bool = False,
             max_requests: int = 0, env: dict[str, str], conf: str | None = None) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", "-k", "gthread", "-w", str(workers), "--threads", str(threads),
            "-b", f"127.0.0.1:{port}", "--graceful-timeout", "20", "--timeout", "60", "--log-level", "warning"]
    if preload:
        argv.append("--preload")
    if max_requests:
        argv += ["--max-requests", str(max_requests), "--max-requests-jitter", str(max(1, max_requests // 4))]
    if conf is not None:
        argv += ["-c", conf]
    argv.append(app)
    return Server(argv, env=env, port=port, cwd=tmp, log_path=env["APP_LOG"])


def waitress(tmp: str, app: str, *, threads: int = 8, env: dict[str, str]) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "waitress", f"--listen=127.0.0.1:{port}", f"--threads={threads}", app]
    return Server(argv, env=env, port=port, cwd=tmp, log_path=env["APP_LOG"])


@dataclass
class Load:
    """What a bounded load saw: acknowledged keys, failures, hangs."""

    acked: dict[str, int] = field(default_factory=dict)     # key -> task id
    answers: dict[str, set[int]] = field(default_factory=dict)   # key -> every id it was answered with
    failures: list[str] = field(default_factory=list)
    hangs: int = 0
    by_pid: dict[int, int] = field(default_factory=dict)     # which process answered
    requests: int = 0


def drive(server: Server, keys: list[str], *, clients: int = 8, retried: float = 0.25, timeout: float = 30.0,
          tries: int = 6, during: Any = None, at: int | None = None) -> Load:
    """Send every key (a quarter of them twice: "retried keys"), from
    ``clients`` threads, each request bounded by ``timeout``; a failed request
    is retried (up to ``tries``). ``during()`` runs once ``at`` keys were sent."""
    load = Load()
    lock = threading.Lock()
    plan = list(keys) + keys[: int(len(keys) * retried)]
    cursor = [0]
    fired = threading.Event()

    def client() -> None:
        while True:
            with lock:
                if cursor[0] >= len(plan):
                    return
                key = plan[cursor[0]]
                cursor[0] += 1
                sent = cursor[0]
            if during is not None and at is not None and sent == at and not fired.is_set():
                fired.set()
                during()
            for attempt in range(tries):
                try:
                    status, body = server.get(f"/submit?key={key}", timeout=timeout)
                except socket.timeout:
                    with lock:
                        load.hangs += 1
                    continue
                except (OSError, http.client.HTTPException) as exc:   # the process serving it died: again
                    with lock:
                        load.failures.append(f"{key}: {exc!r}")
                    time.sleep(0.05 * (attempt + 1))
                    continue
                with lock:
                    load.requests += 1
                if status == 200:
                    data = json.loads(body)
                    with lock:
                        load.acked[key] = data["id"]
                        load.answers.setdefault(key, set()).add(data["id"])
                        load.by_pid[data["pid"]] = load.by_pid.get(data["pid"], 0) + 1
                    break
                with lock:
                    load.failures.append(f"{key}: {status} {body[:200]!r}")
                time.sleep(0.05 * (attempt + 1))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * tries + 60)
        assert not t.is_alive(), "a client thread hung"
    return load


@dataclass(frozen=True)
class Run:
    """One execution the handler logged."""

    key: str
    pid: int
    start: float
    end: float
    attempt: int


def executions(log_path: str) -> list[Run]:
    """Every execution the handlers logged, in the order they were written."""
    if not os.path.exists(log_path):
        return []
    out = []
    with open(log_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 5:
                out.append(Run(parts[0], int(parts[1]), float(parts[2]), float(parts[3]), int(parts[4])))
    return out


def runs_by_key(log_path: str) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {}
    for run in executions(log_path):
        runs.setdefault(run.key, []).append(run)
    return runs


def wait_executed(log_path: str, keys: set[str], timeout: float = 90.0) -> dict[str, list[Run]]:
    """Wait until every key of ``keys`` ran (at most ``timeout``); key -> its executions."""
    deadline = time.monotonic() + timeout
    while True:
        runs = runs_by_key(log_path)
        if keys <= set(runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.1)
