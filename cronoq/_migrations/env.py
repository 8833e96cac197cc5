"""The alembic environment of cronoq's SQL stores.

The stores run it themselves when they connect (``cronoq.store.migrate``),
passing an open connection, already inside a transaction that holds the
migration lock, and the PostgreSQL schema in ``config.attributes``. It also
works from the alembic command line, given ``sqlalchemy.url`` (and optionally
``cronoq.schema``) in the configuration.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from cronoq.store.schema import VERSION_TABLE, tables

config = context.config
schema = config.attributes.get("schema", config.get_main_option("cronoq.schema"))
target_metadata = tables(schema).metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    if context.is_offline_mode():
        context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                          version_table=VERSION_TABLE, version_table_schema=schema,
                          literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise SystemExit("cronoq's migrations need sqlalchemy.url in the alembic configuration")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


run()
