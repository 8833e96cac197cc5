"""cronoq.core: the deterministic, sans-IO scheduling engine.

Nothing here reads a clock, starts a thread or performs I/O; every call takes
``now`` in integer Unix nanoseconds. The asyncio runtime (``cronoq``) drives it.
"""

from importlib.machinery import ExtensionFileLoader
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from .actions import Abort, Dispatch, Persist, Scale, StatusEvent
from .errors import (
    AdmissionError, CheckpointError, CronoqError, Cycle, EventsLagged, InvalidTask, Permanent, QueueFull,
    ReservationConflict, ResourceExceedsCapacity, Retryable, SchedulerError, TaskFailed,
    UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)
from .snapshot import Checkpoint, GroupSnapshot, PoolSnapshot, Snapshot, TaskInfo
from .types import (
    BLOCKED, CANCELLED, CANCELLED_OUTCOME, CLASSES, DEAD_LETTERED, FAILED, MISSED, NS, PERMANENT,
    READY, RETRYABLE, RETRYING, RUNNING, SCHEDULED, SHED, SHUTDOWN, SKIPPED, STATUSES, SUCCEEDED,
    SUCCESS, TERMINAL, AutoscaleConfig, CoreConfig, Dep, PoolConfig, Priority, PriorityConfig,
    ResourceConfig, RetryPolicy, Outcome, Status, TaskSpec, UrgencyConfig,
)

# Whether the engine runs compiled (a build with CRONOQ_MYPYC=1, setup.py) or
# as Python. Asked of the engine's module without importing it (it loads lazily).
_engine = find_spec(f"{__name__}.engine")
COMPILED: bool = _engine is not None and isinstance(_engine.loader, ExtensionFileLoader)
del _engine

if TYPE_CHECKING:
    from .engine import Core
    from .explain import Explanation, Reason

__all__ = [
    "Core", "CoreConfig", "PoolConfig", "ResourceConfig", "AutoscaleConfig", "PriorityConfig",
    "UrgencyConfig", "TaskSpec", "Dep", "RetryPolicy", "Priority",
    "Dispatch", "Abort", "StatusEvent", "Persist", "Scale",
    "Snapshot", "PoolSnapshot", "Explanation", "Reason", "GroupSnapshot", "TaskInfo", "Checkpoint", "CheckpointError",
    "CronoqError", "SchedulerError", "TaskFailed", "Retryable", "Permanent", "EventsLagged",
    "UnknownTask", "AdmissionError", "ReservationConflict", "Cycle", "UnknownDependency",
    "UnknownPool", "UnknownResource", "ResourceExceedsCapacity", "QueueFull", "InvalidTask",
    "Status", "Outcome", "NS", "CLASSES", "STATUSES", "TERMINAL",
    "BLOCKED", "SCHEDULED", "READY", "RUNNING", "RETRYING",
    "SUCCEEDED", "FAILED", "DEAD_LETTERED", "CANCELLED", "SKIPPED", "MISSED", "SHED", "SHUTDOWN",
    "SUCCESS", "RETRYABLE", "PERMANENT", "CANCELLED_OUTCOME", "COMPILED",
]


def __getattr__(name: str) -> Any:
    # The engine loads with its first use: the vocabulary and the types above
    # are what a command line needs to parse its arguments.
    if name == "Core":
        from .engine import Core
        return Core
    if name in ("Explanation", "Reason"):
        from . import explain
        return getattr(explain, name)
    raise AttributeError(f"module 'cronoq.core' has no attribute {name!r}")
