"""The real ``cronoq`` console script, run against real cronoq-server processes.

``cronoq(*args, token=..., server=...)`` runs the installed console script
(``cronoq`` next to this interpreter, from ``pip install -e .``) to the end;
``Terminal`` runs it in a pseudo-terminal and keeps the screen it draws, read
through the ``pyte`` terminal emulator; ``EchoWorker`` is a worker process
whose behaviour each task chooses by its kind.
"""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Callable

import pyte

from serverkit import ROOT, server_env

SCRIPT = Path(sys.executable).parent / "cronoq"


def script() -> str:
    if not SCRIPT.exists():
        raise AssertionError(f"the console script {SCRIPT} is missing: reinstall cronoq (pip install -e '.[dev]')")
    return str(SCRIPT)


def cli_env(token: str | None = None, server: str | None = None, extra: dict[str, str] | None = None
            ) -> dict[str, str]:
    env = server_env()
    for name in ("CRONOQ_TOKEN", "CRONOQ_SERVER", "CRONOQ_TLS_CA", "CRONOQ_TLS_CERT", "CRONOQ_TLS_KEY",
                 "COLUMNS", "LINES"):
        env.pop(name, None)
    if token is not None:
        env["CRONOQ_TOKEN"] = token
    if server is not None:
        env["CRONOQ_SERVER"] = server
    env.update(extra or {})
    return env


def cronoq(*args: str, token: str | None = None, server: str | None = None, input: bytes | None = None,
           env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
    """``cronoq ARGS`` to the end, with stdout and stderr as bytes (pipes: not a terminal)."""
    return subprocess.run([script(), *args], input=input, capture_output=True, timeout=timeout, cwd=ROOT,
                          env=cli_env(token, server, env), stdin=None if input is not None else subprocess.DEVNULL)


def text(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode()


def err(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode()


def connected(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds an established TCP connection to ``port``
    (Linux: its socket inodes in /proc/PID/fd, matched in /proc/net/tcp{,6})."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    except OSError:   # the process ended, or a descriptor closed meanwhile
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            remote_port, state, inode = int(fields[2].rsplit(":", 1)[1], 16), fields[3], fields[9]
            if remote_port == port and state == "01" and inode in inodes:
                return True
    return False


# ---------------------------------------------------------------- a pseudo-terminal


class Terminal:
    """A command in a pseudo-terminal of ``columns`` x ``lines``; what it draws
    is fed to a pyte screen, read with ``display`` and awaited with ``wait_for``."""

    def __init__(self, args: list[str], env: dict[str, str], *, columns: int = 160, lines: int = 50,
                 stdin_terminal: bool = True) -> None:
        self.columns, self.lines = columns, lines
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self._changed = threading.Condition()
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        env = dict(env, TERM="xterm-256color", COLUMNS=str(columns), LINES=str(lines))
        self.master = master
        self.process = subprocess.Popen(args, stdin=slave if stdin_terminal else subprocess.DEVNULL, stdout=slave,
                                        stderr=slave, env=env, cwd=ROOT, start_new_session=True, close_fds=True)
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                data = b""
            with self._changed:
                if data:
                    self.raw.extend(data)
                    self.stream.feed(data)
                self._changed.notify_all()
            if not data:
                return

    def display(self) -> str:
        with self._changed:
            return "\n".join(line.rstrip() for line in self.screen.display)

    def wait_for(self, check: str | Callable[[str], bool], timeout: float = 60.0) -> str:
        """The screen once ``check`` (text on it, or a predicate) holds; AssertionError with the screen if not."""
        test = (lambda screen: check in screen) if isinstance(check, str) else check
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                screen = "\n".join(line.rstrip() for line in self.screen.display)
                if test(screen):
                    return screen
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"the screen never showed {check!r} (exit {self.process.poll()}):\n"
                                         f"{screen}")
                self._changed.wait(min(left, 0.5))

    def send(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def wait(self, timeout: float = 30.0) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self._reader.join(5)
        try:
            os.close(self.master)
        except OSError:
            pass


# ---------------------------------------------------------------- a worker whose tasks say what to do

ECHO_WORKER = r"""
import asyncio, base64, json, sys
import cronoq
from cronoq.client import Worker

target, pool, name, token = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] or None
labels = dict(item.split("=", 1) for item in sys.argv[5:])

async def handle(lease):
    if lease.kind == "fail":
        raise cronoq.Permanent(lease.payload.decode("utf-8", "replace"))
    if lease.kind == "sleep":
        await asyncio.sleep(float(lease.payload or b"3600"))
        return b"slept"
    if lease.kind == "describe":
        return {"content_type": lease.content_type, "payload_b64": base64.b64encode(lease.payload).decode(),
                "priority": lease.priority, "tenant": lease.tenant, "tags": lease.tags, "labels": lease.labels,
                "key": lease.key, "deadline": lease.deadline}
    return lease.payload   # "echo" and anything else: the payload's bytes back, unchanged

print("ready", flush=True)
asyncio.run(Worker(target, pool, handle, slots=4, name=name, token=token, labels=labels or None,
                   initial_backoff=0.05, max_backoff=0.5).run())
"""


class EchoWorker:
    """A cronoq.client.Worker process: kind ``fail`` fails permanently with
    the payload as message, ``sleep`` sleeps (payload: seconds), ``describe``
    returns what it received as JSON, anything else echoes the payload."""

    def __init__(self, target: str, pool: str = "default", *, name: str = "echo-1", token: str | None = None,
                 labels: dict[str, str] | None = None) -> None:
        args = [sys.executable, "-c", ECHO_WORKER, target, pool, name, token or ""]
        args += [f"{k}={v}" for k, v in (labels or {}).items()]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=server_env(), cwd=ROOT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


class Lines:
    """A command run in the background whose standard output is read line by line on a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env, cwd=ROOT)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            with self._changed:
                self.lines.append(raw.decode().rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, check: Callable[[list[str]], bool], timeout: float = 30.0) -> bool:
        """Whether ``check(lines)`` came true within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not check(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return check(self.lines)
                self._changed.wait(min(left, 0.5))
            return True

    def interrupt(self, timeout: float = 30.0) -> tuple[int, str]:
        """SIGINT (Ctrl-C); the exit status and standard error."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout)
        self._reader.join(5)
        assert self.process.stderr is not None
        return code, self.process.stderr.read().decode()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
