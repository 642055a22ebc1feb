"""The first schema: cases, occurrences, deliveries, work, replays, quarantine.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flaketriage.records.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cases",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("fingerprint", sa.String(128), nullable=False, unique=True),
        sa.Column("cause_key", sa.String(64), index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("test_id", sa.Text),
        sa.Column("job", sa.Text),
        sa.Column("repository", sa.String(200)),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("verdict", sa.String(32), index=True),
        sa.Column("error", sa.Text),
        sa.Column("first_seen", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
        sa.Column("occurrences", sa.Integer, nullable=False),
        sa.Column("report_kind", sa.String(16)),
        sa.Column("report_url", sa.Text),
        sa.Column("last_triage_at", UTCDateTime()),
        sa.Column("evidence", sa.JSON),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("storm_of", sa.Integer, sa.ForeignKey("cases.id")),
    )
    op.create_table(
        "occurrences",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("case_id", sa.Integer, sa.ForeignKey("cases.id"), nullable=False, index=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("delivery_id", sa.String(128), nullable=False),
        sa.Column("bundle_id", sa.String(64)),
        sa.Column("store_url", sa.Text),
        sa.Column("test_id", sa.Text),
        sa.Column("provenance", sa.JSON, nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("source", "delivery_id", "case_id", name="uq_occurrence_delivery"),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("delivery_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("source", "delivery_id", name="uq_delivery"),
    )
    op.create_table(
        "work",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(200), nullable=False, unique=True),
        sa.Column("case_id", sa.Integer, sa.ForeignKey("cases.id"), index=True),
        sa.Column("bundle_id", sa.String(64)),
        sa.Column("store_url", sa.Text),
        sa.Column("step", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("result", sa.JSON),
        sa.Column("error", sa.Text),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime()),
        sa.Column("started_at", UTCDateTime()),
        sa.Column("heartbeat_at", UTCDateTime()),
        sa.Column("finished_at", UTCDateTime()),
    )
    op.create_index("ix_work_status_sent", "work", ["status", "sent_at"])
    op.create_table(
        "replays",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("work_id", sa.Integer, sa.ForeignKey("work.id"), nullable=False, index=True),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(32)),
        sa.Column("fingerprint", sa.String(128)),
        sa.Column("summary", sa.Text),
        sa.Column("duration_s", sa.Float),
        sa.Column("runner", sa.String(200)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime()),
        sa.Column("finished_at", UTCDateTime()),
        sa.UniqueConstraint("work_id", "idx", name="uq_replay_index"),
    )
    op.create_table(
        "quarantine",
        sa.Column("fingerprint", sa.String(128), primary_key=True),
        sa.Column("case_id", sa.Integer, sa.ForeignKey("cases.id")),
        sa.Column("entry", sa.JSON, nullable=False),
        sa.Column("clean_reruns", sa.Integer, nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    for table in ("quarantine", "replays", "work", "deliveries", "occurrences", "cases"):
        op.drop_table(table)
