"""The dashboard's cases pages: indexes for their filters and aggregates, and the two columns of an
occurrence's provenance they find cases by (its CI run's URL and the branch it names), filled in
for the occurrences recorded before.

* ``cases (last_seen, id)``, ``cases (occurrences, id)``: the cases list in its two orders.
* ``occurrences (case_id, id)`` (replacing ``(case_id)``): a case's latest occurrences.
* ``occurrences (received_at, case_id)``: the overview's failures of each day.
* ``occurrences (run_url, case_id)``, ``occurrences (branch, id)``, where filled: the cases of a
  CI run, and of a branch.
* ``result_uploads (branch, id)``: a branch's latest runs; ``result_uploads (received_at, storm,
  lost_s)``: the CI time lost of the last days, from the index alone; ``result_uploads (run_url)``
  (a hash index on PostgreSQL: a run URL may be longer than a B-tree entry): a case's runs' uploads.
* ``replays (finished_at, cpu_s, gpu_s)``: the triage time of the last days, from the index alone.
* ``tests (test_id)`` (a hash index on PostgreSQL): a case's test in CI history.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flaketriage.records.provenance import branch_of, run_url_of

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_BATCH = 5000
_FILLED = {"run_url": "run_url IS NOT NULL", "branch": "branch IS NOT NULL"}


def upgrade() -> None:
    with op.batch_alter_table("occurrences") as batch:
        batch.add_column(sa.Column("run_url", sa.String(1000)))
        batch.add_column(sa.Column("branch", sa.String(255)))
    _fill_occurrences()
    op.drop_index("ix_occurrences_case_id", table_name="occurrences")
    op.create_index("ix_occurrences_case_latest", "occurrences", ["case_id", "id"])
    op.create_index("ix_occurrences_received", "occurrences", ["received_at", "case_id"])
    for name, columns in (("run_url", ["run_url", "case_id"]), ("branch", ["branch", "id"])):
        where = sa.text(_FILLED[name])
        op.create_index(
            f"ix_occurrences_{name}", "occurrences", columns, sqlite_where=where, postgresql_where=where
        )
    op.create_index("ix_cases_last_seen", "cases", ["last_seen", "id"])
    op.create_index("ix_cases_occurrences", "cases", ["occurrences", "id"])
    op.create_index("ix_result_uploads_branch", "result_uploads", ["branch", "id"])
    op.create_index("ix_result_uploads_received", "result_uploads", ["received_at", "storm", "lost_s"])
    op.create_index("ix_result_uploads_run_url", "result_uploads", ["run_url"], postgresql_using="hash")
    op.create_index("ix_replays_finished", "replays", ["finished_at", "cpu_s", "gpu_s"])
    op.create_index("ix_tests_test_id", "tests", ["test_id"], postgresql_using="hash")


def _fill_occurrences() -> None:
    """Copy each recorded occurrence's run URL and branch out of its provenance, in batches by id.
    Read in Python: PostgreSQL's JSON operators fail on a document holding an escaped NUL."""
    conn = op.get_bind()
    table = sa.table(
        "occurrences",
        sa.column("id", sa.Integer),
        sa.column("provenance", sa.JSON),
        sa.column("run_url", sa.String),
        sa.column("branch", sa.String),
    )
    update = (
        sa.update(table)
        .where(table.c.id == sa.bindparam("key"))
        .values(run_url=sa.bindparam("run"), branch=sa.bindparam("named"))
    )
    after = 0
    while True:
        batch = sa.select(table.c.id, table.c.provenance).where(table.c.id > after).order_by(table.c.id)
        rows = conn.execute(batch.limit(_BATCH)).all()
        if not rows:
            return
        after = rows[-1][0]
        values = [
            {"key": ident, "run": run_url_of(p), "named": branch_of(p)}
            for ident, p in rows
            if isinstance(p, dict) and (run_url_of(p) or branch_of(p))
        ]
        if values:
            conn.execute(update, values)


def downgrade() -> None:
    op.drop_index("ix_tests_test_id", table_name="tests")
    op.drop_index("ix_replays_finished", table_name="replays")
    op.drop_index("ix_result_uploads_run_url", table_name="result_uploads")
    op.drop_index("ix_result_uploads_received", table_name="result_uploads")
    op.drop_index("ix_result_uploads_branch", table_name="result_uploads")
    op.drop_index("ix_cases_occurrences", table_name="cases")
    op.drop_index("ix_cases_last_seen", table_name="cases")
    for name in ("branch", "run_url", "received", "case_latest"):
        op.drop_index(f"ix_occurrences_{name}", table_name="occurrences")
    op.create_index("ix_occurrences_case_id", "occurrences", ["case_id"])
    with op.batch_alter_table("occurrences") as batch:
        batch.drop_column("branch")
        batch.drop_column("run_url")
