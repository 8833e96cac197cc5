"""The contract between the runtime and a durable store.

The store is a write-ahead log of engine mutations. The runtime turns each
engine step's mutations into one ``Batch`` and calls ``commit`` (group
commit: batches produced while a commit is in flight go out together in the
next one). Recovery returns raw rows; the runtime decodes payloads with its
codec and hands the result to ``Core.restore``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, runtime_checkable

from ..core.types import ID_EPOCH_BITS   # task ids carry the leader's epoch above these bits
from ..core.errors import SchedulerError

if TYPE_CHECKING:
    from .cluster import ClusterTransport

__all__ = ["Store", "ClusterStore", "Batch", "TaskRow", "StatusRow", "ScheduleRow", "Recovered", "StoredTask",
           "StoredCheckpoint",
           "StoredSchedule", "TaskRecord", "Fenced", "StoreUnavailable", "StoreRejected", "LeaderUnavailable",
           "ID_EPOCH_BITS",
           "LostCallback", "STORE_MEMBERS", "seconds"]



class StoreUnavailable(SchedulerError):
    """The store could not be reached, or a commit took longer than allowed.

    ``uncertain`` is true when the connection failed while the database
    committed: the commit may have been written after all.
    """

    uncertain = False


class LeaderUnavailable(StoreUnavailable):
    """A call of a process that does not lead the store got no answer in
    time (leadership is moving, or no process leads): it was taken back
    before any leader carried it out, so nothing of it was admitted. Call
    again."""


class StoreRejected(SchedulerError):
    """The database refused the data of a commit (a constraint, a value or a
    size it does not accept): retrying the same rows cannot help. The runtime
    then isolates the offending rows, refuses them, and commits the rest."""


class Fenced(SchedulerError):
    """A newer leader took over: this scheduler may no longer write."""


@dataclass
class TaskRow:
    """A submission: the full spec (as a JSON-able record) and the encoded payload."""

    id: int
    pool: str
    kind: str
    priority: int
    key: str | None
    record: dict[str, Any]
    payload: bytes
    submitted_ns: int


@dataclass
class StatusRow:
    """A status change: running, retrying, or a terminal status."""

    id: int
    status: str
    attempt: int
    at_ns: int
    message: str | None


@dataclass
class ScheduleRow:
    """A recurring schedule: its record (with next occurrence and last task)
    and the encoded payload of its template."""

    name: str
    record: dict[str, Any]
    payload: bytes


@dataclass
class Batch:
    """Everything one commit writes, in one transaction."""

    tasks: list[TaskRow] = field(default_factory=list)
    statuses: list[StatusRow] = field(default_factory=list)
    outputs: list[tuple[int, bytes]] = field(default_factory=list)
    schedules: list[ScheduleRow] = field(default_factory=list)
    removed_schedules: list[str] = field(default_factory=list)
    withdrawn: list[int] = field(default_factory=list)   # ids whose rows must not exist
    high_water: int = 0

    def __bool__(self) -> bool:
        return bool(self.tasks or self.statuses or self.outputs or self.schedules
                    or self.removed_schedules or self.withdrawn)

    def extend(self, other: Batch) -> None:
        self.tasks.extend(other.tasks)
        self.statuses.extend(other.statuses)
        self.outputs.extend(other.outputs)
        self.schedules.extend(other.schedules)
        self.removed_schedules.extend(other.removed_schedules)
        self.withdrawn.extend(other.withdrawn)
        self.high_water = max(self.high_water, other.high_water)


@dataclass(slots=True)
class StoredTask:
    """A task row as recovery reads it back (equal records may be one shared dict: read-only)."""

    id: int
    pool: str
    record: dict[str, Any] | None   # None when the stored record cannot be parsed
    payload: bytes | None
    status: str
    attempt: int
    message: str | None
    submitted_ns: int
    finished_ns: int | None


@dataclass(slots=True)
class TaskRecord:
    """A task's stored summary, as the listing queries read it (no payload):
    ``finished_ns`` is None while it is live, ``has_output`` whether an
    output is stored."""

    id: int
    pool: str
    kind: str
    key: str | None
    priority: int
    status: str
    attempt: int
    message: str | None
    submitted_ns: int
    finished_ns: int | None
    has_output: bool
    tenant: str | None = None
    max_attempts: int | None = None   # its own retry policy's; None: its pool's policy applies


@dataclass(slots=True)
class StoredCheckpoint:
    """The checkpoint of one stage of a task: ``data`` as the codec encoded
    it, saved by ``attempt`` at ``saved_ns`` (Unix nanoseconds)."""

    task_id: int
    stage: str
    data: bytes
    attempt: int
    saved_ns: int


@dataclass
class StoredSchedule:
    name: str
    record: dict[str, Any] | None
    payload: bytes | None


@dataclass
class Recovered:
    """What a new leader loads: live tasks, recently ended ones (and the ended
    parents of live tasks), recurring schedules, and the id high-water mark."""

    tasks: Iterable[StoredTask]     # live tasks in id order, then ended ones; possibly a one-pass stream
    schedules: list[StoredSchedule]
    high_water: int


LostCallback = Callable[[str], None]

# Every member of ``Store``, for messages naming what an object lacks.
STORE_MEMBERS = ("retention_ns", "commit_timeout", "acquire_leadership", "recover", "commit", "load_output",
                 "save_checkpoint", "load_checkpoints", "delete_checkpoints", "release_leadership", "on_lost",
                 "close")


def seconds(value: object, name: str, *, positive: bool = True) -> float:
    """``value`` as a number of seconds, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number of seconds {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")
    return float(value)


@runtime_checkable
class Store(Protocol):
    """A durable store with leader election and fencing.

    Every call that needs the database raises ``StoreUnavailable`` when it
    cannot be reached (never the driver's own errors).
    """

    @property
    def retention_ns(self) -> int:
        """How long (ns) recovery keeps ended tasks at least; the runtime
        keeps them as long in memory."""

    @property
    def commit_timeout(self) -> float:
        """Seconds a caller waits for its commit before it counts as unavailable."""

    async def acquire_leadership(self) -> int:
        """Wait until this process leads; return its new fencing epoch (> any before)."""

    async def recover(self, now_ns: int, retention_ns: int) -> Recovered:
        """Load the state a new leader needs."""

    async def commit(self, epoch: int, batch: Batch) -> None:
        """Write ``batch`` in one transaction, checking ``epoch`` inside it.
        Raises ``Fenced`` if a newer leader exists, ``StoreUnavailable`` on
        transient failure (the caller retries the same batch), ``StoreRejected``
        when the database refuses the data itself (the caller isolates the
        offending rows). Deletes the rows of ``batch.withdrawn`` after writing
        the rest; writing a batch twice changes nothing."""

    async def load_output(self, task_id: int) -> bytes | None:
        """The stored output of a succeeded task, or None."""

    async def save_checkpoint(self, epoch: int, task_id: int, stage: str, data: bytes, attempt: int,
                              saved_ns: int) -> None:
        """Write the checkpoint of ``stage`` of a task (replacing the stage's
        earlier one) in one transaction that checks ``epoch`` (``Fenced``,
        ``StoreUnavailable`` as for ``commit``). Checkpoints go when their
        task's row goes (pruning, withdrawal)."""

    async def load_checkpoints(self, task_id: int | None = None) -> list[StoredCheckpoint]:
        """The checkpoints of one task, or (None) of every live task; in the
        order they were saved."""

    async def delete_checkpoints(self, epoch: int, task_id: int) -> int:
        """Delete a task's checkpoints (fenced by ``epoch``); returns how many."""

    async def release_leadership(self) -> None:
        """Step down at once so a standby takes over (clean shutdown)."""

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(reason)`` (on the loop) if leadership is lost."""

    async def close(self) -> None:
        """Step down if leading and release the connections (the owner calls it
        after the scheduler's shutdown; closing twice does nothing)."""


@runtime_checkable
class ClusterStore(Store, Protocol):
    """A store that processes share as one scheduler (``SqliteStore`` and
    ``PostgresStore``; see ``cronoq.store.cluster``): what the runtime's
    cluster (``cronoq.runtime.cluster``) uses beyond ``Store``."""

    @property
    def cluster(self) -> bool:
        """Whether schedulers given this store share it (else each one leads or waits alone)."""

    @property
    def request_timeout(self) -> float:
        """Seconds a follower's call waits for the leader's answer."""

    @property
    def cluster_poll(self) -> float:
        """Seconds between two looks at the store's cluster tables (when it does not wake the processes)."""

    @property
    def member_heartbeat(self) -> float:
        """Seconds between two heartbeats of a member."""

    @property
    def member_ttl(self) -> float:
        """Seconds without a heartbeat after which a member counts as gone."""

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""

    async def try_leadership(self) -> int | None:
        """Lead now if no process does: the new epoch, else None (without waiting)."""

    async def cluster_transport(self) -> ClusterTransport:
        """The SQL of this process's part of the cluster (its own connection and thread)."""
