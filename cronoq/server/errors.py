"""Errors of the service layer, independent of the transport.

A ``ServiceError`` carries a ``Code`` (named like gRPC status codes; each has
the HTTP status the gateway answers with), a message, and the name of the
cronoq exception it stands for (``kind``), which clients use to raise the
same type (gRPC trailing metadata ``cronoq-error``). ``from_exception``
maps what the library raises. docs/server.md has the table.
"""

from __future__ import annotations

import asyncio
import enum

from ..core.errors import (
    AdmissionError, Cycle, InvalidTask, QueueFull, ReservationConflict, ResourceExceedsCapacity,
    SchedulerError, UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)

__all__ = ["Code", "ServiceError", "from_exception"]


class Code(enum.Enum):
    """Status codes: (gRPC name, HTTP status)."""

    INVALID_ARGUMENT = ("INVALID_ARGUMENT", 400)
    UNAUTHENTICATED = ("UNAUTHENTICATED", 401)
    PERMISSION_DENIED = ("PERMISSION_DENIED", 403)
    NOT_FOUND = ("NOT_FOUND", 404)
    ALREADY_EXISTS = ("ALREADY_EXISTS", 409)
    FAILED_PRECONDITION = ("FAILED_PRECONDITION", 409)
    RESOURCE_EXHAUSTED = ("RESOURCE_EXHAUSTED", 429)
    DEADLINE_EXCEEDED = ("DEADLINE_EXCEEDED", 504)
    UNAVAILABLE = ("UNAVAILABLE", 503)
    DATA_LOSS = ("DATA_LOSS", 500)
    CANCELLED = ("CANCELLED", 499)
    INTERNAL = ("INTERNAL", 500)

    @property
    def grpc_name(self) -> str:
        return self.value[0]

    @property
    def http_status(self) -> int:
        return self.value[1]


class ServiceError(Exception):
    """A call failed with ``code``; ``kind`` names the cronoq exception type;
    ``retry_after_s``: when to try again (HTTP ``retry-after``), if known;
    ``metadata``: where to go instead (``cronoq-shard``...), if anywhere."""

    def __init__(self, code: Code, message: str, kind: str | None = None, *,
                 retry_after_s: float | None = None, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind
        self.retry_after_s = retry_after_s
        self.metadata = metadata   # more to tell the caller (gRPC trailing metadata, HTTP headers)

    def __repr__(self) -> str:
        return f"ServiceError({self.code.grpc_name}, {self.message!r})"


def from_exception(exc: BaseException) -> ServiceError:
    """The ServiceError for what the scheduler raised."""
    if isinstance(exc, ServiceError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, (UnknownTask, UnknownPool)):
        return ServiceError(Code.NOT_FOUND, str(exc), name)
    if isinstance(exc, (QueueFull, ReservationConflict)):
        return ServiceError(Code.RESOURCE_EXHAUSTED, str(exc), name)
    if isinstance(exc, (InvalidTask, Cycle, UnknownDependency, UnknownResource, ResourceExceedsCapacity)):
        return ServiceError(Code.INVALID_ARGUMENT, str(exc), name)
    if isinstance(exc, AdmissionError):
        return ServiceError(Code.INVALID_ARGUMENT, str(exc), "AdmissionError")
    if isinstance(exc, SchedulerError):
        return ServiceError(Code.UNAVAILABLE, str(exc), "SchedulerError")
    if isinstance(exc, (ValueError, TypeError)):
        return ServiceError(Code.INVALID_ARGUMENT, str(exc), "InvalidTask")
    if isinstance(exc, asyncio.TimeoutError):
        return ServiceError(Code.DEADLINE_EXCEEDED, "the call took too long")
    return ServiceError(Code.INTERNAL, f"internal error: {name}")
