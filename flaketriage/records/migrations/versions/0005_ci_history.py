"""CI history: every test result of every job (uploads, tests per variant, their results and the
daily roll-up of old ones) and the pull request's check run per commit.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flaketriage.records.models import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = UTCDateTime()


def upgrade() -> None:
    op.create_table(
        "result_uploads",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("upload_id", sa.String(128), nullable=False, unique=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("repository", sa.String(200), nullable=False),
        sa.Column("branch", sa.String(255)),
        sa.Column("commit", sa.String(64)),
        sa.Column("pull_request", sa.Integer),
        sa.Column("run_id", sa.String(200)),
        sa.Column("run_url", sa.Text),
        sa.Column("job", sa.String(200)),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("variant_key", sa.Text, nullable=False),
        sa.Column("tests", sa.Integer, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("passed_on_retry", sa.Integer, nullable=False),
        sa.Column("skipped", sa.Integer, nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("lost_s", sa.Float, nullable=False),
        sa.Column("storm", sa.Boolean, nullable=False),
        sa.Column("totals_added", sa.Boolean, nullable=False),
        sa.Column("received_at", _WHEN, nullable=False),
    )
    op.create_index("ix_result_uploads_commit", "result_uploads", ["repository", "commit"])
    op.create_table(
        "tests",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("repository", sa.String(200), nullable=False),
        sa.Column("test_id", sa.Text, nullable=False),
        sa.Column("variant_key", sa.Text, nullable=False),
        sa.Column("first_seen", _WHEN, nullable=False),
        sa.Column("last_seen", _WHEN, nullable=False),
        sa.Column("runs", sa.Integer, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("passed_on_retry", sa.Integer, nullable=False),
        sa.Column("skipped", sa.Integer, nullable=False),
        sa.Column("blocked_runs", sa.Integer, nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("lost_s", sa.Float, nullable=False),
        sa.Column("last_outcome", sa.String(8)),
        sa.Column("suspected_flaky", sa.Boolean, nullable=False),
        sa.Column("case_id", sa.Integer, sa.ForeignKey("cases.id")),
    )
    op.create_index("ix_tests_repository_seen", "tests", ["repository", "last_seen"])
    op.create_table(
        "test_results",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("test_pk", sa.Integer, nullable=False),
        sa.Column("upload_pk", sa.Integer, nullable=False),
        sa.Column("commit", sa.String(64)),
        sa.Column("branch", sa.String(255)),
        sa.Column("outcome", sa.String(8), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("failed_attempts", sa.Integer, nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("lost_s", sa.Float, nullable=False),
        sa.Column("signature", sa.String(128)),
        sa.Column("quarantined", sa.Boolean, nullable=False),
        sa.Column("storm", sa.Boolean, nullable=False),
        sa.Column("received_at", _WHEN, nullable=False),
    )
    op.create_index("ix_test_results_test", "test_results", ["test_pk", "id"])
    op.create_index("ix_test_results_commit", "test_results", ["test_pk", "commit"])
    op.create_index("ix_test_results_upload_pk", "test_results", ["upload_pk"])
    op.create_table(
        "test_days",
        sa.Column("test_pk", sa.Integer, sa.ForeignKey("tests.id"), primary_key=True),
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("runs", sa.Integer, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("passed_on_retry", sa.Integer, nullable=False),
        sa.Column("storm_runs", sa.Integer, nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("lost_s", sa.Float, nullable=False),
    )
    op.create_table(
        "check_runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("repository", sa.String(200), nullable=False),
        sa.Column("head_sha", sa.String(64), nullable=False),
        sa.Column("pull_request", sa.Integer),
        sa.Column("kind", sa.String(16)),
        sa.Column("location", sa.Text),
        sa.Column("url", sa.Text),
        sa.Column("conclusion", sa.String(16)),
        sa.Column("updated_at", _WHEN, nullable=False),
        sa.UniqueConstraint("repository", "head_sha", name="uq_check_run_commit"),
    )


def downgrade() -> None:
    for table in ("check_runs", "test_days", "test_results", "tests", "result_uploads"):
        op.drop_table(table)
