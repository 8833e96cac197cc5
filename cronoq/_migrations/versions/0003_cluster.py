"""Many processes, one scheduler: members, the inbox and leased attempts.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _schema():
    config = context.config
    return config.attributes.get("schema", config.get_main_option("cronoq.schema"))


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "cronoq_members",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pools", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("started_ns", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cronoq_members"),
        schema=schema,
    )
    op.create_table(
        "cronoq_inbox",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False,
                  autoincrement=True),
        sa.Column("member", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=True),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("answer", sa.Text, nullable=True),
        sa.Column("answered_ns", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_cronoq_inbox"),
        schema=schema,
        sqlite_autoincrement=True,
    )
    op.create_table(
        "cronoq_attempts",
        sa.Column("lease", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("member", sa.Text, nullable=False),
        sa.Column("task_id", sa.BigInteger, nullable=False),
        sa.Column("pool", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=True),
        sa.Column("output", sa.LargeBinary, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("retry_after_ns", sa.BigInteger, nullable=True),
        sa.Column("heartbeat_ns", sa.BigInteger, nullable=True),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("lease", name="pk_cronoq_attempts"),
        schema=schema,
    )
    op.create_index("ix_cronoq_attempts_member", "cronoq_attempts", ["member", "state"], schema=schema)
    op.create_index("ix_cronoq_attempts_state", "cronoq_attempts", ["state"], schema=schema)


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ix_cronoq_attempts_state", table_name="cronoq_attempts", schema=schema)
    op.drop_index("ix_cronoq_attempts_member", table_name="cronoq_attempts", schema=schema)
    op.drop_table("cronoq_attempts", schema=schema)
    op.drop_table("cronoq_inbox", schema=schema)
    op.drop_table("cronoq_members", schema=schema)
