"""cronoq.core: the deterministic, sans-IO scheduling engine.

Nothing here reads a clock, starts a thread or performs I/O; every call takes
``now`` in integer Unix nanoseconds. The asyncio runtime (``cronoq``) drives it.
"""

from .actions import Abort, Dispatch, Persist, Scale, StatusEvent
from .engine import Core
from .errors import (
    AdmissionError, CheckpointError, CronoqError, Cycle, EventsLagged, InvalidTask, Permanent, QueueFull,
    ReservationConflict, ResourceExceedsCapacity, Retryable, SchedulerError, TaskFailed,
    UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)
from .explain import Explanation, Reason
from .snapshot import Checkpoint, GroupSnapshot, PoolSnapshot, Snapshot, TaskInfo
from .types import (
    BLOCKED, CANCELLED, CANCELLED_OUTCOME, CLASSES, DEAD_LETTERED, FAILED, MISSED, NS, PERMANENT,
    READY, RETRYABLE, RETRYING, RUNNING, SCHEDULED, SHED, SHUTDOWN, SKIPPED, STATUSES, SUCCEEDED,
    SUCCESS, TERMINAL, AutoscaleConfig, CoreConfig, Dep, PoolConfig, Priority, PriorityConfig,
    ResourceConfig, RetryPolicy, Outcome, Status, TaskSpec, UrgencyConfig,
)

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
    "SUCCESS", "RETRYABLE", "PERMANENT", "CANCELLED_OUTCOME",
]
