"""Durable state: the store contract, codecs, and the stores."""

from .base import (
    Batch, Fenced, Recovered, ScheduleRow, StatusRow, Store, StoredSchedule, StoredTask,
    StoreUnavailable, TaskRow,
)
from .codec import Codec, JsonCodec
from .memory import InMemoryStore, MemoryDatabase

__all__ = ["Store", "Batch", "TaskRow", "StatusRow", "ScheduleRow", "Recovered", "StoredTask",
           "StoredSchedule", "Fenced", "StoreUnavailable", "Codec", "JsonCodec", "InMemoryStore",
           "MemoryDatabase"]
