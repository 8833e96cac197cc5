"""Conversions between Python values and the cronoq.v1 messages, and the
mapping of gRPC errors to cronoq's exception types (shared by Client and Worker)."""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import math
import random
from typing import Any, Awaitable, Callable, Iterable, Mapping, TypeVar

import grpc

from .. import errors as _errors
from ..errors import AccessDenied, ServerError
from .._proto import cronoq_pb2 as pb
from ..core.types import CLASSES, NS, Dep, Priority, RetryPolicy, TaskSpec

__all__ = ["call", "shards_named", "UNAVAILABLE_SHARDS", "encode", "decode", "task_message", "error_from", "ServerError", "AccessDenied", "channel",
           "OCTETS", "JSON",
           "TEXT"]

OCTETS = "application/octet-stream"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
_JSON_ENCODE = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode


_ADMISSION: dict[str, type[Exception]] = {name: getattr(_errors, name) for name in (
    "AdmissionError", "InvalidTask", "Cycle", "UnknownDependency", "UnknownPool", "UnknownResource",
    "ResourceExceedsCapacity", "QueueFull", "ReservationConflict")}


def error_from(exc: grpc.aio.AioRpcError, ref: int | str | None = None) -> Exception:
    """The cronoq exception a failed call stands for."""
    code = exc.code()
    message = exc.details() or code.name
    kind = None
    for key, value in exc.trailing_metadata() or ():
        if key == "cronoq-error":
            kind = value
    if kind == "UnknownTask" or (code == grpc.StatusCode.NOT_FOUND and kind is None and ref is not None):
        error = _errors.UnknownTask(ref if ref is not None else message)
        error.args = (message,)
        return error
    if kind in _ADMISSION:
        return _ADMISSION[kind](message)
    if code == grpc.StatusCode.UNAVAILABLE:
        return _errors.SchedulerError(message)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TimeoutError(message)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AccessDenied(code.name, message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return _errors.InvalidTask(message)
    return ServerError(code.name, message)


T = TypeVar("T")


async def call(make: Callable[[], Awaitable[T]], retry_for: float, ref: int | str | None = None) -> T:
    """Run one unary call, retrying UNAVAILABLE with jittered backoff for up to
    ``retry_for`` seconds; any other failure raises the cronoq exception it stands for."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + retry_for
    delay = 0.05
    while True:
        try:
            return await make()
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE and loop.time() + delay < give_up:
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, 2.0)
                continue
            raise error_from(exc, ref) from None


# The response metadata in which a sharded server names the shards it could not ask.
UNAVAILABLE_SHARDS = "cronoq-unavailable-shards"


def shards_named(metadata: Any) -> tuple[str, ...]:
    """The shards that a call's ``cronoq-unavailable-shards`` metadata names."""
    for key, value in metadata or ():
        if key == UNAVAILABLE_SHARDS and isinstance(value, str):
            return tuple(name for name in value.split(",") if name)
    return ()


async def noted_call(make: Callable[[], Any], retry_for: float, ref: int | str | None = None
                     ) -> tuple[Any, tuple[str, ...]]:
    """``call``, and the shards its answer names as not asked (Get, Explain
    and Wait by key on a sharded server)."""
    calls: list[Any] = []

    def start() -> Any:
        calls.append(make())
        return calls[-1]

    answer = await call(start, retry_for, ref)
    return answer, shards_named(await calls[-1].trailing_metadata())


def encode(value: Any, content_type: str | None = None) -> tuple[bytes, str]:
    """A payload or output as bytes and a content type: bytes as they are,
    str as UTF-8 text, anything else as JSON (``TypeError`` if JSON cannot
    hold it)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), content_type or OCTETS
    if isinstance(value, str):
        return value.encode("utf-8"), content_type or TEXT
    try:
        return _JSON_ENCODE(value).encode("utf-8"), content_type or JSON
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot send a {type(value).__name__} as JSON: {exc} (pass bytes or str instead)") from None


def decode(data: bytes, content_type: str) -> Any:
    """What ``encode`` made: JSON parsed, text as str, anything else as bytes."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        return json.loads(data)
    if kind.startswith("text/"):
        return data.decode("utf-8")
    return bytes(data)


def ref_message(ref: int | str) -> pb.TaskRef:
    if isinstance(ref, bool) or not isinstance(ref, (int, str)):
        raise TypeError(f"a task is named by its id (int) or key (str), got {type(ref).__name__}")
    return pb.TaskRef(id=ref) if isinstance(ref, int) else pb.TaskRef(key=ref)


def _unix_ns(value: Any, field: str) -> int:
    if isinstance(value, _dt.datetime):
        moment: _dt.datetime = value if value.tzinfo is not None else value.replace(tzinfo=_dt.timezone.utc)
        return round(moment.timestamp() * NS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be a datetime or Unix seconds, got {value!r}")
    return round(value * NS)


_PRIORITY: dict[int, pb.Priority] = {0: pb.PRIORITY_CRITICAL, 1: pb.PRIORITY_HIGH, 2: pb.PRIORITY_NORMAL,
                                     3: pb.PRIORITY_LOW}
_COND = {"success": pb.EDGE_COND_ON_SUCCESS, "failure": pb.EDGE_COND_ON_FAILURE,
         "complete": pb.EDGE_COND_ON_COMPLETE}
_MISS = {"run_late": pb.MISS_POLICY_RUN_LATE, "skip": pb.MISS_POLICY_SKIP, "fail": pb.MISS_POLICY_FAIL}


def priority_value(priority: Any) -> pb.Priority:
    if isinstance(priority, Priority):
        return _PRIORITY[int(priority)]
    if isinstance(priority, str) and priority.lower() in CLASSES:
        return _PRIORITY[CLASSES.index(priority.lower())]
    raise ValueError(f"priority must be one of {', '.join(CLASSES)}, got {priority!r}")


def task_message(payload: Any = None, *, content_type: str | None = None, pool: str | None = None,
                 kind: str | None = None, priority: Any = None, key: str | None = None, tenant: str | None = None,
                 deadline_in: float | None = None, deadline_at: Any = None, start_in: float | None = None,
                 start_at: Any = None, tolerance: float | None = None, on_miss: str | None = None,
                 timeout: float | None = None, duration_hint: float | None = None,
                 retry: RetryPolicy | None = None, resources: Mapping[str, int] | None = None,
                 after: Any = None, deps: Iterable[Dep] | None = None, tags: Mapping[str, str] | None = None,
                 labels: Mapping[str, str] | None = None, stages: Iterable[str] | None = None) -> pb.TaskSpec:
    """A TaskSpec message from ``cronoq.Task``-style options."""
    data, ctype = encode(payload, content_type) if payload is not None or content_type else (b"", "")
    spec = pb.TaskSpec(payload=data, content_type=ctype)
    if pool is not None:
        spec.pool = pool
    if kind is not None:
        spec.kind = kind
    if priority is not None:
        spec.priority = priority_value(priority)
    if key is not None:
        spec.key = key
    if tenant is not None:
        spec.tenant = tenant
    if deadline_in is not None:
        spec.deadline_in_s = deadline_in
    if deadline_at is not None:
        spec.deadline_unix_ns = _unix_ns(deadline_at, "deadline_at")
    if start_in is not None:
        spec.start_in_s = start_in
    if start_at is not None:
        spec.start_unix_ns = _unix_ns(start_at, "start_at")
    if tolerance is not None:
        spec.tolerance_s = tolerance
    if on_miss is not None:
        if on_miss not in _MISS:
            raise ValueError(f"on_miss must be one of {', '.join(_MISS)}, got {on_miss!r}")
        spec.on_miss = _MISS[on_miss]
    if timeout is not None:
        spec.timeout_s = timeout
    if duration_hint is not None:
        spec.duration_hint_s = duration_hint
    if retry is not None:
        spec.retry.CopyFrom(pb.RetryPolicy(max_attempts=retry.max_attempts, initial_backoff_s=retry.initial_backoff,
                                           multiplier=retry.multiplier, max_backoff_s=retry.max_backoff,
                                           jitter=retry.jitter))
    if resources:
        spec.resources.update(resources)
    if after is not None:
        refs = [after] if isinstance(after, (int, str)) and not isinstance(after, bool) else list(after)
        spec.after.extend(ref_message(ref) for ref in refs)
    if deps is not None:
        for dep in ([deps] if isinstance(deps, Dep) else deps):
            spec.deps.add(ref=ref_message(dep.ref), cond=_COND[dep.on])
    if tags:
        spec.tags.update(tags)
    if labels:
        spec.labels.update(labels)
    if stages is not None:
        if isinstance(stages, (str, bytes)):
            raise ValueError(f"stages must be a list of stage names, got {type(stages).__name__}")
        spec.stages.extend(stages)
    return spec


def from_task(task: TaskSpec, content_type: str | None = None) -> pb.TaskSpec:
    """The message for a ``cronoq.Task`` object."""
    spec = task_message(task.payload, content_type=content_type, pool=task.pool,
                        kind=None if task.kind == "default" else task.kind,
                        priority=None if task.priority == 2 else CLASSES[task.priority], key=task.key,
                        tenant=task.tenant, retry=task.retry, resources=task.resources, on_miss=task.on_miss,
                        tags=task.tags, labels=dict(task.labels) if task.labels else None, stages=task.stages)
    for field, ns in (("deadline_in_s", task.deadline_in_ns), ("start_in_s", task.start_in_ns),
                      ("tolerance_s", task.tolerance_ns), ("timeout_s", task.timeout_ns),
                      ("duration_hint_s", task.duration_hint_ns)):
        if ns is not None:
            setattr(spec, field, ns / NS)
    if task.deadline_at_ns is not None:
        spec.deadline_unix_ns = task.deadline_at_ns
    if task.start_at_ns is not None:
        spec.start_unix_ns = task.start_at_ns
    for ref, on in task.edges:
        spec.deps.add(ref=ref_message(ref), cond=_COND[on])
    return spec


def channel(target: str, *, tls: bool, credentials: grpc.ChannelCredentials | None,
            options: Iterable[tuple[str, Any]] | None) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (host:port, or an http:// or https:// URL)."""
    secure = tls or credentials is not None
    if target.startswith("https://"):
        target, secure = target[len("https://"):], True
    elif target.startswith("http://"):
        if secure:
            raise ValueError("TLS settings need an https:// target (or a plain host:port); refusing to connect "
                             "in plaintext")
        target = target[len("http://"):]
    target = target.rstrip("/")
    opts = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
            ("grpc.max_send_message_length", 256 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1)]
    opts += list(options or ())
    if secure:
        return grpc.aio.secure_channel(target, credentials or grpc.ssl_channel_credentials(), options=opts)
    return grpc.aio.insecure_channel(target, options=opts)


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
