"""Real cronoq-server processes for the server tests.

``ServerProcess(config_text, directory)`` runs ``python -m cronoq.server
--config FILE`` with listeners on port 0 of 127.0.0.1 (the server binds its
own ports and logs them: nothing can take them in between), reads its log
on a thread, and is stopped by pid (SIGTERM, then SIGKILL if it lingers).
The ``servers`` fixture (tests/conftest.py) stops every process a test started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLIENT = "client-token-0123456789abcdef0123"
WORKER = "worker-token-0123456789abcdef0123"
METRICS = "metrics-token-0123456789abcdef012"
ADMIN = "admin-token-0123456789abcdef01234"

AUTH = f"""
[[auth.tokens]]
token = "{CLIENT}"
role = "client"
[[auth.tokens]]
token = "{WORKER}"
role = "worker"
[[auth.tokens]]
token = "{METRICS}"
role = "metrics"
[[auth.tokens]]
token = "{ADMIN}"
role = "admin"
"""

LISTEN = """
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
standby_close_s = 0.5
"""

def sqlite_store(path, *, ttl: float = 2.0, full_sync: bool = True) -> str:
    """A [store] table on the SQLite file ``path`` with short leases (a
    standby takes over within about ``ttl`` seconds)."""
    return f"""
[store]
kind = "sqlite"
path = "{path}"
lease_ttl_s = {ttl}
lease_renew_s = 0.3
lock_poll_s = 0.1
""" + ("" if full_sync else "full_sync = false\n")


def shards_toml(shards: dict[str, tuple[list[str], str]]) -> str:
    """The [[pools]] and [[shards]] tables of a sharded configuration: shard
    name -> (its pools, its endpoint), numbered from 1 in the order given."""
    pools = "".join(f'[[pools]]\nname = "{pool}"\n' for names, _ in shards.values() for pool in names)
    return pools + "".join(
        f'[[shards]]\nname = "{name}"\nnumber = {number}\npools = {json.dumps(names)}\nendpoint = "{endpoint}"\n'
        for number, (name, (names, endpoint)) in enumerate(shards.items(), start=1))


_LISTENING = re.compile(r"listening: grpc [^ ]+:(\d+), http https?://[^ ]+:(\d+)(?:, metrics http://[^ ]+:(\d+))?")


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("CRONOQ_CONFIG", None)
    if extra:
        env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """``python -m cronoq.server ARGS`` to completion (--check, --print-proto, refused starts)."""
    return subprocess.run([sys.executable, "-m", "cronoq.server", *args], capture_output=True, text=True,
                          env=server_env(env), timeout=timeout, cwd=ROOT)


class ServerProcess:
    def __init__(self, config: str | None, directory: Path, *, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = (), name: str = "server", max_files: int | None = None) -> None:
        self.directory = Path(directory)
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.directory / f"{name}.toml"
            self.config_path.write_text(config)
        self.env = env
        self.args = args
        self.max_files = max_files          # the process's open-file limit (RLIMIT_NOFILE), if set
        self.process: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.grpc_port = 0
        self.http_port = 0
        self.metrics_port = 0              # server.metrics_addr, when configured
        self._changed = threading.Condition()
        self._reader: threading.Thread | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, wait_for: str | None = "serving as the leader", timeout: float = 30.0) -> ServerProcess:
        command = [sys.executable, "-m", "cronoq.server", *self.args]
        if self.config_path is not None:
            command += ["--config", str(self.config_path)]
        preexec = None
        if self.max_files is not None:
            import resource
            limit = self.max_files

            def preexec() -> None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, env=server_env(self.env), cwd=ROOT,
                                        preexec_fn=preexec)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for("listening: grpc", timeout)
        if wait_for is not None:
            self.wait_for(wait_for, timeout)
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                match = _LISTENING.search(line)
                if match:
                    self.grpc_port, self.http_port = int(match.group(1)), int(match.group(2))
                    self.metrics_port = int(match.group(3) or 0)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def log(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def count(self, text: str) -> int:
        with self._changed:
            return sum(text in line for line in self.lines)

    def wait_for(self, text: str, timeout: float = 30.0, *, occurrences: int = 1) -> None:
        """Wait until ``text`` appeared ``occurrences`` times in the log."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(text in line for line in self.lines) < occurrences:
                left = deadline - time.monotonic()
                if left <= 0 or (self.process is not None and self.process.poll() is not None
                                 and not (self._reader and self._reader.is_alive())):
                    raise AssertionError(f"the server did not log {text!r} (exit "
                                         f"{self.process.poll() if self.process else None}):\n" + "\n".join(self.lines))
                self._changed.wait(min(left, 0.5))

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        code = self.process.wait(timeout)
        if self._reader is not None:
            self._reader.join(5)
        return code

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)


# ---------------------------------------------------------------- raw gRPC


class RawWorker:
    """A Workers.Work stream driven by hand (no cronoq.client.Worker), for the protocol rules.

    A reader task moves what the server sends into a queue, so waiting for a
    message with a timeout never cancels the call (cancelling a read would)."""

    def __init__(self, target: str, token: str | None = None, *, credentials=None, options=()) -> None:
        import grpc
        from cronoq._proto import cronoq_pb2_grpc as pb_grpc

        self.channel = (grpc.aio.secure_channel(target, credentials, options=options) if credentials is not None
                        else grpc.aio.insecure_channel(target, options=options))
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.call = pb_grpc.WorkersStub(self.channel).Work(metadata=metadata)
        self._queue = None
        self._reader = None

    def _start_reading(self) -> None:
        import asyncio
        import grpc
        if self._reader is not None:
            return
        self._queue = asyncio.Queue()

        async def read() -> None:
            try:
                while True:
                    message = await self.call.read()
                    if message is grpc.aio.EOF:
                        break
                    self._queue.put_nowait(message)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.CancelledError):
                pass   # the stream ended (or was cancelled by close)
            finally:
                self._queue.put_nowait(None)

        self._reader = asyncio.get_running_loop().create_task(read())

    async def send(self, **fields) -> None:
        """Send one message; if the server already ended the stream, nothing
        happens (the test reads the status with ``finish`` or ``status``)."""
        import asyncio
        import grpc
        from cronoq._proto import cronoq_pb2 as pb
        try:
            await self.call.write(pb.WorkerMessage(**fields))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass

    async def register(self, pool: str = "default", slots: int = 1, *, version: int = 3, labels=None,
                       batches: bool = False, name: str = "raw"):
        from cronoq._proto import cronoq_pb2 as pb
        await self.send(register=pb.Register(pool=pool, slots=slots, worker_name=name, protocol_version=version,
                                             labels=labels or {}, accept_batches=batches))
        first = await self.recv()
        assert first is not None and first.WhichOneof("msg") == "registered", first
        return first.registered

    async def recv(self, timeout: float = 30.0):
        """The next ServerMessage, or None once the stream ended (asyncio.TimeoutError if none comes)."""
        import asyncio
        self._start_reading()
        message = await asyncio.wait_for(self._queue.get(), timeout)
        if message is None:
            self._queue.put_nowait(None)   # stays ended
        return message

    async def recv_kind(self, kind: str, timeout: float = 30.0):
        """The next message, which must be of ``kind``."""
        message = await self.recv(timeout)
        assert message is not None, f"the stream ended waiting for {kind}: {await self.status()}"
        assert message.WhichOneof("msg") == kind, message
        return getattr(message, kind)

    async def status(self):
        """(code, details) once the stream ended."""
        return await self.call.code(), await self.call.details()

    async def finish(self, timeout: float = 30.0):
        """Read to the end; returns (messages, code, details)."""
        messages = []
        while True:
            message = await self.recv(timeout)
            if message is None:
                break
            messages.append(message)
        code, details = await self.status()
        return messages, code, details

    async def close(self) -> None:
        self.call.cancel()
        if self._reader is not None:
            await self._reader
        await self.channel.close()


def stubs(target: str, *, credentials=None):
    """(channel, TasksStub, AdminStub) for raw calls."""
    import grpc
    from cronoq._proto import cronoq_pb2_grpc as pb_grpc

    channel = (grpc.aio.secure_channel(target, credentials) if credentials is not None
               else grpc.aio.insecure_channel(target))
    return channel, pb_grpc.TasksStub(channel), pb_grpc.AdminStub(channel)


def bearer(token: str):
    return (("authorization", f"Bearer {token}"),)


WORKER_SCRIPT = r"""
import asyncio, sys, time
from cronoq.client import Worker

target, pool, sleep, slots, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

async def handle(lease):
    print(f"started {lease.task_id} {lease.attempt}", flush=True)
    try:
        await asyncio.sleep(sleep)
    except asyncio.CancelledError:
        print(f"aborted {lease.task_id} {lease.attempt} {lease.abort_reason}", flush=True)
        raise
    print(f"finished {lease.task_id} {lease.attempt}", flush=True)
    return {"by": name, "attempt": lease.attempt}

asyncio.run(Worker(target, pool, handle, slots=slots, name=name, initial_backoff=0.05, max_backoff=0.5).run())
"""


class WorkerProcess:
    """A cronoq.client.Worker named ``name`` with ``slots`` in a child process
    whose handler prints 'started TASK ATTEMPT', sleeps ``sleep`` seconds, then
    returns ``{"by": name, "attempt": ATTEMPT}`` (an abort prints 'aborted TASK
    ATTEMPT REASON')."""

    def __init__(self, target: str, pool: str = "default", sleep: float = 3600.0, *, slots: int = 1,
                 name: str = "process") -> None:
        self.process = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, target, pool, str(sleep), str(slots),
                                         name],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, env=server_env(), cwd=ROOT)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.strip())
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while text not in self.lines:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the worker did not print {text!r}: {self.lines}")
                self._changed.wait(min(left, 0.5))

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.process.wait(10)
