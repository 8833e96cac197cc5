"""What an HTTP listener and the app it serves exchange: a ``Request``, a
``Response``, the ``App`` protocol, the listener's ``HttpLimits``, and the
reason phrases of the statuses they use (``http.py`` is the listener)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Protocol

from ..loopback import is_loopback

__all__ = ["HttpLimits", "Request", "Response", "App", "loopback_host", "REASONS", "reason_code"]

# Reason phrases (RFC 9110); error bodies carry them lower-case with underscores.
REASONS = {
    100: "Continue", 200: "OK", 308: "Permanent Redirect", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
    413: "Content Too Large", 415: "Unsupported Media Type", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 499: "Client Closed Request", 500: "Internal Server Error",
    501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported",
}


def reason_code(status: int) -> str:
    """The ``code`` of an error body: the reason phrase, lower-case, words joined by ``_``."""
    return REASONS.get(status, "Error").lower().replace(" ", "_")


def loopback_host(host_header: str) -> bool:
    """Whether a Host header names this machine's loopback: localhost,
    *.localhost, 127.x.x.x or [::1] (a port may follow)."""
    host = host_header.strip()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return is_loopback(host)


@dataclass(frozen=True)
class HttpLimits:
    """What one listener allows its clients (the HTTP keys of [limits])."""

    max_connections: int = 1000
    head_timeout_s: float = 15.0
    keepalive_timeout_s: float = 65.0
    body_timeout_s: float = 30.0
    write_timeout_s: float = 30.0


class Request:
    """One request: ``method``, ``target`` (as sent), ``path`` (percent-encoded,
    without the query), ``query`` (the text after ``?``), ``headers`` (names
    lower-case; repeated fields joined with ``, ``), ``body``, the DNS names
    of a verified client certificate, and the client's address (``peer``).
    ``admitted`` is the app's own record of the head (see ``App.admit``)."""

    __slots__ = ("method", "target", "path", "query", "headers", "body", "version", "cert_names", "peer",
                 "admitted")

    def __init__(self, method: str, target: str, headers: dict[str, str], version: str,
                 cert_names: tuple[str, ...] = (), peer: str = "") -> None:
        self.method = method
        self.target = target
        path, _, query = target.partition("?")
        self.path = path
        self.query = query
        self.headers = headers
        self.body = b""
        self.version = version
        self.cert_names = cert_names
        self.peer = peer
        self.admitted: Any = None


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

    def admit(self, request: Request) -> Response | None:
        """Judge a request by its head, before its body is read: a refusal
        (the body is then never read), or None to go on."""

    def error(self, status: int, message: str, *, close: bool = False) -> Response:
        """The response for an error the listener finds itself."""

    def closing(self) -> bool:
        """Whether responses should close their connections now (a standby)."""

    def __call__(self, request: Request) -> Awaitable[Response]: ...
