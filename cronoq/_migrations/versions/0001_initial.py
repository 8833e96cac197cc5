"""The initial schema: tasks, schedules and the meta row (epoch, high-water
mark, leader and lease).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _schema():
    config = context.config
    return config.attributes.get("schema", config.get_main_option("cronoq.schema"))


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "cronoq_tasks",
        # INTEGER on SQLite makes the id the rowid (64-bit there too): no second index.
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False,
                  autoincrement=False),
        sa.Column("pool", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("key", sa.Text, nullable=True),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("submitted_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.Column("finished_ns", sa.BigInteger, nullable=True),
        sa.Column("output", sa.LargeBinary, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_cronoq_tasks"),
        schema=schema,
    )
    # Partial indexes: keyless tasks (and live ones in the finished index) cost nothing.
    for name, column, where in (("ix_cronoq_tasks_key", "key", "key IS NOT NULL"),
                                ("ix_cronoq_tasks_finished_ns", "finished_ns", "finished_ns IS NOT NULL"),
                                ("ix_cronoq_tasks_live", "id", "finished_ns IS NULL")):
        op.create_index(name, "cronoq_tasks", [column], schema=schema,
                        sqlite_where=sa.text(where), postgresql_where=sa.text(where))
    op.create_table(
        "cronoq_schedules",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_cronoq_schedules"),
        schema=schema,
    )
    meta = op.create_table(
        "cronoq_meta",
        sa.Column("id", sa.Integer, nullable=False, autoincrement=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("high_water", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.Text, nullable=True),
        sa.Column("lease_expires_ns", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_cronoq_meta"),
        schema=schema,
    )
    op.bulk_insert(meta, [{"id": 1, "epoch": 0, "high_water": 0, "holder": None, "lease_expires_ns": None}])


def downgrade() -> None:
    schema = _schema()
    op.drop_table("cronoq_meta", schema=schema)
    op.drop_table("cronoq_schedules", schema=schema)
    for name in ("ix_cronoq_tasks_live", "ix_cronoq_tasks_finished_ns", "ix_cronoq_tasks_key"):
        op.drop_index(name, table_name="cronoq_tasks", schema=schema)
    op.drop_table("cronoq_tasks", schema=schema)
