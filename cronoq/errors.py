"""Every exception cronoq raises on purpose, in one module.

The same classes are importable from ``cronoq`` itself; this module is for
code that prefers ``from cronoq.errors import TaskFailed`` or wants the list.
"""

from __future__ import annotations

from .core.errors import (
    AdmissionError, CronoqError, Cycle, EventsLagged, InvalidTask, Permanent, QueueFull,
    ReservationConflict, ResourceExceedsCapacity, Retryable, SchedulerError, TaskFailed,
    UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)
from .store.base import Fenced, LeaderUnavailable, StoreRejected, StoreUnavailable

__all__ = [
    "CronoqError", "SchedulerError", "StoreUnavailable", "LeaderUnavailable", "StoreRejected", "Fenced", "TaskFailed", "Retryable",
    "Permanent", "EventsLagged", "UnknownTask", "AdmissionError", "ReservationConflict", "Cycle",
    "UnknownDependency", "UnknownPool", "UnknownResource", "ResourceExceedsCapacity", "QueueFull",
    "InvalidTask",
]
