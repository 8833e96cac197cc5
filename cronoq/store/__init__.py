"""Durable state: the store contract, codecs, and the stores.

``SqliteStore`` and ``PostgresStore`` load SQLAlchemy when first used, so
importing cronoq stays light; ``PostgresStore`` needs psycopg 3 (the extra
``cronoq[postgres]``) only when one is created.
"""

from typing import TYPE_CHECKING

from .base import (
    Batch, Fenced, Recovered, ScheduleRow, StatusRow, Store, StoredCheckpoint, StoredSchedule, StoredTask,
    StoreRejected, StoreUnavailable, TaskRecord,
    TaskRow,
)
from .codec import Codec, JsonCodec
from .memory import InMemoryStore, MemoryDatabase

if TYPE_CHECKING:   # loaded on first use (below); type checkers see them at once
    from .postgres import PostgresStore
    from .sqlite import SqliteStore

__all__ = ["Store", "Batch", "TaskRow", "StatusRow", "ScheduleRow", "Recovered", "StoredTask",
           "StoredCheckpoint", "StoredSchedule", "TaskRecord", "Fenced", "StoreUnavailable", "StoreRejected", "Codec", "JsonCodec", "InMemoryStore",
           "MemoryDatabase", "SqliteStore", "PostgresStore"]


def __getattr__(name: str) -> object:
    if name == "SqliteStore":
        from .sqlite import SqliteStore
        return SqliteStore
    if name == "PostgresStore":
        from .postgres import PostgresStore
        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
