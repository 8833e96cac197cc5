"""cronoq: an elastic, priority-aware task scheduler for Python.

``Scheduler`` is the asyncio API, ``BlockingScheduler`` its thread-safe
synchronous twin, ``cronoq.core`` the deterministic engine underneath.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:   # type checkers see every export at once; a program loads each on first use (below)
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


# Where each export lives: ``import cronoq`` loads nothing else until a name
# is used, so a command line that needs one corner of the package (``cronoq
# --version``, the client) starts fast. The stores load SQLAlchemy (and
# PostgresStore psycopg) only when used.
_EXPORTS: dict[str, tuple[str, str]] = {
    "StatusEvent": (".core.actions", "StatusEvent"),
    "AdmissionError": (".core.errors", "AdmissionError"),
    "CheckpointError": (".core.errors", "CheckpointError"),
    "CronoqError": (".core.errors", "CronoqError"),
    "Cycle": (".core.errors", "Cycle"),
    "EventsLagged": (".core.errors", "EventsLagged"),
    "InvalidTask": (".core.errors", "InvalidTask"),
    "Permanent": (".core.errors", "Permanent"),
    "QueueFull": (".core.errors", "QueueFull"),
    "ReservationConflict": (".core.errors", "ReservationConflict"),
    "ResourceExceedsCapacity": (".core.errors", "ResourceExceedsCapacity"),
    "Retryable": (".core.errors", "Retryable"),
    "SchedulerError": (".core.errors", "SchedulerError"),
    "TaskFailed": (".core.errors", "TaskFailed"),
    "UnknownDependency": (".core.errors", "UnknownDependency"),
    "UnknownPool": (".core.errors", "UnknownPool"),
    "UnknownResource": (".core.errors", "UnknownResource"),
    "UnknownTask": (".core.errors", "UnknownTask"),
    "Explanation": (".core.explain", "Explanation"),
    "Reason": (".core.explain", "Reason"),
    "Checkpoint": (".core.snapshot", "Checkpoint"),
    "GroupSnapshot": (".core.snapshot", "GroupSnapshot"),
    "PoolSnapshot": (".core.snapshot", "PoolSnapshot"),
    "Snapshot": (".core.snapshot", "Snapshot"),
    "TaskInfo": (".core.snapshot", "TaskInfo"),
    "AutoscaleConfig": (".core.types", "AutoscaleConfig"),
    "Dep": (".core.types", "Dep"),
    "Outcome": (".core.types", "Outcome"),
    "Priority": (".core.types", "Priority"),
    "RetryPolicy": (".core.types", "RetryPolicy"),
    "Status": (".core.types", "Status"),
    "Resource": (".core.types", "ResourceConfig"),
    "Task": (".core.types", "TaskSpec"),
    "EventStream": (".runtime", "EventStream"),
    "Pool": (".runtime", "Pool"),
    "RecurringInfo": (".runtime", "RecurringInfo"),
    "Scheduler": (".runtime", "Scheduler"),
    "SystemClock": (".runtime", "SystemClock"),
    "TaskContext": (".runtime", "TaskContext"),
    "TaskHandle": (".runtime", "TaskHandle"),
    "VirtualClock": (".runtime", "VirtualClock"),
    "BlockingEventStream": (".blocking", "BlockingEventStream"),
    "BlockingHandle": (".blocking", "BlockingHandle"),
    "BlockingScheduler": (".blocking", "BlockingScheduler"),
    "AccessDenied": (".errors", "AccessDenied"),
    "CancelTask": (".errors", "CancelTask"),
    "Reject": (".errors", "Reject"),
    "ServerError": (".errors", "ServerError"),
    "Fenced": (".store.base", "Fenced"),
    "LeaderUnavailable": (".store.base", "LeaderUnavailable"),
    "StoreRejected": (".store.base", "StoreRejected"),
    "StoreUnavailable": (".store.base", "StoreUnavailable"),
    "JsonCodec": (".store.codec", "JsonCodec"),
    "PostgresStore": (".store.postgres", "PostgresStore"),
    "SqliteStore": (".store.sqlite", "SqliteStore"),
}
_SUBPACKAGES = frozenset({"blocking", "cli", "client", "compat", "contrib", "core", "demo", "errors", "mcp",
                          "realtime", "runtime", "server", "simulation", "store", "telemetry", "whatif"})


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is not None:
        value = getattr(importlib.import_module(where[0], __name__), where[1])
        globals()[name] = value   # (the next lookup finds it directly)
        return value
    if name in _SUBPACKAGES:   # ``import cronoq; cronoq.core...`` as before the exports were lazy
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'cronoq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
