"""gRPC-Web for browsers, on the HTTP listener ([server.grpc_web]).

The book puts gRPC-Web on the gRPC listener; grpcio's listener speaks only
HTTP/2 gRPC, and a proxy in front would hide the caller's address (the
failed-authentication budget is per address) and its client certificate.
So the gateway's own HTTP/1.1 listener answers ``POST /cronoq.v1.<Service>/
<Method>`` with content-type application/grpc-web or application/grpc-web+proto
(binary framing; grpc-web-text is refused with 415), and hands each call to the
``Service`` methods the native gRPC servicers call (grpc_api.py): the same
authentication, roles, pool scoping, shard forwarding and status codes.

Framing (the gRPC-Web protocol): a request body is one frame, a 5-byte
header (flag 0x00, big-endian length) and the message. A unary answer is a
data frame and a trailers frame (flag 0x80) holding ``grpc-status`` and
``grpc-message`` (percent-encoded) as HTTP/1 header lines; an error is a
"trailers-only" answer: status 200, the status in the headers, no body.
Watch answers a chunked body, a data frame per event and the trailers last.
Workers.Work, a bidirectional stream, cannot be carried: UNIMPLEMENTED.

CORS: pages of ``allowed_origins`` get their preflights answered and the
grpc-* headers exposed; pages of other origins are refused (and get no CORS
headers); requests without an Origin (not a browser) or from the server's
own origin need no listing. Credentials are the bearer token alone: no
credentialed CORS (a browser never sends cookies or its certificates here).
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from google.protobuf.message import DecodeError, Message

from .._proto import cronoq_pb2 as pb
from .auth import Authenticator, Principal
from .config import GrpcWebConfig
from .errors import ServiceError
from .http_messages import Request, Response
from .origins import cross_site
from .service import EventStream, Service
from .shards import UNAVAILABLE_METADATA, reply_notes

__all__ = ["GrpcWeb", "PREFIX", "METHODS", "STATUS_NUMBERS", "CONTENT_TYPES"]

log = logging.getLogger("cronoq.server")

PREFIX = "/cronoq.v1."
CONTENT_TYPES = ("application/grpc-web", "application/grpc-web+proto")
_TEXT_TYPES = ("application/grpc-web-text", "application/grpc-web-text+proto")

# The status codes' numbers (the gRPC protocol's), by name.
STATUS_NUMBERS = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10,
    "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}

_DATA, _TRAILERS, _COMPRESSED = 0x00, 0x80, 0x01
_HEADER = struct.Struct(">BI")
_ALLOW_HEADERS = "authorization, content-type, x-grpc-web, x-user-agent, grpc-timeout"
# What a page may read of an answer: the status, and what cronoq adds to it (grpc_api's metadata).
_EXPOSE_HEADERS = ("grpc-status, grpc-message, grpc-status-details-bin, cronoq-error, cronoq-shard, "
                   "cronoq-shard-endpoint, " + UNAVAILABLE_METADATA)
_PREFLIGHT_MAX_AGE = "600"
_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


@dataclass(frozen=True)
class Method:
    """One cronoq.v1 method as gRPC-Web serves it: its request message and
    the ``Service`` method that answers it (None: not carried)."""

    request: type[Message]
    call: str | None
    streams: bool = False


# Every method of cronoq.v1 (tests hold this table to the proto's services).
METHODS: dict[str, Method] = {
    "Tasks/Submit": Method(pb.SubmitRequest, "submit"),
    "Tasks/SubmitBatch": Method(pb.SubmitBatchRequest, "submit_batch"),
    "Tasks/Get": Method(pb.GetRequest, "get"),
    "Tasks/Wait": Method(pb.WaitRequest, "wait"),
    "Tasks/Cancel": Method(pb.CancelRequest, "cancel"),
    "Tasks/ListTasks": Method(pb.ListTasksRequest, "list_tasks"),
    "Tasks/Watch": Method(pb.WatchRequest, "watch", streams=True),
    "Tasks/Explain": Method(pb.ExplainRequest, "explain"),
    "Tasks/Dependents": Method(pb.DependentsRequest, "dependents"),
    "Workers/Work": Method(pb.WorkerMessage, None, streams=True),
    "Admin/ListWorkers": Method(pb.ListWorkersRequest, "list_workers"),
    "Admin/ListRecurring": Method(pb.ListRecurringRequest, "list_recurring"),
    "Admin/AddRecurring": Method(pb.AddRecurringRequest, "add_recurring"),
    "Admin/RemoveRecurring": Method(pb.RemoveRecurringRequest, "remove_recurring"),
    "Admin/Snapshot": Method(pb.SnapshotRequest, "snapshot"),
    "Admin/History": Method(pb.HistoryRequest, "history_of"),
}

_WORK_REFUSAL = ("Workers.Work is a bidirectional stream, which gRPC-Web cannot carry: workers connect over "
                 "native gRPC (server.grpc_addr)")


class _Refusal(Exception):
    """A call refused with a status of its own (one ServiceError has no code for)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Admitted:
    """A gRPC-Web request judged by its head: what ``answer`` needs."""

    name: str                  # "Tasks/Submit"
    method: Method
    caller: Principal
    content_type: str
    cors: tuple[tuple[str, str], ...]
    deadline: float            # loop time by which a unary call must answer
    client_deadline: bool      # the deadline is the caller's grpc-timeout (DEADLINE_EXCEEDED, not CANCELLED)


def grpc_message(text: str) -> str:
    """``text`` percent-encoded as grpc-message wants it (bytes outside
    printable ASCII, and %)."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in text.encode("utf-8"))


def _field(value: str) -> str:
    """A metadata value fit for a header line (no CR, LF or NUL)."""
    return value.replace("\r", " ").replace("\n", " ").replace("\x00", " ")


def frame(flag: int, data: bytes) -> bytes:
    return _HEADER.pack(flag, len(data)) + data


def _status_fields(status: int, message: str, metadata: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    fields = [("grpc-status", str(status))]
    if message:
        fields.append(("grpc-message", grpc_message(message)))
    fields.extend((name, _field(value)) for name, value in metadata)
    return fields


def trailers_frame(status: int, message: str = "", metadata: tuple[tuple[str, str], ...] = ()) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in _status_fields(status, message, metadata))
    return frame(_TRAILERS, lines.encode("latin-1", "replace"))


def _error_metadata(error: ServiceError) -> tuple[tuple[str, str], ...]:
    return ((("cronoq-error", error.kind),) if error.kind else ()) + error.metadata


def parse_timeout(text: str) -> float:
    """grpc-timeout ("500m", "10S") in seconds."""
    match = _TIMEOUT.fullmatch(text.strip())
    if match is None:
        raise _Refusal(STATUS_NUMBERS["INTERNAL"], f"malformed grpc-timeout {text[:20]!r}: up to 8 digits and "
                                                   f"a unit (H, M, S, m, u, n), e.g. 500m")
    return int(match.group(1)) * _TIMEOUT_UNITS[match.group(2)]


class GrpcWeb:
    """The gRPC-Web calls of a Gateway: ``admit`` judges a request's head,
    ``answer`` the call; ``preflight`` answers CORS preflights."""

    def __init__(self, service: Service, auth: Authenticator, config: GrpcWebConfig, *, max_body: int) -> None:
        self.service = service
        self.auth = auth
        self.origins = frozenset(config.allowed_origins)
        self.max_body = max_body
        limits = service.limits
        self.deadline = limits.max_wait_s + limits.request_timeout_s   # as native gRPC's unary calls

    @staticmethod
    def serves(path: str) -> bool:
        return path.startswith(PREFIX)

    # -- answers

    def _cors(self, request: Request) -> tuple[tuple[str, str], ...]:
        """The CORS headers of an answer to ``request`` (none for origins not listed)."""
        origin = request.headers.get("origin")
        if origin is not None and origin.strip().lower() in self.origins:
            return (("access-control-allow-origin", origin.strip()), ("access-control-expose-headers", _EXPOSE_HEADERS),
                    ("vary", "origin"))
        return (("vary", "origin"),)

    @staticmethod
    def _content_type(request: Request) -> str:
        given = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        return given if given in CONTENT_TYPES else CONTENT_TYPES[1]

    def trailers_only(self, request: Request, status: int, message: str,
                      metadata: tuple[tuple[str, str], ...] = (), *, close: bool = False) -> Response:
        """An answer without messages: the status in the headers (HTTP 200)."""
        headers = tuple(_status_fields(status, message, metadata)) + self._cors(request)
        return Response(200, b"", self._content_type(request), headers=headers, close=close)

    def service_error(self, request: Request, error: ServiceError, *, close: bool = False) -> Response:
        return self.trailers_only(request, STATUS_NUMBERS[error.code.grpc_name], error.message,
                                  _error_metadata(error), close=close)

    # -- the head

    def admit(self, request: Request, *, host_ok: bool) -> Response | None:
        """Judge the head: the Host rule, the origin, the method and media
        type, the size, and the caller's credentials. A refusal, or None
        (``request.admitted`` is then an ``Admitted``, or None for a preflight)."""
        request.admitted = None
        headers = request.headers
        if not host_ok:
            return self.trailers_only(request, STATUS_NUMBERS["PERMISSION_DENIED"],
                                      "forbidden: authentication is off, so only loopback host names are served "
                                      "(localhost, *.localhost, 127.x.x.x, [::1])")
        if request.method == "OPTIONS":
            return self._preflight(request)
        if request.method != "POST":
            return Response(405, b"gRPC-Web calls are POST requests\n", "text/plain; charset=utf-8",
                            headers=(("allow", "POST, OPTIONS"),) + self._cors(request))
        origin = headers.get("origin")
        if origin is not None and origin.strip().lower() not in self.origins:
            if cross_site(headers) is not None:
                return self.trailers_only(request, STATUS_NUMBERS["PERMISSION_DENIED"],
                                          f"forbidden: the origin {origin[:80]} is not in "
                                          f"server.grpc_web.allowed_origins")
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media not in CONTENT_TYPES:
            if media in _TEXT_TYPES:
                reason = (f"{media} (base64 framing) is not supported: send application/grpc-web+proto "
                          f"(binary framing)")
            else:
                reason = (f"the content-type must be application/grpc-web or application/grpc-web+proto, got "
                          f"{media[:60]!r} (native gRPC is served on server.grpc_addr)")
            return Response(415, reason.encode() + b"\n", "text/plain; charset=utf-8", headers=self._cors(request))
        name = request.path[len(PREFIX):]
        method = METHODS.get(name)
        if method is None:
            return self.trailers_only(request, STATUS_NUMBERS["UNIMPLEMENTED"],
                                      f"unknown method {request.path[:120]}: the cronoq.v1 services are Tasks, "
                                      f"Admin and Workers")
        if method.call is None:
            return self.trailers_only(request, STATUS_NUMBERS["UNIMPLEMENTED"], _WORK_REFUSAL)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return self.trailers_only(request, STATUS_NUMBERS["RESOURCE_EXHAUSTED"],
                                      f"the request is larger than {self.max_body} bytes "
                                      f"(limits.max_http_body_bytes)", close=True)
        loop_now = asyncio.get_running_loop().time()
        deadline, client_deadline = loop_now + self.deadline, False
        try:
            timeout = headers.get("grpc-timeout")
            if timeout is not None and not method.streams:
                seconds = parse_timeout(timeout)
                if seconds < self.deadline:
                    deadline, client_deadline = loop_now + seconds, True
            caller = self.auth.authenticate(headers.get("authorization"), request.cert_names, peer=request.peer,
                                            transport="grpc")
        except ServiceError as exc:
            return self.service_error(request, exc)
        except _Refusal as exc:
            return self.trailers_only(request, exc.status, exc.message)
        request.admitted = Admitted(name, method, caller, self._content_type(request), self._cors(request),
                                    deadline, client_deadline)
        return None

    def _preflight(self, request: Request) -> Response:
        headers = request.headers
        origin = headers.get("origin", "").strip()
        asked = headers.get("access-control-request-method", "")
        vary = ("vary", "origin, access-control-request-method, access-control-request-headers")
        if origin.lower() not in self.origins or asked != "POST":
            why = (f"the origin {origin[:80] or '(none)'} is not in server.grpc_web.allowed_origins"
                   if origin.lower() not in self.origins else f"gRPC-Web calls are POST requests, not {asked[:20]!r}")
            return Response(403, f"preflight refused: {why}\n".encode(), "text/plain; charset=utf-8",
                            headers=(vary,))
        return Response(200, b"", "text/plain; charset=utf-8", headers=(
            ("access-control-allow-origin", origin), ("access-control-allow-methods", "POST"),
            ("access-control-allow-headers", _ALLOW_HEADERS), ("access-control-max-age", _PREFLIGHT_MAX_AGE), vary))

    # -- the call

    async def answer(self, request: Request, admitted: Admitted) -> Response:
        try:
            message = self._message(request, admitted)
        except _Refusal as exc:
            return self.trailers_only(request, exc.status, exc.message)
        call: Callable[[Principal, Any], Awaitable[Any]] = getattr(self.service, admitted.method.call or "")
        if admitted.method.streams:
            return await self._watch(request, admitted, message)
        notes: list[tuple[str, str]] = []
        try:
            if self.service.sharded:
                reply_notes.set(notes)
            async with asyncio.timeout_at(admitted.deadline):   # in this task (see grpc_api.unary)
                answer = await call(admitted.caller, message)
        except ServiceError as exc:
            return self.service_error(request, exc)
        except asyncio.TimeoutError:
            if admitted.client_deadline:
                return self.trailers_only(request, STATUS_NUMBERS["DEADLINE_EXCEEDED"],
                                          "deadline exceeded (the request's grpc-timeout)")
            return self.trailers_only(request, STATUS_NUMBERS["CANCELLED"],
                                      f"the call ran longer than {self.deadline:g} s")
        except Exception:
            log.exception("internal error in gRPC-Web %s", admitted.name)
            return self.trailers_only(request, STATUS_NUMBERS["INTERNAL"], "internal error (logged by the server)")
        body = frame(_DATA, answer.SerializeToString()) + trailers_frame(0, "", tuple(notes))
        return Response(200, body, admitted.content_type, headers=admitted.cors)

    def _message(self, request: Request, admitted: Admitted) -> Message:
        """The request's one message, from its one data frame."""
        body = request.body
        kind = admitted.method.request.DESCRIPTOR.full_name
        internal = STATUS_NUMBERS["INTERNAL"]
        if len(body) < _HEADER.size:
            raise _Refusal(internal, f"malformed gRPC-Web request: the body ({len(body)} bytes) holds no frame "
                                     f"(a 5-byte header, then the {kind} message)")
        flag, length = _HEADER.unpack_from(body)
        if flag & _TRAILERS:
            raise _Refusal(internal, "malformed gRPC-Web request: a trailers frame where the request message "
                                     "belongs")
        if flag & _COMPRESSED:
            raise _Refusal(STATUS_NUMBERS["UNIMPLEMENTED"], "compressed messages are not supported (send them "
                                                            "uncompressed, without grpc-encoding)")
        if flag:
            raise _Refusal(internal, f"malformed gRPC-Web request: unknown frame flag 0x{flag:02x}")
        if length != len(body) - _HEADER.size:
            raise _Refusal(internal, f"malformed gRPC-Web request: the frame says {length} bytes, the body holds "
                                     f"{len(body) - _HEADER.size} after its header (a request is one data frame)")
        try:
            return admitted.method.request.FromString(body[_HEADER.size:])
        except DecodeError as exc:
            raise _Refusal(internal, f"the request message is not a valid {kind}: {exc}") from None

    async def _watch(self, request: Request, admitted: Admitted, message: Any) -> Response:
        try:
            events, missing = await self.service.watch(admitted.caller, message)
        except ServiceError as exc:
            return self.service_error(request, exc)
        headers = admitted.cors + (((UNAVAILABLE_METADATA, ",".join(missing)),) if missing else ())
        return Response(200, b"", admitted.content_type, headers=headers, stream=self._events(events))

    @staticmethod
    async def _events(events: EventStream) -> AsyncIterator[bytes]:
        """A frame per event, then the trailers (the stream's end or its error).
        The listener stops it (and the events' subscription) when the client goes."""
        try:
            async for event in events:
                yield frame(_DATA, event.SerializeToString())
        except ServiceError as exc:
            yield trailers_frame(STATUS_NUMBERS[exc.code.grpc_name], exc.message, _error_metadata(exc))
            return
        except Exception:
            log.exception("internal error in a gRPC-Web Watch")
            yield trailers_frame(STATUS_NUMBERS["INTERNAL"], "internal error (logged by the server)")
            return
        finally:
            await events.aclose()
        yield trailers_frame(0)
