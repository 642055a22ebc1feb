"""Each case's identity: what it is found by whatever the source (a pytest test's exception through
its code path, else the fingerprint). Existing cases get their fingerprint, and adopt the identity
of the first sighting of theirs that carries one (`flaketriage.orchestrator.case_batch`).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cases") as batch:
        batch.add_column(sa.Column("identity", sa.String(128)))
    op.execute("UPDATE cases SET identity = fingerprint")
    op.create_index("ix_cases_identity", "cases", ["identity"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_cases_identity", table_name="cases")
    with op.batch_alter_table("cases") as batch:
        batch.drop_column("identity")
