"""cronoq: an elastic, priority-aware task scheduler for Python.

``Scheduler`` is the asyncio API, ``BlockingScheduler`` its thread-safe
synchronous twin, ``cronoq.core`` the deterministic engine underneath.
"""

from typing import TYPE_CHECKING

from ._version import __version__
from .core.actions import StatusEvent
from .core.errors import (
    AdmissionError, CheckpointError, CronoqError, Cycle, EventsLagged, InvalidTask, Permanent, QueueFull,
    ReservationConflict, ResourceExceedsCapacity, Retryable, SchedulerError, TaskFailed,
    UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)
from .core.explain import Explanation, Reason
from .core.snapshot import Checkpoint, GroupSnapshot, PoolSnapshot, Snapshot, TaskInfo
from .core.types import AutoscaleConfig, Dep, Outcome, Priority, RetryPolicy, Status
from .core.types import ResourceConfig as Resource
from .core.types import TaskSpec as Task
from .runtime import (
    EventStream, Pool, RecurringInfo, Scheduler, SystemClock, TaskContext, TaskHandle, VirtualClock,
)
from .blocking import BlockingEventStream, BlockingHandle, BlockingScheduler
from .errors import AccessDenied, CancelTask, Reject, ServerError
from .store.base import Fenced, LeaderUnavailable, StoreRejected, StoreUnavailable
from .store.codec import JsonCodec

if TYPE_CHECKING:   # loaded on first use (below); type checkers see them at once
    from .store.postgres import PostgresStore
    from .store.sqlite import SqliteStore

__all__ = [
    "__version__",
    "Scheduler", "BlockingScheduler", "BlockingHandle", "BlockingEventStream", "Pool", "Task", "Dep", "RetryPolicy", "Priority", "Status", "Outcome", "Resource", "AutoscaleConfig",
    "TaskContext", "TaskHandle", "EventStream", "StatusEvent", "VirtualClock", "SystemClock",
    "SqliteStore", "PostgresStore", "JsonCodec",
    "Snapshot", "PoolSnapshot", "GroupSnapshot", "TaskInfo", "Explanation", "Reason", "Checkpoint", "CheckpointError",
    "RecurringInfo",
    "CronoqError", "SchedulerError", "StoreUnavailable", "LeaderUnavailable", "StoreRejected", "Fenced", "TaskFailed", "Retryable",
    "Permanent", "EventsLagged",
    "UnknownTask", "AdmissionError", "ReservationConflict", "Cycle", "UnknownDependency",
    "UnknownPool", "UnknownResource", "ResourceExceedsCapacity", "QueueFull", "InvalidTask",
    "Reject", "CancelTask", "ServerError", "AccessDenied",
]


def __getattr__(name: str) -> object:
    # The stores load SQLAlchemy (and PostgresStore psycopg) only when used.
    if name in ("SqliteStore", "PostgresStore"):
        from . import store
        return getattr(store, name)
    raise AttributeError(f"module 'cronoq' has no attribute {name!r}")
