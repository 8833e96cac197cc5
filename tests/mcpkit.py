"""The MCP server's test kit: a worker process with a revealing handler, the
gateway as a process (streamable HTTP, read its address from the log), and
sessions of the SDK's own client over stdio and over HTTP.

Every process is stopped by pid by the fixture or test that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, AsyncIterator

from serverkit import ROOT, server_env

ACCESS = "gateway-access-token-0123456789abcdef"

# Its output tells which options reached the worker; {"sleep": s} sleeps, {"fail": "retryable" |
# "permanent"} fails the attempt.
WORKER_SCRIPT = r"""
import asyncio, base64, sys
import cronoq
from cronoq.client import Worker

target, token, pool, labels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

async def handle(lease):
    data = lease.json() if lease.content_type == "application/json" else None
    if isinstance(data, dict):
        if data.get("sleep"):
            await asyncio.sleep(data["sleep"])
        if data.get("fail") == "retryable":
            raise cronoq.Retryable(data.get("message", "it failed"))
        if data.get("fail") == "permanent":
            raise cronoq.Permanent(data.get("message", "it failed for good"))
    for stage in lease.stages or ():
        if stage not in lease.checkpoints:
            await lease.checkpoint(stage, {"done": stage})
    if data is not None:
        echo = data
    elif lease.content_type.startswith("text/"):
        echo = lease.text()
    else:
        echo = base64.b64encode(lease.payload).decode()
    return {"echo": echo, "content_type": lease.content_type, "kind": lease.kind, "key": lease.key,
            "tags": lease.tags, "labels": lease.labels, "priority": lease.priority, "tenant": lease.tenant,
            "timeout": lease.timeout, "deadline": lease.deadline, "attempt": lease.attempt,
            "stages": list(lease.stages or ())}

labels = dict(item.split("=", 1) for item in labels.split(",") if item)
worker = Worker(target, pool, handle, slots=4, token=token, labels=labels, initial_backoff=0.05, max_backoff=0.5,
                name="mcp-test-worker")
asyncio.run(worker.run())
"""


class Process:
    """A child process whose standard error is read into ``lines`` on a thread."""

    def __init__(self, command: list[str], env: dict[str, str], *, stdout: Any = subprocess.DEVNULL) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                                        text=True, env=env, cwd=ROOT)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    @property
    def log(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """The first log line matching ``pattern`` (a regular expression), waiting for it."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._changed:
            while True:
                for line in self.lines:
                    match = regex.search(line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise AssertionError(f"no log line matched {pattern!r} (exit {self.process.poll()}):\n"
                                         + "\n".join(self.lines))
                self._changed.wait(min(left, 0.5))

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
        return self.process.wait(timeout)


def start_worker(target: str, token: str, pool: str = "default", labels: str = "") -> Process:
    return Process([sys.executable, "-c", WORKER_SCRIPT, target, token, pool, labels], server_env())


def mcp_env(server_token: str | None, access_token: str | None = None) -> dict[str, str]:
    env = server_env()
    for name in ("CRONOQ_TOKEN", "CRONOQ_MCP_TOKEN", "CRONOQ_SERVER"):
        env.pop(name, None)
    if server_token is not None:
        env["CRONOQ_TOKEN"] = server_token
    if access_token is not None:
        env["CRONOQ_MCP_TOKEN"] = access_token
    return env


class Gateway(Process):
    """``python -m cronoq.mcp --http 127.0.0.1:0``; ``url`` once it listens."""

    def __init__(self, target: str, server_token: str | None, access_token: str | None = ACCESS,
                 *extra: str) -> None:
        super().__init__([sys.executable, "-m", "cronoq.mcp", "--server", target, "--http", "127.0.0.1:0", *extra],
                         mcp_env(server_token, access_token))
        self.url = self.wait_for(r"listening: (http://\S+)").group(1)


@contextlib.asynccontextmanager
async def http_session(url: str, access_token: str | None = ACCESS) -> AsyncIterator[Any]:
    """An initialized ClientSession of the SDK over streamable HTTP."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {access_token}"} if access_token else None
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


@contextlib.asynccontextmanager
async def stdio_session(target: str, server_token: str | None, *extra: str,
                        errlog: Any = None) -> AsyncIterator[Any]:
    """``python -m cronoq.mcp`` started by the SDK's stdio client, and an initialized ClientSession."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "cronoq.mcp", "--server", target, *extra],
                                   env=mcp_env(server_token), cwd=str(ROOT))
    async with stdio_client(params, errlog=errlog or sys.stderr) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def structured(result: Any) -> Any:
    """A successful tool result's structured content (it must agree with the text content)."""
    assert not result.is_error, result.content[0].text
    text = json.loads(result.content[0].text)
    assert text == result.structured_content, (text, result.structured_content)
    return result.structured_content


def error_text(result: Any) -> str:
    assert result.is_error, result
    return result.content[0].text


def resource_json(result: Any) -> Any:
    (content,) = result.contents
    assert content.mime_type == "application/json"
    return json.loads(content.text)
