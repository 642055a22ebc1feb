"""The failures of each day by verdict, rolled up for the dashboard's overview (`failure_days`).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flaketriage.records.models import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "failure_days",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("verdict", sa.String(32), primary_key=True),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("rolled_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("failure_days")
