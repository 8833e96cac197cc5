"""Checkpointed stages: the latest checkpoint of each stage of a task.

Revision ID: 0002
Revises: 0001

Self-contained: this revision only adds ``cronoq_checkpoints`` (rows are
deleted with their task by pruning and withdrawal), so it may sit on top of
any other revision that follows 0001.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _schema():
    config = context.config
    return config.attributes.get("schema", config.get_main_option("cronoq.schema"))


def upgrade() -> None:
    op.create_table(
        "cronoq_checkpoints",
        sa.Column("task_id", sa.BigInteger, nullable=False),
        sa.Column("stage", sa.Text, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("saved_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("task_id", "stage", name="pk_cronoq_checkpoints"),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_table("cronoq_checkpoints", schema=_schema())
