"""What the engine asks its driver to do.

Internally the engine queues plain tuples (cheap to build on the hot path)
in ``Core.actions``; ``Core.poll_action`` turns each into one of the typed
objects below. Drivers that care about speed pop the tuples themselves.

Tuple layouts, by their first element:

- ``(DISPATCH, entry, lease, attempt)``: run one attempt of the task
- ``(ABORT, lease, task_id, reason)``: stop an attempt; its slot is already free
- ``(EVENT, task_id, pool, key, status, attempt, at_ns, message, tenant, max_attempts)``
- ``(PERSIST, mutation)``: a mutation for the store (see ``cronoq.core.mutations``)
- ``(SCALE, pool, desired)``: the autoscaler's target for a pool
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .model import Entry

__all__ = ["DISPATCH", "ABORT", "EVENT", "PERSIST", "SCALE", "Dispatch", "Abort", "StatusEvent",
           "Persist", "Scale", "typed"]

DISPATCH: Final = 1
ABORT: Final = 2
EVENT: Final = 3
PERSIST: Final = 4
SCALE: Final = 5


class Dispatch:
    """Run attempt ``attempt`` of task ``task_id``; report its end with ``lease``."""

    __slots__ = ("task_id", "lease", "attempt", "pool", "kind", "key", "payload", "tags",
                 "timeout", "deadline", "group")

    def __init__(self, entry: Entry, lease: int, attempt: int) -> None:
        spec = entry.spec
        self.task_id = entry.id
        self.lease = lease
        self.attempt = attempt
        self.pool = entry.pool.name
        self.kind = entry.kind
        self.key = entry.key
        self.payload = entry.payload
        self.tags = dict(spec.tags) if spec is not None and spec.tags else {}
        timeout = spec.timeout_ns if spec is not None else None
        self.timeout = None if timeout is None else timeout / 1e9
        self.deadline = None if entry.deadline is None else entry.deadline / 1e9
        self.group = dict(entry.group.labels) if entry.group is not None else {}

    def __repr__(self) -> str:
        return f"Dispatch(task_id={self.task_id}, attempt={self.attempt}, lease={self.lease}, pool={self.pool!r})"


class Abort:
    """The engine gave up attempt ``lease`` (timeout, cancellation, lease expiry)."""

    __slots__ = ("lease", "task_id", "reason")

    def __init__(self, lease: int, task_id: int, reason: str) -> None:
        self.lease = lease
        self.task_id = task_id
        self.reason = reason

    def __repr__(self) -> str:
        return f"Abort(lease={self.lease}, task_id={self.task_id}, reason={self.reason!r})"


class StatusEvent:
    """A task changed status. ``at`` is Unix seconds. ``stage`` is set on
    the event of a stage completed (a checkpoint saved; the status stays
    ``running``). ``tenant``: the task's tenant (None if none).
    ``max_attempts``: the attempts its retry policy allows (None if not known)."""

    __slots__ = ("id", "pool", "key", "status", "attempt", "at", "message", "stage", "tenant", "max_attempts")

    def __init__(self, id: int, pool: str, key: str | None, status: str, attempt: int, at: float,
                 message: str | None = None, stage: str | None = None, tenant: str | None = None,
                 max_attempts: int | None = None) -> None:
        self.id = id
        self.pool = pool
        self.key = key
        self.status = status
        self.attempt = attempt
        self.at = at
        self.message = message
        self.stage = stage
        self.tenant = tenant
        self.max_attempts = max_attempts

    def __repr__(self) -> str:
        stage = "" if self.stage is None else f", stage={self.stage!r}"
        tenant = "" if self.tenant is None else f", tenant={self.tenant!r}"
        limit = "" if self.max_attempts is None else f", max_attempts={self.max_attempts}"
        return (f"StatusEvent(id={self.id}, pool={self.pool!r}, key={self.key!r}, status={self.status!r}, "
                f"attempt={self.attempt}, at={self.at}, message={self.message!r}{stage}{tenant}{limit})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatusEvent) and all(
            getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (StatusEvent, tuple(getattr(self, f) for f in self.__slots__))


class Persist:
    """A mutation the store must write before dependent effects are released."""

    __slots__ = ("mutation",)

    def __init__(self, mutation: tuple[Any, ...]) -> None:
        self.mutation = mutation

    def __repr__(self) -> str:
        return f"Persist({self.mutation[0]!r}, ...)"


class Scale:
    """The autoscaler's new target capacity for ``pool``."""

    __slots__ = ("pool", "desired")

    def __init__(self, pool: str, desired: int) -> None:
        self.pool = pool
        self.desired = desired

    def __repr__(self) -> str:
        return f"Scale(pool={self.pool!r}, desired={self.desired})"


def event_from(raw: tuple[Any, ...]) -> StatusEvent:
    return StatusEvent(raw[1], raw[2], raw[3], raw[4], raw[5], raw[6] / 1e9, raw[7], None, raw[8], raw[9])


def typed(raw: tuple[Any, ...]) -> Dispatch | Abort | StatusEvent | Persist | Scale:
    """The typed object for one raw action tuple."""
    kind = raw[0]
    if kind == DISPATCH:
        return Dispatch(raw[1], raw[2], raw[3])
    if kind == EVENT:
        return event_from(raw)
    if kind == ABORT:
        return Abort(raw[1], raw[2], raw[3])
    if kind == PERSIST:
        return Persist(raw[1])
    if kind == SCALE:
        return Scale(raw[1], raw[2])
    raise ValueError(f"unknown action {raw!r}")
