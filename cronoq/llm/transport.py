"""The provider's HTTP/1.1 client: keep-alive connections on asyncio streams
(TLS for https), one request at a time on each, at most ``max_connections``
of them. It is what cronoq.llm needs and no more: a JSON body with a
Content-Length out; a status line, headers and a body framed by
Content-Length, chunked transfer coding or the connection's close back
(gzip or deflate decoded).

httpx did this before at about 2.5 ms of the worker's CPU per request with
16 connections (its pool scans every connection on each request and asks
each socket whether it is readable); this one needs about 0.1 ms
(bench/README.md, "The LLM worker").

Failures are the exceptions below; cronoq.llm.provider turns them into
cronoq's outcomes. A reused connection that closes before a byte of the
answer came, or answers 408 and closes (the server timed the idle
connection out as the request went out), is replaced once by a new
connection and the request sent again. The
calls sent here change nothing on the provider's side but the usage they
bill, so a repeat is safe in RFC 9112's sense (9.3.1): at worst a second
generation of the same request. A new connection is never retried here.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import zlib
from typing import Any, AsyncGenerator
from urllib.parse import urlsplit

from .._version import __version__

# A head (status line and headers) longer than this is not an answer we parse.
MAX_HEAD_BYTES = 64 * 1024
_MAX_LINE_BYTES = 8 * 1024   # a chunk-size or trailer line
_READ_BYTES = 64 * 1024
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_DIGITS = re.compile(rb"[0-9]{1,18}")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NO_BODY = frozenset({204, 304})
# Content codings decoded (what httpx asked for too): gzip, and deflate in its zlib wrapper.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class TransportError(Exception):
    """A request that got no usable answer."""


class ConnectFailed(TransportError):
    """The connection (or its TLS handshake) could not be made."""


class TimedOut(TransportError):
    """Connecting, or waiting for the next bytes of the answer, took longer than allowed."""


class ConnectionLost(TransportError):
    """The server closed or reset the connection before the answer's end."""


class Malformed(TransportError):
    """The answer is not HTTP/1.1 we can read (status line, a header, the framing)."""


class TooLarge(TransportError):
    """The answer is larger than ``max_response_bytes``."""


class Response:
    """A complete answer: ``status_code``, ``headers`` (lower-case names; a
    repeated header's values joined by ", ") and ``content`` (bytes)."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str] | None = None, content: bytes = b"") -> None:
        self.status_code = status_code
        self.headers = headers or {}
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _Stale(Exception):
    """A reused connection closed before the first byte of the answer."""


class _Connection:
    """One socket, its unread bytes, and how many requests it has carried."""

    __slots__ = ("reader", "writer", "buffer", "used")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.used = 0

    def usable(self) -> bool:
        """Still worth a request: open, and the server sent nothing unasked."""
        return not self.buffer and not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()

    async def fill(self, timeout: float) -> bool:
        """Read what the socket has (waiting at most ``timeout``); False at its end."""
        try:
            async with asyncio.timeout(timeout):
                data = await self.reader.read(_READ_BYTES)
        except TimeoutError:
            raise TimedOut(f"no bytes from the server for {timeout:g} s") from None
        except OSError as exc:
            raise ConnectionLost(f"{type(exc).__name__} reading the answer: {exc}") from None
        if not data:
            return False
        self.buffer += data
        return True


class _Head:
    __slots__ = ("status", "headers", "keep_alive", "length", "chunked", "wbits")

    def __init__(self, status: int, headers: dict[str, str], keep_alive: bool, length: int | None,
                 chunked: bool, wbits: int | None) -> None:
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        self.length = length     # None: chunked or until the close
        self.chunked = chunked
        self.wbits = wbits       # a compressed body: zlib's window bits for it


def parse_head(raw: bytes, method: str) -> _Head:
    """The status line and headers (without the blank line ending them)."""
    lines = raw.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, _reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit() or code[0] in b"06789":
        raise Malformed(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    status = int(code)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):   # also a folded line (leading space) or a bare line
            raise Malformed(f"a malformed header line: {line[:100]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
    keep_alive = "close" not in tokens if version == b"HTTP/1.1" else "keep-alive" in tokens
    length: int | None = None
    chunked = False
    if status in _NO_BODY or status < 200 or method == "HEAD":
        length = 0
    elif "transfer-encoding" in headers:
        if headers["transfer-encoding"].strip().lower() != "chunked":   # no request here offers others (TE)
            raise Malformed(f"a transfer coding this client does not decode: {headers['transfer-encoding'][:100]!r}")
        chunked = True
        # With Transfer-Encoding a Content-Length is ignored, and the connection not trusted again.
        keep_alive = keep_alive and "content-length" not in headers
    elif "content-length" in headers:
        values = {v.strip() for v in headers["content-length"].split(",")}
        if len(values) != 1 or not _DIGITS.fullmatch(next(iter(values)).encode("latin-1")):
            raise Malformed(f"a malformed Content-Length: {headers['content-length'][:100]!r}")
        length = int(next(iter(values)))
    if length is None and not chunked:
        keep_alive = False   # the body ends with the connection
    coding = headers.get("content-encoding", "").strip().lower()
    wbits = None
    if coding and coding != "identity":
        if coding not in _WBITS:
            raise Malformed(f"a content coding this client does not decode: {headers['content-encoding'][:100]!r}")
        wbits = _WBITS[coding]
    return _Head(status, headers, keep_alive, length, chunked, wbits)


class _Body:
    """The body's pieces as they arrive, by the head's framing; ``done`` once
    all of it was read (then the connection may carry another request)."""

    def __init__(self, connection: _Connection, head: _Head, limit: int, timeout: float) -> None:
        self.connection = connection
        self.head = head
        self.limit = limit
        self.timeout = timeout
        self.received = 0
        self.done = False
        self._left = head.length   # of a Content-Length body, or of the current chunk
        self._decoder = zlib.decompressobj(head.wbits) if head.wbits is not None else None
        self._decoded = 0
        if head.length is not None and head.length > limit:
            raise TooLarge(f"the answer's Content-Length {head.length} is over the limit of {limit} bytes")

    async def piece(self) -> bytes | None:
        """The next bytes of the body (decompressed), None at its end."""
        decoder = self._decoder
        if decoder is None:
            return await self._raw()
        while not decoder.eof:
            raw = await self._raw()
            if raw is None:
                raise Malformed("the compressed body ends before its end")
            # At most the bytes left below the limit (and one more): a small body may inflate enormously.
            try:
                data = decoder.decompress(raw, self.limit - self._decoded + 1)
            except zlib.error as exc:
                raise Malformed(f"the compressed body does not decode: {exc}") from None
            self._decoded += len(data)
            if self._decoded > self.limit:
                raise TooLarge(f"the answer is over the limit of {self.limit} bytes (decompressed)")
            if data:
                return data
        while await self._raw() is not None:   # the framing's end after the compressed stream's
            pass
        return None

    async def _raw(self) -> bytes | None:
        """The next bytes of the body as sent, None at its end."""
        if self.done:
            return None
        if self.head.chunked:
            return await self._chunk()
        connection = self.connection
        if self._left is not None:   # Content-Length
            if self._left == 0:
                self.done = True
                return None
            if not connection.buffer and not await connection.fill(self.timeout):
                raise ConnectionLost(f"the connection closed with {self._left} bytes of the body unread")
            data = bytes(connection.buffer[:self._left])
            del connection.buffer[:len(data)]
            self._left -= len(data)
            return data
        if not connection.buffer and not await connection.fill(self.timeout):   # until the close
            self.done = True
            return None
        data = bytes(connection.buffer)
        connection.buffer.clear()
        return self._count(data)

    def _count(self, data: bytes) -> bytes:
        self.received += len(data)
        if self.received > self.limit:
            raise TooLarge(f"the answer is over the limit of {self.limit} bytes")
        return data

    async def _line(self) -> bytes:
        connection = self.connection
        while True:
            end = connection.buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(connection.buffer[:end])
                del connection.buffer[:end + 2]
                return line
            if len(connection.buffer) > _MAX_LINE_BYTES:
                raise Malformed("a chunk-size or trailer line over 8 KiB")
            if not await connection.fill(self.timeout):
                raise ConnectionLost("the connection closed inside a chunked body")

    async def _chunk(self) -> bytes | None:
        connection = self.connection
        while not self._left:
            if self._left == 0:   # the CRLF after a chunk's data
                if await self._line():
                    raise Malformed("a chunk's data is not followed by CRLF")
            size = (await self._line()).split(b";", 1)[0].strip(b" \t")
            if not _HEX.fullmatch(size):
                raise Malformed(f"a malformed chunk size: {size[:40]!r}")
            self._left = int(size, 16)
            if self._left == 0:
                while await self._line():   # trailers, up to the blank line
                    pass
                self.done = True
                return None
        if not connection.buffer and not await connection.fill(self.timeout):
            raise ConnectionLost("the connection closed inside a chunk")
        data = bytes(connection.buffer[:self._left])
        del connection.buffer[:len(data)]
        self._left -= len(data)
        return self._count(data)

    async def read(self) -> bytes:
        connection = self.connection
        left = self._left
        if self._decoder is None and not self.head.chunked and left is not None and len(connection.buffer) >= left:
            # The usual case: the whole body came with the head.
            data = bytes(connection.buffer[:left])
            del connection.buffer[:left]
            self._left = 0
            self.done = True
            return data
        parts = []
        while (part := await self.piece()) is not None:
            parts.append(part)
        return b"".join(parts)


class HTTPClient:
    """Requests to one origin (the scheme, host and port of ``base_url``);
    a request's path is appended to ``base_url``'s path."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, *, connect_timeout: float = 10.0,
                 read_timeout: float = 120.0, max_connections: int = 100,
                 max_response_bytes: int = 256 * 1024 * 1024, ssl_context: ssl.SSLContext | None = None) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = (ssl_context or ssl.create_default_context()) if url.scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_response_bytes = max_response_bytes
        self.origin = f"{url.scheme}://{url.netloc.rpartition('@')[2]}"
        self._prefix = url.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        if url.port is not None:
            host = f"{host}:{url.port}"
        fixed = {"Host": host, "User-Agent": f"cronoq-llm/{__version__}", "Accept": "*/*",
                 "Accept-Encoding": "gzip, deflate", **(headers or {})}
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    # -- connections

    async def _open(self) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None,
                    limit=_READ_BYTES)
        except TimeoutError:
            raise TimedOut(f"connecting to {self.origin} took over {self.connect_timeout:g} s") from None
        except OSError as exc:   # refused, unreachable, a name that does not resolve, a TLS failure
            raise ConnectFailed(f"cannot connect to {self.origin}: {type(exc).__name__}: {exc}") from None
        return _Connection(reader, writer)

    def _pooled(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()   # the most recent: the least likely to have timed out
            if connection.usable():
                return connection
            connection.close()
        return None

    def _release(self, connection: _Connection, reusable: bool) -> None:
        if reusable and not self._closed and connection.usable():
            self._idle.append(connection)
        else:
            connection.close()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    # -- one exchange

    def _message(self, method: str, path: str, body: bytes) -> bytes:
        head = (f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._fixed}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode("latin-1") + body

    async def _send(self, connection: _Connection, message: bytes, method: str) -> _Head:
        """Write the request and read the answer's head (1xx heads skipped)."""
        connection.used += 1
        reused = connection.used > 1
        writer = connection.writer
        try:
            writer.write(message)
            if writer.transport.get_write_buffer_size():   # the socket took less than all of it
                async with asyncio.timeout(self.read_timeout):
                    await writer.drain()
        except TimeoutError:
            raise TimedOut(f"sending the request took over {self.read_timeout:g} s") from None
        except OSError as exc:
            if reused:
                raise _Stale from None
            raise ConnectionLost(f"{type(exc).__name__} sending the request: {exc}") from None
        buffer = connection.buffer
        while True:
            searched = 0
            while (end := buffer.find(b"\r\n\r\n", searched)) < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise Malformed(f"the answer's head is over {MAX_HEAD_BYTES} bytes")
                searched = max(0, len(buffer) - 3)
                try:
                    more = await connection.fill(self.read_timeout)
                except ConnectionLost:
                    if reused and not buffer:
                        raise _Stale from None
                    raise
                if not more:
                    if reused and not buffer:
                        raise _Stale
                    raise ConnectionLost("the server closed the connection before the answer's head"
                                         + (f" (got {bytes(buffer[:100])!r})" if buffer else ""))
            head = parse_head(bytes(buffer[:end]), method)
            del buffer[:end + 4]
            if head.status == 408 and reused and not head.keep_alive:
                raise _Stale   # a server that names its idle timeout before it closes the connection
            if head.status >= 200:
                return head
            if head.status == 101:
                raise Malformed("the server switched protocols (101), which no request here asks for")
            reused = False   # an interim answer (100, 103): the final one follows

    async def _exchange(self, method: str, path: str, body: bytes) -> tuple[_Connection, _Head]:
        """A connection (pooled or new) with the request sent and the answer's
        head read; a stale pooled connection is replaced once."""
        message = self._message(method, path, body)
        connection = self._pooled() or await self._open()
        try:
            return connection, await self._send(connection, message, method)
        except _Stale:
            connection.close()
        except BaseException:
            connection.close()
            raise
        connection = await self._open()
        try:
            return connection, await self._send(connection, message, method)
        except BaseException:
            connection.close()
            raise

    async def request(self, method: str, path: str, body: bytes = b"") -> Response:
        """The whole answer to one request."""
        async with self._slots:
            connection, head = await self._exchange(method, path, body)
            try:
                content = await _Body(connection, head, self.max_response_bytes, self.read_timeout).read()
            except BaseException:   # a failure or a cancel mid-body: the connection is in an unknown state
                connection.close()
                raise
            self._release(connection, head.keep_alive)
            return Response(head.status, head.headers, content)

    def stream(self, method: str, path: str, body: bytes = b"") -> Streamed:
        """``async with client.stream(...) as answer``: the head at once, the body as it comes."""
        return Streamed(self, method, path, body)


class Streamed:
    """An answer read as it arrives (``lines()``) or whole (``read()``).
    Leaving the block before the body's end, by a break, an error or a
    cancel, closes the connection: the server sees the client go (a
    provider stops generating)."""

    def __init__(self, client: HTTPClient, method: str, path: str, body: bytes) -> None:
        self._client = client
        self._request = (method, path, body)
        self._connection: _Connection | None = None
        self._body: _Body | None = None
        self.status_code = 0
        self.headers: dict[str, str] = {}

    async def __aenter__(self) -> Streamed:
        client = self._client
        await client._slots.acquire()
        try:
            self._connection, head = await client._exchange(*self._request)
            self._body = _Body(self._connection, head, client.max_response_bytes, client.read_timeout)
        except BaseException:
            if self._connection is not None:
                self._connection.close()
            client._slots.release()
            raise
        self.status_code = head.status
        self.headers = head.headers
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._connection is not None and self._body is not None
        self._client._release(self._connection, self._body.done and self._body.head.keep_alive)
        self._client._slots.release()

    async def read(self) -> Response:
        """The rest of the body, as a complete answer."""
        assert self._body is not None
        return Response(self.status_code, self.headers, await self._body.read())

    async def lines(self) -> AsyncGenerator[str, None]:
        """The body's lines (CRLF, LF or CR ended, without the ending), decoded as UTF-8."""
        assert self._body is not None
        pending = b""
        while (piece := await self._body.piece()) is not None:
            pending += piece
            lines = pending.splitlines(keepends=True)
            # The last piece waits for more: no ending yet, or a CR whose LF may come next.
            pending = lines.pop() if lines and (lines[-1][-1:] not in b"\r\n" or lines[-1].endswith(b"\r")) else b""
            if pending and len(pending) > self._body.limit:
                raise TooLarge(f"a line over the limit of {self._body.limit} bytes")
            for line in lines:
                yield line.rstrip(b"\r\n").decode("utf-8", "replace")
        if pending:
            yield pending.rstrip(b"\r\n").decode("utf-8", "replace")
