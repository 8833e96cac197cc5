"""The tables of the SQL stores (SQLAlchemy Core), shared by SQLite and PostgreSQL.

``cronoq_tasks``      one row per task: the submission (options as JSON text,
                     the encoded payload) and its latest status, attempt and
                     message; the encoded output of a task that succeeded.
``cronoq_schedules``  one row per recurring schedule: its record (next
                     occurrence, last task) as JSON text and the encoded
                     payload of its template.
``cronoq_checkpoints`` the latest checkpoint of each stage of a task (the data
                     as the codec encoded it, the attempt and time that saved
                     it); deleted with the task's row.
``cronoq_meta``       one row (id 1): the fencing epoch, the high-water mark of
                     issued task ids, and the leader (with SQLite, a lease:
                     holder identity and expiry on the wall clock, in Unix
                     nanoseconds).

The schema is created and upgraded by the alembic revisions in
``cronoq/_migrations`` (version table ``cronoq_schema_version``); a test checks
that these definitions and the migrated database do not differ. With
PostgreSQL the tables live in a configurable schema (``public`` by default):
``tables(schema)`` builds the same definitions bound to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import (
    BigInteger, Column, Index, Integer, LargeBinary, MetaData, Table, Text,
)

__all__ = ["Tables", "tables", "metadata", "HEAD", "VERSION_TABLE"]

# The newest alembic revision this build knows (a test checks it against the scripts).
HEAD = "0002"
VERSION_TABLE = "cronoq_schema_version"

NAMING = {"pk": "pk_%(table_name)s"}


@dataclass(frozen=True)
class Tables:
    metadata: MetaData
    tasks: Table
    schedules: Table
    meta: Table
    checkpoints: Table


@lru_cache(maxsize=None)
def tables(schema: str | None = None) -> Tables:
    """The table definitions, in ``schema`` (None: the connection's default)."""
    md = MetaData(schema=schema, naming_convention=NAMING)
    tasks = Table(
        "cronoq_tasks", md,
        # INTEGER on SQLite makes the id the rowid (64-bit there too): no second index.
        Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
               autoincrement=False),
        Column("pool", Text, nullable=False),
        Column("kind", Text, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("key", Text, nullable=True),
        Column("record", Text, nullable=False),          # JSON text (cronoq.core.persist.spec_record)
        Column("payload", LargeBinary, nullable=False),  # as the codec encoded it
        Column("status", Text, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("message", Text, nullable=True),
        Column("submitted_ns", BigInteger, nullable=False),
        Column("updated_ns", BigInteger, nullable=False),
        Column("finished_ns", BigInteger, nullable=True),
        Column("output", LargeBinary, nullable=True),
    )
    # Partial indexes: keyless tasks, and live tasks in the finished index (and the
    # reverse), cost nothing to insert. Recovery reads live tasks through
    # ix_cronoq_tasks_live and recent finished ones through ix_cronoq_tasks_finished_ns;
    # pruning uses the latter too.
    c = tasks.c
    for name, column, where in (("ix_cronoq_tasks_key", c.key, c.key.isnot(None)),
                                ("ix_cronoq_tasks_finished_ns", c.finished_ns, c.finished_ns.isnot(None)),
                                ("ix_cronoq_tasks_live", c.id, c.finished_ns.is_(None))):
        Index(name, column, sqlite_where=where, postgresql_where=where)
    schedules = Table(
        "cronoq_schedules", md,
        Column("name", Text, primary_key=True),
        Column("record", Text, nullable=False),          # JSON text (schedule_record)
        Column("payload", LargeBinary, nullable=False),
    )
    meta = Table(
        "cronoq_meta", md,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("epoch", BigInteger, nullable=False),
        Column("high_water", BigInteger, nullable=False),
        Column("holder", Text, nullable=True),            # the leader's identity
        Column("lease_expires_ns", BigInteger, nullable=True),   # SQLite lease, wall clock
    )
    checkpoints = Table(
        "cronoq_checkpoints", md,
        Column("task_id", BigInteger, primary_key=True, autoincrement=False),
        Column("stage", Text, primary_key=True),
        Column("data", LargeBinary, nullable=False),     # as the codec encoded it
        Column("attempt", Integer, nullable=False),      # the attempt that saved it
        Column("saved_ns", BigInteger, nullable=False),
    )
    return Tables(md, tasks, schedules, meta, checkpoints)


metadata = tables(None).metadata
