"""Every exception cronoq raises on purpose, in one module.

The same classes are importable from ``cronoq`` itself; this module is for
code that prefers ``from cronoq.errors import TaskFailed`` or wants the list.
"""

from __future__ import annotations

from .core.errors import (
    AdmissionError, CheckpointError, CronoqError, Cycle, EventsLagged, InvalidTask, Permanent, QueueFull,
    ReservationConflict, ResourceExceedsCapacity, Retryable, SchedulerError, TaskFailed,
    UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)
from .store.base import Fenced, StoreRejected, StoreUnavailable

__all__ = [
    "CronoqError", "SchedulerError", "StoreUnavailable", "StoreRejected", "Fenced", "TaskFailed", "Retryable",
    "Permanent", "EventsLagged", "CheckpointError", "UnknownTask", "AdmissionError", "ReservationConflict",
    "Cycle",
    "UnknownDependency", "UnknownPool", "UnknownResource", "ResourceExceedsCapacity", "QueueFull",
    "InvalidTask", "Reject", "CancelTask", "ServerError", "AccessDenied",
]


# ---------------------------------------------------------------- cronoq-server (cronoq.client)
# Defined here, without grpc, so that every cronoq error is importable from
# cronoq itself; cronoq.client exports them too.


class Reject(CronoqError):
    """Raised by a remote worker's handler: give the lease back unrun. The
    server offers it to another worker of the pool (same labels) without
    using an attempt, or, if none has a free slot, fails the attempt as
    retryable."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason

    def __reduce__(self) -> tuple[type[Reject], tuple[str]]:
        return (type(self), (self.reason,))


class CancelTask(CronoqError):
    """Raised by a remote worker's handler: end the task as cancelled (no retry)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[type[CancelTask], tuple[str]]:
        return (type(self), (self.message,))


class ServerError(CronoqError):
    """A cronoq-server refused a call for a reason without its own cronoq
    type; ``code`` is the gRPC status name (``"ALREADY_EXISTS"``...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[ServerError], tuple[str, str]]:
        return (type(self), (self.code, self.message))


class AccessDenied(ServerError, PermissionError):
    """UNAUTHENTICATED (no or a wrong credential) or PERMISSION_DENIED (the
    credential's role, pools or tenant do not allow the call)."""
