"""A lean HTTP/1.1 server on asyncio's Protocol API, in the scheduler's loop.

It carries the HTTP/JSON gateway (``gateway.py``) and the probes. It was
chosen over an ASGI stack after measuring (docs/architecture.md): a request
costs a fraction of what uvicorn and a framework cost, and that CPU is left
to the scheduler in the same loop.

Parsing is llhttp's (through httptools, as uvicorn uses it), in its strict
mode: anything a proxy in front could read differently (bare LF or CR,
NUL or CR in a field, obsolete line folding, non-token field names, chunk
sizes with a sign, prefix or separator, content-length that is not plain
digits, content-length with transfer-encoding) is a 400 and the end of the
connection. What llhttp leaves to us is checked here: the version (1.0 and
1.1), the origin form of the target, a Host on HTTP/1.1, the one transfer
coding we take (chunked), the size of the head (``_MAX_HEAD``, 431) and the
number of its fields (``_MAX_HEADERS``, 431), empty request lines.

Per connection: persistent connections (HTTP/1.1 keep-alive, HTTP/1.0 with
``connection: keep-alive``), pipelined requests answered in order,
``expect: 100-continue``, and a bound on everything a client controls, set
by ``HttpLimits``: a new connection must send a whole head within
``head_timeout_s`` (so must a keep-alive connection, counted from the first
byte of the head), an idle keep-alive connection lives ``keepalive_timeout_s``,
a body must arrive within ``body_timeout_s`` of its head, a response the
client does not read closes the connection after ``write_timeout_s``, and a
listener serves at most ``max_connections`` (503 beyond). The app sees each
head before its body (``App.admit``): credentials and routes are judged
before a byte of the body is kept. Client certificates (TLS with
``client_ca``) are passed on as their DNS names.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from email.utils import formatdate

import httptools

from .counters import ServerCounters
from .http_messages import REASONS, App, HttpLimits, Request, Response, loopback_host, reason_code

__all__ = ["HttpListener", "HttpLimits", "Request", "Response", "App", "loopback_host", "REASONS", "reason_code"]

log = logging.getLogger("cronoq.server")

_MAX_HEAD = 16 * 1024        # request line and header fields
_MAX_HEADERS = 100
_MAX_QUEUED = 16             # pipelined requests parsed ahead of the one being answered
_MAX_BUFFERED = 256 * 1024   # bytes of bodies held in those requests
_LINGER_S = 2.0              # after a refusal, unread input is drained this long before the close
# Header fields that must not repeat (a second one could frame or route the request differently).
_SINGLE = frozenset((b"host", b"authorization", b"content-type", b"content-length", b"transfer-encoding"))

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


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing (the refusal is
    queued already; httptools re-raises it as HttpParserCallbackError)."""


class _Pending:
    """A request in line to be answered: complete, or refused (``refusal``)."""

    __slots__ = ("request", "refusal", "close", "deadline", "size")

    def __init__(self, request: Request | None, refusal: Response | None, close: bool, deadline: float,
                 size: int = 0) -> None:
        self.request = request
        self.refusal = refusal
        self.close = close
        self.deadline = deadline      # loop time by which the answer is due
        self.size = size              # bytes of its body


# What the read side is waiting for (which deadline applies).
_FIRST_HEAD, _KEEPALIVE, _HEAD, _BODY, _NOTHING = range(5)


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, answers them one at a time, in order."""

    def __init__(self, listener: HttpListener) -> None:
        self.listener = listener
        self.app = listener.app
        self.limits = listener.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer = ""
        self.cert_names: tuple[str, ...] = ()
        # Parsing
        self.in_message = False
        self.blank = b""                       # CR/LF bytes seen before a request line
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.headers_done = False
        self.head_at = 0.0
        self.current: Request | None = None    # its head is in, its body is arriving
        self.current_refusal: Response | None = None
        self.body: list[bytes] = []
        self.body_size = 0
        self.body_limit = 0
        self.continue_due = False              # 100 Continue owed to the current request
        self.stopped = False                   # nothing more is parsed (a refusal that closes)
        # Answering
        self.queue: deque[_Pending] = deque()
        self.queued_bytes = 0
        self.handling: asyncio.Task[None] | None = None
        self.keep_alive = True
        self.read_state = _FIRST_HEAD
        # Deadlines in loop time, checked by the listener's sweep (no timer per request).
        self.read_deadline: float | None = None
        self.answer_deadline: float | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        self.timed_out = False
        self.reading_paused = False
        self.can_write: asyncio.Future[None] | None = None
        self.closed = False
        self.lingering: asyncio.TimerHandle | None = None
        self.idle_since = self.loop.time()     # when it last became an idle keep-alive connection

    # -- the transport's calls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        listener = self.listener
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer = str(peer[0])
        if not listener.make_room():
            # Over the cap: a short answer, and the file descriptor back at once.
            self.closed = True
            listener.counters.http_refused += 1
            message = (f"the server is serving its maximum of {self.limits.max_connections} HTTP connections "
                       f"(limits.max_http_connections); retry shortly")
            self._write(self.app.error(503, message, close=True), True)
            transport.close()
            return
        listener.watch(self)
        if listener.tls is not None:
            cert = transport.get_extra_info("peercert")
            if cert:
                self.cert_names = tuple(value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS")
        self._arm_read(_FIRST_HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener.connections.discard(self)
        for timer in (self.write_timer, self.lingering):
            if timer is not None:
                timer.cancel()
        self.write_timer = self.lingering = None
        self.read_deadline = self.answer_deadline = None
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
        if self.write_timer is None:
            self.write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        if self.can_write is not None and not self.can_write.done():
            self.can_write.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.stopped or self.closed:
            return   # (a refused request's body, drained while lingering)
        if not self.in_message:
            data = self._skip_blank(data)
            if not data:
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not self.stopped:   # one of our callbacks failed (not a refusal): a defect of ours
                log.error("internal error parsing a request from %s", self.peer, exc_info=exc.__context__)
                self._refuse(self.app.error(500, "internal error (logged by the server)", close=True))
        except httptools.HttpParserUpgrade:
            # The request asked to switch protocols: it is answered as plain
            # HTTP, and nothing after it is read (llhttp stops there).
            if self.queue:
                self.queue[-1].close = True
            self.stopped = True
            self._pause_reading()
        except httptools.HttpParserError as exc:
            reason = _parser_reason(exc)
            if reason in _VERSION_ERRORS:
                self._refuse(self.app.error(505, "this HTTP version is not supported: use HTTP/1.1", close=True))
            else:
                self._refuse(self.app.error(400, f"malformed request: {reason}", close=True))
        if not self.closed and self.handling is None:
            self._next()
        if not self.reading_paused and not self.stopped and (
                len(self.queue) >= _MAX_QUEUED or self.queued_bytes > _MAX_BUFFERED):
            self._pause_reading()   # the client sends faster than we answer: hold it back

    def _skip_blank(self, data: bytes) -> bytes:
        """Allow one CRLF before a request line (RFC 9112, 2.2); more, or any
        other empty line, is a request without a request line: 400."""
        stripped = data.lstrip(b"\r\n")
        if len(stripped) == len(data) and not self.blank:
            return data
        self.blank += data[:len(data) - len(stripped)]
        if self.blank not in (b"\r", b"\r\n"):
            self._refuse(self.app.error(400, "malformed request: an empty request line", close=True))
            return b""
        if stripped:
            if self.blank != b"\r\n":
                self._refuse(self.app.error(400, "malformed request: an empty request line", close=True))
                return b""
            self.blank = b""
        return stripped

    # -- llhttp's callbacks (each runs inside feed_data)

    def on_message_begin(self) -> None:
        self.in_message = True
        self.blank = b""
        self.url = b""
        self.fields = []
        self.head_bytes = 0
        self.headers_done = False
        if self.read_state != _FIRST_HEAD:   # (a new connection's deadline counts from its opening)
            self._arm_read(_HEAD)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.headers_done:
            return   # a trailer field of a chunked body: ignored
        self.fields.append((name, value))
        self._count(len(name) + len(value) + 4)
        if len(self.fields) > _MAX_HEADERS:
            self._stop(self.app.error(431, f"more than {_MAX_HEADERS} header fields", close=True))

    def _count(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > _MAX_HEAD:
            self._stop(self.app.error(431, f"the request head is larger than {_MAX_HEAD} bytes", close=True))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.head_at = self.loop.time()
        parser = self.parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            if version[:1].isdigit() and version >= "2":
                self._stop(self.app.error(505, f"HTTP/{version} is not supported: use HTTP/1.1", close=True))
            self._stop(self.app.error(400, "malformed request line", close=True))
        method = parser.get_method().decode("ascii")
        headers: dict[str, str] = {}
        for raw_name, raw_value in self.fields:
            name = raw_name.lower()
            value = raw_value.decode("latin-1")
            text = name.decode("ascii")
            if text in headers:
                if name in _SINGLE:
                    self._stop(self.app.error(400, f"the {text} header is given more than once", close=True))
                headers[text] += ", " + value
            else:
                headers[text] = value
        target = self.url.decode("latin-1")
        if not target.startswith("/"):
            self._stop(self.app.error(400, "the request target must be a path (origin form)", close=True))
        length = 0
        chunked = False
        encoding = headers.get("transfer-encoding")
        if encoding is not None:
            if version == "1.0":
                self._stop(self.app.error(400, "transfer-encoding is not allowed in HTTP/1.0", close=True))
            if encoding.lower() != "chunked":
                self._stop(self.app.error(501, f"transfer-encoding {encoding[:40]!r} is not supported (only "
                                               f"chunked)", close=True))
            chunked = True
        elif "content-length" in headers:
            length = int(headers["content-length"])   # llhttp checked it: digits only
        if version == "1.1" and "host" not in headers:
            self._stop(self.app.error(400, "an HTTP/1.1 request needs a Host header", close=True))
        connection = headers.get("connection", "").lower()
        if version == "1.0":
            keep_alive = "keep-alive" in connection
        else:
            keep_alive = "close" not in connection
        request = Request(method, target, headers, "HTTP/" + version, self.cert_names, self.peer)
        self.current = request
        self.body = []
        self.body_size = 0
        has_body = chunked or length > 0
        app = self.app
        refusal = app.admit(request)
        if refusal is None and length > app.max_body:
            refusal = app.error(413, f"the body is larger than {app.max_body} bytes (limits.max_http_body_bytes)",
                                close=True)
        if not keep_alive:
            self.keep_alive = False
        if refusal is not None:
            if has_body or refusal.close:
                refusal.close = True
                self._stop(refusal)   # its body is never read
            self.current_refusal = refusal
        else:
            self.current_refusal = None
            self.body_limit = app.max_body
            if has_body:
                self._arm_read(_BODY)
                if headers.get("expect", "").lower() == "100-continue":
                    self.continue_due = True
                    self._send_continue()

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.body_limit:
            self._stop(self.app.error(413, f"the body is larger than {self.app.max_body} bytes "
                                           f"(limits.max_http_body_bytes)", close=True))
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        request = self.current
        assert request is not None
        self.current = None
        self.continue_due = False
        refusal = self.current_refusal
        self.current_refusal = None
        if refusal is None:
            request.body = b"".join(self.body)
        self.body = []
        limit = self.app.time_limit(request) if refusal is None else 0.0
        self._enqueue(_Pending(request, refusal, not self.keep_alive, self.head_at + limit, self.body_size))
        self.read_state = _NOTHING   # armed again once the answers are out (_next)
        self._disarm_read()

    def _stop(self, refusal: Response) -> None:
        """Refuse the request being parsed and parse nothing more (the
        connection closes after the answers before it)."""
        self._refuse(refusal)
        raise _Refused

    def _refuse(self, refusal: Response) -> None:
        if self.stopped:
            return
        self.stopped = True
        refusal.close = True
        self.current = None
        self.body = []
        self._disarm_read()
        self._enqueue(_Pending(None, refusal, True, self.loop.time()))
        self._pause_reading()
        if self.handling is None and not self.closed:
            self._next()

    def _enqueue(self, pending: _Pending) -> None:
        self.queue.append(pending)
        self.queued_bytes += pending.size

    def _send_continue(self) -> None:
        """The interim answer, once every answer before it is out."""
        if self.continue_due and self.handling is None and not self.queue and self.transport is not None:
            self.continue_due = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    # -- deadlines

    def _arm_read(self, state: int) -> None:
        self.read_state = state
        limits = self.limits
        delay = (limits.keepalive_timeout_s if state == _KEEPALIVE else
                 limits.body_timeout_s if state == _BODY else limits.head_timeout_s)
        now = self.loop.time()
        if state == _KEEPALIVE:
            self.idle_since = now
        self.read_deadline = now + delay

    def _disarm_read(self) -> None:
        self.read_deadline = None

    def check(self, now: float) -> None:
        """The listener's sweep: act on a deadline that passed."""
        if self.read_deadline is not None and now >= self.read_deadline:
            self.read_deadline = None
            self._read_expired()
        if self.answer_deadline is not None and now >= self.answer_deadline:
            self.answer_deadline = None
            self._answer_expired()

    def _read_expired(self) -> None:
        if self.closed or self.stopped:
            return
        state = self.read_state
        if state == _BODY:
            self._refuse(self.app.error(408, f"the request body did not arrive within "
                                             f"{self.limits.body_timeout_s:g} s of its head", close=True))
        elif self.in_message or self.blank:
            self._refuse(self.app.error(408, f"the request head did not arrive within "
                                             f"{self.limits.head_timeout_s:g} s", close=True))
        else:   # silent: nothing to answer
            self._close()

    def _answer_expired(self) -> None:
        """The request's time limit passed."""
        self.timed_out = True
        if self.handling is not None:
            self.handling.cancel()   # _run answers 504

    def _write_expired(self) -> None:
        """The client has not read its answers for write_timeout_s: drop them and it."""
        self.write_timer = None
        if self.transport is not None and not self.closed:
            self.listener.counters.http_write_timeouts += 1
            self.closed = True
            self.transport.abort()

    # -- answering

    def _next(self) -> None:
        """Answer the next request in line, or wait for one."""
        if self.closed:
            return
        if self.queue:
            pending = self.queue.popleft()
            self.queued_bytes -= pending.size
            self.handling = self.loop.create_task(self._run(pending))
            return
        if self.stopped:
            self._close()
            return
        if self.reading_paused:
            self.reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        if self.current is not None:
            self._send_continue()
        elif self.read_state == _NOTHING and not self.in_message:
            self._arm_read(_KEEPALIVE)

    async def _run(self, pending: _Pending) -> None:
        request = pending.request
        response = pending.refusal
        if response is None:
            assert request is not None
            self.timed_out = False
            self.answer_deadline = pending.deadline
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
            finally:
                self.answer_deadline = None
        if self.closed:
            self.handling = None
            return
        close = response.close or pending.close or self.app.closing()
        head_only = request is not None and request.method == "HEAD"
        if response.stream is not None and request is not None:
            if request.version == "HTTP/1.0":
                close = True   # no chunked coding: the end of the stream is the end of the connection
            await self._stream(response, close, chunked=request.version != "HTTP/1.0")
            if self.closed:
                self.handling = None
                return
        else:
            self._write(response, close, head_only=head_only)
        if self.can_write is not None and not self.can_write.done():
            await self.can_write   # a slow reader: answer the next request once this one is out
        self.handling = None
        if close:
            self._close()
            return
        self._next()

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
        falls behind, and decides what to drop; after write_timeout_s the
        connection is dropped)."""
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

    def _pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def _close(self) -> None:
        self._disarm_read()
        if self.closed or self.transport is None:
            return
        if self.stopped and self.lingering is None:
            self._linger()
            return
        self.closed = True
        self.transport.close()

    def _linger(self) -> None:
        """Close after a refusal without resetting it away: input the client
        sent that was never read would make the kernel answer the close with
        a reset, which may destroy the refusal before the client reads it.
        So: send the rest, end our side, drain what comes, then close."""
        transport = self.transport
        assert transport is not None
        self.lingering = self.loop.call_later(_LINGER_S, self._close_now)
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()

    def _close_now(self) -> None:
        self.lingering = None
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    @property
    def idle(self) -> bool:
        """An idle keep-alive connection: nothing in flight, nothing arriving."""
        return (self.read_state == _KEEPALIVE and self.handling is None and not self.queue
                and not self.in_message and not self.closed)

    def shut(self) -> None:
        """The listener stops: idle connections close now, busy ones after their answer."""
        if self.handling is None and not self.queue:
            self._close()
        else:
            self.keep_alive = False
            for pending in self.queue:
                pending.close = True


_VERSION_ERRORS = ("Pause on PRI/Upgrade", "Invalid HTTP version")   # (llhttp's words for HTTP/2's preface)


def _parser_reason(exc: Exception) -> str:
    # llhttp's reasons are fixed texts (never the request's bytes).
    text = str(exc) or type(exc).__name__
    return text[:120]


class HttpListener:
    """Serves ``app`` on ``host:port`` (``start`` returns the bound port)."""

    def __init__(self, host: str, port: int, app: App, *, tls: ssl.SSLContext | None = None,
                 limits: HttpLimits | None = None, counters: ServerCounters | None = None) -> None:
        self.host = host
        self.port = port
        self.app = app
        self.tls = tls
        self.limits = limits or HttpLimits()
        self.counters = counters if counters is not None else ServerCounters()
        self.server: asyncio.base_events.Server | None = None
        self.connections: set[_Connection] = set()
        # One sweep checks every connection's deadlines, often enough for the
        # shortest of them to be late by at most a quarter of itself (a second at most).
        bounds = self.limits
        self.tick = max(0.02, min(1.0, bounds.head_timeout_s / 4, bounds.keepalive_timeout_s / 4,
                                  bounds.body_timeout_s / 4))
        self._sweeper: asyncio.TimerHandle | None = None

    def watch(self, connection: _Connection) -> None:
        self.connections.add(connection)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self.tick, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        if not self.connections:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in list(self.connections):
            connection.check(now)
        if self.connections:
            self._sweeper = loop.call_later(self.tick, self._sweep)

    def make_room(self) -> bool:
        """Whether one more connection may be served: at the cap, the
        longest-idle keep-alive connection is closed to make room."""
        if len(self.connections) < self.limits.max_connections:
            return True
        oldest: _Connection | None = None
        for connection in self.connections:
            if connection.idle and (oldest is None or connection.idle_since < oldest.idle_since):
                oldest = connection
        if oldest is None:
            return False
        oldest._close()
        self.connections.discard(oldest)
        return True

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
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await self.server.wait_closed()

