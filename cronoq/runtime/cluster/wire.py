"""What the processes of a cluster pass one another through the store, as
data: errors in answers, payloads packed in one column, and the attempts
the leader leases out (the JSON an offer carries, read back as a
``RemoteEntry`` by the member that runs it)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Iterable

from ...core import errors as _errors
from ...core.errors import CronoqError, SchedulerError
from ...core.types import CLASSES, NS
from ...store.base import LeaderUnavailable, StoreRejected, StoreUnavailable
from ..runner import Attempt

__all__ = ["encode_error", "decode_error", "pack", "unpack", "attempt_record", "RemoteEntry", "settle"]


_ERRORS: dict[str, type[BaseException]] = {name: getattr(_errors, name) for name in _errors.__all__}
_ERRORS.update({cls.__name__: cls for cls in (StoreUnavailable, StoreRejected, LeaderUnavailable, ValueError,
                                               TypeError, KeyError, LookupError)})


def encode_error(exc: BaseException) -> dict[str, Any]:
    """An exception as JSON-able data that ``decode_error`` rebuilds (the
    cronoq errors with their fields; others by type name and message)."""
    name = type(exc).__name__
    args: list[Any] = [str(exc)]
    if isinstance(exc, CronoqError) and _ERRORS.get(name) is type(exc):
        try:
            reduced = exc.__reduce__()
            candidate = list(reduced[1]) if isinstance(reduced, tuple) and len(reduced) > 1 else args
            json.dumps(candidate)
            args = candidate
        except (TypeError, ValueError):
            pass
    elif _ERRORS.get(name) is not type(exc):
        base = next((cls for cls in type(exc).__mro__ if _ERRORS.get(cls.__name__) is cls), SchedulerError)
        name = base.__name__
    return {"type": name, "args": args, "never": bool(getattr(exc, "never", False))}


def decode_error(data: dict[str, Any]) -> BaseException:
    cls = _ERRORS.get(str(data.get("type")), SchedulerError)
    args = data.get("args") or []
    try:
        exc = cls(*args)
    except Exception:
        exc = SchedulerError(*[str(a) for a in args[:1]])
    if data.get("never"):
        exc.never = True   # type: ignore[attr-defined]
    return exc


def pack(payloads: Iterable[bytes]) -> bytes:
    """Payloads in one column: each one's length (4 bytes) then its bytes."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


def unpack(data: bytes | None) -> list[bytes]:
    out: list[bytes] = []
    if not data:
        return out
    i = 0
    while i < len(data):
        size = int.from_bytes(data[i:i + 4], "big")
        out.append(data[i + 4:i + 4 + size])
        i += 4 + size
    return out


def settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# ---------------------------------------------------------------- attempts from the store


class _Named:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Labels:
    __slots__ = ("labels",)

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels


class _SpecView:
    __slots__ = ("tenant", "tags", "labels", "timeout_ns", "stages")

    def __init__(self, record: dict[str, Any]) -> None:
        self.tenant = record.get("tenant")
        self.tags = record.get("tags") or None
        self.labels = record.get("labels") or None
        stages = record.get("stages")
        self.stages = tuple(stages) if stages else None
        timeout = record.get("timeout")
        self.timeout_ns = None if timeout is None else round(timeout * NS)


class RemoteEntry:
    """What an ``Attempt`` reads of its task, for an attempt leased through
    the store (the leader's ``Attempt`` fields, carried as JSON)."""

    __slots__ = ("id", "pool", "kind", "key", "payload", "cls", "spec", "deadline", "submitted", "group")

    def __init__(self, task_id: int, pool: str, record: dict[str, Any], payload: Any) -> None:
        self.id = task_id
        self.pool = _Named(pool)
        self.kind = record.get("kind", "default")
        self.key = record.get("key")
        self.payload = payload
        self.cls = CLASSES.index(record.get("priority", "normal"))
        self.spec = _SpecView(record)
        deadline = record.get("deadline")
        self.deadline = None if deadline is None else round(deadline * NS)
        self.submitted = round(float(record.get("submitted", 0.0)) * NS)
        self.group = _Labels(record.get("group") or {}) if record.get("group") else None


def attempt_record(attempt: Attempt, saved: Iterable[tuple[str, bytes, int, float]] = ()) -> str:
    """The JSON an offer carries: the attempt's fields, and ``saved``, the
    checkpoints of earlier attempts as (stage, encoded data, attempt, at)."""
    record: dict[str, Any] = {"kind": attempt.kind, "key": attempt.key, "priority": attempt.priority,
                              "submitted": attempt.submitted}
    for name in ("tenant", "tags", "labels", "timeout", "deadline", "group", "stages"):
        value = getattr(attempt, name)
        if value:
            record[name] = value
    checkpoints = [[stage, base64.b64encode(data).decode("ascii"), number, at]
                   for stage, data, number, at in saved]
    if checkpoints:
        record["checkpoints"] = checkpoints
    return json.dumps(record, separators=(",", ":"))
