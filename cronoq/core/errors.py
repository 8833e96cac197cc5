"""Exceptions shared by every layer of cronoq.

All of them derive from :class:`CronoqError` and survive ``pickle`` (each one
rebuilds itself from its constructor arguments), so they can cross process
boundaries.
"""

from __future__ import annotations

import math
from typing import Any, Self

__all__ = [
    "CronoqError",
    "SchedulerError",
    "TaskFailed",
    "Retryable",
    "Permanent",
    "EventsLagged",
    "CheckpointError",
    "UnknownTask",
    "AdmissionError",
    "ReservationConflict",
    "Cycle",
    "UnknownDependency",
    "UnknownPool",
    "UnknownResource",
    "ResourceExceedsCapacity",
    "QueueFull",
    "InvalidTask",
]


# types.MAX_SECONDS (types imports this module, so the value is repeated here).
_MAX_RETRY_AFTER = 100 * 365 * 86_400


class CronoqError(Exception):
    """Base class of every error cronoq raises on purpose."""


class SchedulerError(CronoqError):
    """The scheduler cannot serve the call: not running, store unavailable,
    loop closed, or an invalid recurring schedule."""


class UnknownTask(CronoqError, LookupError):
    """No live or retained task has this id or key."""

    def __init__(self, ref: object) -> None:
        super().__init__(f"no task with {'key' if isinstance(ref, str) else 'id'} {ref!r}")
        self.ref = ref

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.ref,))


class TaskFailed(CronoqError):
    """Awaiting a task that did not succeed (or whose output is gone)."""

    def __init__(self, status: str, message: str | None = None, task_id: int | None = None) -> None:
        text = f"task {task_id} ended {status}" if task_id is not None else f"task ended {status}"
        if message:
            text += f": {message}"
        super().__init__(text)
        self.status = status
        self.message = message
        self.task_id = task_id

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.status, self.message, self.task_id))


class Retryable(CronoqError):
    """Raised by an executor: the attempt failed and may be retried.

    ``retry_after`` (seconds) makes the next attempt wait at least that long
    (a negative value counts as 0).
    """

    def __init__(self, message: str = "", retry_after: float | None = None) -> None:
        if retry_after is not None and (
                isinstance(retry_after, bool) or not isinstance(retry_after, (int, float))
                or not math.isfinite(retry_after) or retry_after > _MAX_RETRY_AFTER):
            raise ValueError(f"retry_after must be a finite number of seconds up to {_MAX_RETRY_AFTER} "
                             f"(100 years), got {retry_after!r}")
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.message, self.retry_after))


class Permanent(CronoqError):
    """Raised by an executor: the attempt failed and retrying cannot help."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.message,))


class EventsLagged(CronoqError):
    """An event stream opened with ``on_lag="raise"`` dropped events."""

    def __init__(self, skipped: int) -> None:
        super().__init__(f"event stream fell behind and dropped {skipped} events")
        self.skipped = skipped

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.skipped,))


class CheckpointError(CronoqError, ValueError):
    """A checkpoint was refused: an undeclared or invalid stage, data the
    codec cannot encode or larger than the limit, too many stages, or an
    attempt that is over. Nothing was saved."""


class AdmissionError(CronoqError):
    """A submission was refused; nothing was admitted.

    For a batch, ``index`` is the position of the offending task.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        self.message = message
        self.index = index
        super().__init__(message if index is None else f"task {index} of the batch: {message}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.message, self.index))

    def at_index(self, index: int) -> Self:
        """The same error, naming a batch position."""
        return type(self)(self.message, index)


class ReservationConflict(AdmissionError):
    """A fixed start would overlap more reservations than the pool allows."""


class Cycle(AdmissionError):
    """The dependencies would form a cycle."""


class UnknownDependency(AdmissionError):
    """A dependency names an id or key that does not exist."""


class UnknownPool(AdmissionError):
    """The task names a pool the scheduler does not have."""


class UnknownResource(AdmissionError):
    """The task requests a resource the scheduler does not have."""


class ResourceExceedsCapacity(AdmissionError):
    """The task requests more units than the resource can ever provide."""


class QueueFull(AdmissionError):
    """A pending-task bound is reached and the pool's overflow policy refuses.

    ``never`` is true when the submission by itself exceeds the bound, so
    waiting for room cannot help.
    """

    never: bool = False


class InvalidTask(AdmissionError, ValueError):
    """The task's options are invalid (the message names the field)."""
