"""Applying the alembic migrations of the SQL stores.

The stores call ``upgrade`` on connect, inside a transaction that holds the
migration lock (SQLite: an exclusive transaction on the file; PostgreSQL: a
transaction-level advisory lock), so whichever instance comes first migrates
and the others find the schema current. A database whose revision this build
does not know (written by a newer cronoq) is refused with ``SchedulerError``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..core.errors import SchedulerError
from .schema import HEAD, VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection

__all__ = ["upgrade", "current_revision", "alembic_config", "SCRIPT_LOCATION"]

SCRIPT_LOCATION = "cronoq:_migrations"
_ALEMBIC = threading.Lock()


def alembic_config(connection: Connection | None = None, schema: str | None = None) -> Config:
    """An alembic ``Config`` for cronoq's migrations (no ini file needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["schema"] = schema
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def current_revision(connection: Connection, schema: str | None = None) -> str | None:
    """The revision recorded in ``cronoq_schema_version`` (None: not migrated yet)."""
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE, "version_table_schema": schema})
    return context.get_current_revision()


def upgrade(connection: Connection, schema: str | None = None) -> str:
    """Bring the schema to this build's newest revision; returns it.

    ``connection`` must already be inside the transaction that holds the
    migration lock (taken before the process-wide lock below, always in that
    order); the caller commits.
    """
    current = current_revision(connection, schema)
    if current == HEAD:
        return HEAD
    with _ALEMBIC:   # alembic's op/context proxies are process-wide: one migration at a time
        return _upgrade(connection, schema, current)


def _upgrade(connection: Connection, schema: str | None, current: str | None) -> str:
    from alembic import command
    from alembic.script import ScriptDirectory

    config = alembic_config(connection, schema)
    script = ScriptDirectory.from_config(config)
    newest = script.get_current_head()
    if newest is None:
        raise SchedulerError(f"cronoq's migration scripts are missing from {SCRIPT_LOCATION!r}")
    if current is not None:
        try:
            known = script.get_revision(current) is not None
        except Exception:  # alembic raises when it cannot locate the revision
            known = False
        if not known:
            raise SchedulerError(
                f"the database schema is at revision {current!r}, which this build of cronoq does not "
                f"know (its newest revision is {newest!r}): it was written by a newer cronoq; "
                f"upgrade cronoq instead of running an older build against it")
    command.upgrade(config, "head")
    return newest
