"""The HTTP listener: /healthz and /readyz, on a lean asyncio HTTP/1.1 server.

/healthz answers 200 while the process runs; /readyz answers 200 on the
leader and 503 on a standby or a stopping server. Neither needs credentials.
With authentication off (and without --insecure-no-auth), requests must name
a loopback host, which stops web pages that rebind a name to 127.0.0.1.

The full HTTP/JSON API is a separate step; it may replace this server with
another stack after measuring (docs/server.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from typing import Callable

__all__ = ["HttpListener", "loopback_host"]

log = logging.getLogger("cronoq.server")

_MAX_HEAD = 16 * 1024
_READ_TIMEOUT = 10.0


def loopback_host(host_header: str) -> bool:
    """Whether a Host header names this machine's loopback: localhost,
    *.localhost, 127.x.x.x or [::1] (a port may follow)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpListener:
    def __init__(self, host: str, port: int, ready: Callable[[], bool], *, check_host: bool,
                 tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.ready = ready
        self.check_host = check_host
        self.tls = tls
        self.server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.tls,
                                                 reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for task in list(self._connections):
                task.cancel()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            status, body = self._answer(head)
            head_only = head.startswith(b"HEAD ")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError,
                ssl.SSLError):
            status, body = 400, "bad request"
            head_only = False
        except asyncio.CancelledError:
            writer.close()
            raise
        finally:
            self._connections.discard(task)
        reasons = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
                   503: "Service Unavailable"}
        data = (body + "\n").encode()
        try:
            writer.write(f"HTTP/1.1 {status} {reasons[status]}\r\ncontent-type: text/plain; charset=utf-8\r\n"
                         f"content-length: {len(data)}\r\nconnection: close\r\n\r\n".encode()
                         + (b"" if head_only else data))
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[int, str]:
        if len(head) > _MAX_HEAD:
            return 400, "request head too large"
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, "bad request"
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if self.check_host and not loopback_host(headers.get("host", "")):
            return 403, "forbidden: authentication is off, so only loopback host names are served"
        path = target.partition("?")[0]
        if path not in ("/healthz", "/readyz"):
            return 404, "not found"
        if method not in ("GET", "HEAD"):
            return 405, "method not allowed"
        if path == "/healthz":
            return 200, "ok"
        if self.ready():
            return 200, "ready"
        return 503, "not the leader (standby or shutting down)"
