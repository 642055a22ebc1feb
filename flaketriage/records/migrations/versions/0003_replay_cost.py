"""Each replay's cost: the CPU seconds of its process tree and its GPU seconds (wall time times the
GPUs it was given), which a triage adds up (`flaketriage.workers.cost`).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replays") as batch:
        batch.add_column(sa.Column("cpu_s", sa.Float))
        batch.add_column(sa.Column("gpu_s", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("replays") as batch:
        batch.drop_column("gpu_s")
        batch.drop_column("cpu_s")
