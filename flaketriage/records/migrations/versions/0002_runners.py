"""Runners: the machines replays ran on, with the environment-specific verdicts that point at them;
and each replay's worker process beside its runner.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flaketriage.records.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runners",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("gpus", sa.JSON, nullable=False),
        sa.Column("driver", sa.String(64)),
        sa.Column("first_seen", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
        sa.Column("replays", sa.Integer, nullable=False),
        sa.Column("environment_specific", sa.Integer, nullable=False),
        sa.Column("suspect", sa.Boolean, nullable=False),
        sa.Column("last_case_id", sa.Integer, sa.ForeignKey("cases.id")),
    )
    op.create_index("ix_runners_suspect", "runners", ["suspect"])
    with op.batch_alter_table("replays") as batch:
        batch.add_column(sa.Column("worker", sa.String(200)))


def downgrade() -> None:
    with op.batch_alter_table("replays") as batch:
        batch.drop_column("worker")
    op.drop_index("ix_runners_suspect", "runners")
    op.drop_table("runners")
