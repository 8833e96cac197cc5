"""A lean HTTP/1.1 server on asyncio's Protocol API, in the scheduler's loop.

It carries the HTTP/JSON gateway (``gateway.py``) and the probes. It was
chosen over an ASGI stack after measuring (docs/architecture.md): it parses
only what the gateway needs, so a request costs a fraction of what uvicorn
and a framework cost, and that CPU is left to the scheduler in the same loop.

What it does, per connection: persistent connections (HTTP/1.1 keep-alive,
HTTP/1.0 with ``connection: keep-alive``), pipelined requests answered in
order, ``content-length`` and ``chunked`` bodies, ``expect: 100-continue``,
and bounds on everything a client controls: the request head
(``_MAX_HEAD`` bytes, ``_MAX_HEADERS`` fields: 431; it must arrive within
``_IDLE_S``), the body (the app's
``max_body``: 413, decided from ``content-length`` before reading it), the
time of a request (the app's ``time_limit``: 504), idle connections
(``_IDLE_S``), and the data buffered while a request is being answered
(reading pauses). A request that cannot be framed (a bad head, both
``content-length`` and ``transfer-encoding``) is answered 400 and the
connection closed. Client certificates (TLS with ``client_ca``) are passed on
as their DNS names.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time
from email.utils import formatdate
from typing import AsyncIterator, Awaitable, Callable, Protocol

__all__ = ["HttpListener", "Request", "Response", "App", "loopback_host", "REASONS", "reason_code"]

log = logging.getLogger("cronoq.server")

_MAX_HEAD = 16 * 1024        # request line and header fields
_MAX_HEADERS = 100
_IDLE_S = 75.0               # a keep-alive connection without a request for this long is closed
_MAX_BUFFERED = 256 * 1024   # pipelined data held while a request is being answered

# Reason phrases (RFC 9110); error bodies carry them lower-case with underscores.
REASONS = {
    100: "Continue", 200: "OK", 308: "Permanent Redirect", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 499: "Client Closed Request",
    500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


def reason_code(status: int) -> str:
    """The ``code`` of an error body: the reason phrase, lower-case, words joined by ``_``."""
    return REASONS.get(status, "Error").lower().replace(" ", "_")


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


class Request:
    """One request: ``method``, ``target`` (as sent), ``path`` (percent-encoded,
    without the query), ``query`` (the text after ``?``), ``headers`` (names
    lower-case; repeated fields joined with ``, ``), ``body``, and the DNS
    names of a verified client certificate."""

    __slots__ = ("method", "target", "path", "query", "headers", "body", "version", "cert_names")

    def __init__(self, method: str, target: str, headers: dict[str, str], version: str,
                 cert_names: tuple[str, ...] = ()) -> None:
        self.method = method
        self.target = target
        path, _, query = target.partition("?")
        self.path = path
        self.query = query
        self.headers = headers
        self.body = b""
        self.version = version
        self.cert_names = cert_names


class Response:
    """An answer. With ``stream``, ``body`` is ignored: the chunks the stream
    yields are sent as they come (chunked transfer coding), with no time
    limit, until it ends or the client goes away (Server-Sent Events)."""

    __slots__ = ("status", "body", "content_type", "headers", "close", "stream")

    def __init__(self, status: int, body: bytes, content_type: str = "application/json",
                 headers: tuple[tuple[str, str], ...] = (), close: bool = False,
                 stream: AsyncIterator[bytes] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
        self.close = close
        self.stream = stream


class App(Protocol):
    """What the listener serves."""

    max_body: int

    def time_limit(self, request: Request) -> float:
        """Seconds the request may take, from its head to the response."""

    def error(self, status: int, message: str, *, close: bool = False) -> Response:
        """The response for an error the listener finds itself."""

    def closing(self) -> bool:
        """Whether responses should close their connections now (a standby)."""

    def __call__(self, request: Request) -> Awaitable[Response]: ...


class _Date:
    """The Date header, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second = second
            cls.value = formatdate(second, usegmt=True).encode()
        return cls.value


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """(method, target, version, headers) of a request head (without its blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:   # (latin-1 decodes every byte; kept for clarity)
        raise _BadRequest(400, "the request head is not text") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise _BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if version.startswith("HTTP/"):
            raise _BadRequest(505, f"{version} is not supported: use HTTP/1.1")
        raise _BadRequest(400, "malformed request line")
    if not target.startswith("/"):
        raise _BadRequest(400, "the request target must be a path (origin form)")
    if len(lines) - 1 > _MAX_HEADERS:
        raise _BadRequest(431, f"more than {_MAX_HEADERS} header fields")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise _BadRequest(400, "malformed header field")
        name = name.lower()
        value = value.strip(" \t")
        if name in headers:
            if name in ("content-length", "host", "authorization", "content-type", "transfer-encoding"):
                raise _BadRequest(400, f"the {name} header is given more than once")
            headers[name] += ", " + value
        else:
            headers[name] = value
    return method.upper(), target, version, headers


class _Connection(asyncio.Protocol):
    """One client connection: reads requests, answers them one at a time."""

    def __init__(self, listener: HttpListener) -> None:
        self.listener = listener
        self.app = listener.app
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.scanned = 0                       # bytes of buffer searched for the end of the head
        self.request: Request | None = None    # the head is in, the body is being read
        self.length = 0                        # content-length of the request being read
        self.chunked = False
        self.chunk_offset = 0                  # chunked: bytes of buffer already decoded into body
        self.body = bytearray()
        self.keep_alive = True
        self.handling: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timed_out = False
        self.paused = False
        self.can_write: asyncio.Future[None] | None = None
        self.closed = False
        self.cert_names: tuple[str, ...] = ()

    # -- the transport's calls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.listener.connections.add(self)
        if self.listener.tls is not None:
            cert = transport.get_extra_info("peercert")
            if cert:
                self.cert_names = tuple(value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS")
        self._arm(_IDLE_S, self._idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener.connections.discard(self)
        self._disarm()
        if self.handling is not None:
            self.handling.cancel()   # nobody is left to answer
        if self.can_write is not None and not self.can_write.done():
            self.can_write.set_result(None)

    def eof_received(self) -> bool:
        # The client is done sending: finish nothing more (a pending answer has no reader).
        return False

    def pause_writing(self) -> None:
        if self.can_write is None or self.can_write.done():
            self.can_write = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.can_write is not None and not self.can_write.done():
            self.can_write.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.handling is None:
            self._advance()
        elif len(self.buffer) > _MAX_BUFFERED and not self.paused:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    # -- timers

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _idle(self) -> None:
        self.timer = None
        if self.request is None and self.handling is None:
            if self.buffer:   # a head that never finished
                self._fail(400, "the request head did not arrive in time")
            else:
                self._close()

    def _expired(self) -> None:
        """The request's time limit passed."""
        self.timer = None
        self.timed_out = True
        if self.handling is not None:
            self.handling.cancel()   # _run answers 504
        else:   # still reading the body
            self._fail(504, "the request did not arrive within its time limit")

    # -- reading requests

    def _advance(self) -> None:
        """Parse what the buffer holds; start answering a complete request."""
        while not self.closed and self.handling is None:
            if self.request is None:
                if not self._read_head():
                    return
            if not self._read_body():
                return
            request = self.request
            assert request is not None
            request.body = bytes(self.body)
            self.request = None
            self.body = bytearray()
            self.handling = self.loop.create_task(self._run(request))
            return

    def _read_head(self) -> bool:
        while self.buffer[:2] == b"\r\n":   # blank lines between requests are ignored (RFC 9112, 2.2)
            del self.buffer[:2]
            self.scanned = 0
        end = self.buffer.find(b"\r\n\r\n", max(0, self.scanned - 3))
        if end < 0:
            self.scanned = len(self.buffer)
            if len(self.buffer) > _MAX_HEAD:
                self._fail(431, f"the request head is larger than {_MAX_HEAD} bytes")
            return False
        if end > _MAX_HEAD:
            self._fail(431, f"the request head is larger than {_MAX_HEAD} bytes")
            return False
        head = bytes(self.buffer[:end])
        del self.buffer[:end + 4]
        self.scanned = 0
        try:
            method, target, version, headers = _parse_head(head)
            request = Request(method, target, headers, version, self.cert_names)
            self._frame(request)
        except _BadRequest as exc:
            self._fail(exc.status, exc.message)
            return False
        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            self.keep_alive = "keep-alive" in connection
        else:
            self.keep_alive = "close" not in connection
        self.request = request
        self.timed_out = False
        self._arm(self.app.time_limit(request), self._expired)
        if self.length > self.app.max_body:
            self._fail(413, f"the body is larger than {self.app.max_body} bytes (limits.max_http_body_bytes)")
            return False
        if (self.length or self.chunked) and headers.get("expect", "").lower() == "100-continue":
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def _frame(self, request: Request) -> None:
        """How the body is delimited (RFC 9112, section 6)."""
        headers = request.headers
        encoding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        self.length = 0
        self.chunked = False
        self.chunk_offset = 0
        if encoding is not None:
            if length is not None:
                raise _BadRequest(400, "content-length and transfer-encoding together are not allowed")
            if encoding.lower() != "chunked":
                raise _BadRequest(501, f"transfer-encoding {encoding!r} is not supported (only chunked)")
            if request.version == "HTTP/1.0":
                raise _BadRequest(400, "transfer-encoding is not allowed in HTTP/1.0")
            self.chunked = True
        elif length is not None:
            if not length.isdigit() or len(length) > 15:
                raise _BadRequest(400, f"invalid content-length {length[:40]!r}")
            self.length = int(length)

    def _read_body(self) -> bool:
        if self.chunked:
            return self._read_chunks()
        if len(self.buffer) < self.length:
            return False
        self.body = self.buffer[:self.length]
        del self.buffer[:self.length]
        return True

    def _read_chunks(self) -> bool:
        buffer = self.buffer
        while True:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                if len(buffer) > 1024:
                    self._fail(400, "malformed chunk size line")
                return False
            size_text = bytes(buffer[:line_end]).partition(b";")[0].strip()
            try:
                size = int(size_text, 16)
                if size < 0 or not size_text or len(size_text) > 12:
                    raise ValueError
            except ValueError:
                self._fail(400, "malformed chunk size")
                return False
            if size == 0:
                trailer_end = buffer.find(b"\r\n\r\n", line_end)
                if line_end + 2 <= len(buffer) and buffer[line_end + 2:line_end + 4] == b"\r\n":
                    del buffer[:line_end + 4]
                    return True
                if trailer_end < 0:
                    if len(buffer) > _MAX_HEAD:
                        self._fail(431, "the chunked trailer is too large")
                    return False
                del buffer[:trailer_end + 4]   # trailer fields are ignored
                return True
            if len(self.body) + size > self.app.max_body:
                self._fail(413, f"the body is larger than {self.app.max_body} bytes (limits.max_http_body_bytes)")
                return False
            if len(buffer) < line_end + 2 + size + 2:
                return False
            start = line_end + 2
            if buffer[start + size:start + size + 2] != b"\r\n":
                self._fail(400, "malformed chunk")
                return False
            self.body += buffer[start:start + size]
            del buffer[:start + size + 2]

    # -- answering

    async def _run(self, request: Request) -> None:
        try:
            response = await self.app(request)
        except asyncio.CancelledError:
            if self.closed or not self.timed_out:
                raise
            response = self.app.error(504, f"the request ran longer than its time limit "
                                           f"({self.app.time_limit(request):g} s)")
        except Exception:
            log.exception("internal error answering %s %s", request.method, request.path[:200])
            response = self.app.error(500, "internal error (logged by the server)")
        self._disarm()
        if self.closed:
            self.handling = None
            return
        close = response.close or not self.keep_alive or self.app.closing()
        if response.stream is not None:
            if request.version == "HTTP/1.0":
                close = True   # no chunked coding: the end of the stream is the end of the connection
            await self._stream(response, close, chunked=request.version != "HTTP/1.0")
            if self.closed:
                self.handling = None
                return
        else:
            self._write(response, close, head_only=request.method == "HEAD")
        if self.can_write is not None and not self.can_write.done():
            await self.can_write   # a slow reader: answer the next request once this one is out
        self.handling = None
        if close:
            self._close()
            return
        if self.paused and not self.closed:
            self.paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        self._arm(_IDLE_S, self._idle)
        if self.buffer:
            self._advance()

    def _write(self, response: Response, close: bool, *, head_only: bool = False) -> None:
        status = response.status
        body = response.body
        parts = [b"HTTP/1.1 %d %s\r\ndate: %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
                 % (status, REASONS.get(status, "Error").encode(), _Date.now(), response.content_type.encode(),
                    len(body))]
        for name, value in response.headers:
            parts.append(b"%s: %s\r\n" % (name.encode(), value.encode("latin-1", "replace")))
        if close:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if not head_only:
            parts.append(body)
        assert self.transport is not None
        self.transport.write(b"".join(parts))

    async def _stream(self, response: Response, close: bool, *, chunked: bool) -> None:
        """Send a streamed response: its head, then each chunk as the stream
        yields it, waiting while the client reads slowly (the stream then
        falls behind, and decides what to drop)."""
        assert self.transport is not None and response.stream is not None
        parts = [b"HTTP/1.1 %d %s\r\ndate: %s\r\ncontent-type: %s\r\ncache-control: no-store\r\n"
                 % (response.status, REASONS.get(response.status, "Error").encode(), _Date.now(),
                    response.content_type.encode())]
        parts.append(b"transfer-encoding: chunked\r\n" if chunked else b"connection: close\r\n")
        for name, value in response.headers:
            parts.append(b"%s: %s\r\n" % (name.encode(), value.encode("latin-1", "replace")))
        if close and chunked:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self.transport.write(b"".join(parts))
        stream = response.stream
        try:
            async for chunk in stream:
                if self.closed:
                    break
                if chunk:
                    self.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                if self.can_write is not None and not self.can_write.done():
                    await self.can_write
            else:
                if chunked and not self.closed:
                    self.transport.write(b"0\r\n\r\n")
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def _fail(self, status: int, message: str) -> None:
        """Answer an unframeable or refused request and close the connection."""
        self._disarm()
        if not self.closed:
            self._write(self.app.error(status, message, close=True), True)
        self._close()

    def _close(self) -> None:
        self._disarm()
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def shut(self) -> None:
        """The listener stops: idle connections close now, busy ones after their answer."""
        if self.handling is None:
            self._close()
        else:
            self.keep_alive = False


class HttpListener:
    """Serves ``app`` on ``host:port`` (``start`` returns the bound port)."""

    def __init__(self, host: str, port: int, app: App, *, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.app = app
        self.tls = tls
        self.server: asyncio.base_events.Server | None = None
        self.connections: set[_Connection] = set()

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Connection(self), self.host, self.port, ssl=self.tls,
                                               reuse_address=True, backlog=1024)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; requests being answered get ``grace`` seconds, then
        every connection is closed."""
        if self.server is None:
            return
        self.server.close()
        for connection in list(self.connections):
            connection.shut()
        busy = [c.handling for c in self.connections if c.handling is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace)
        for connection in list(self.connections):
            if connection.handling is not None:
                connection.handling.cancel()
            connection._close()
        await self.server.wait_closed()
