"""The dashboard's history pages: indexes for the tests list and the commit grid.

* ``tests (last_seen, id)``, ``tests (lost_s, id)``, ``tests (failures, id)``: the tests list in
  its three orders (last seen, CI time lost, failures), a page read off the index's end.
* ``result_uploads (repository, branch, id)``: a repository's branch's latest uploads, for the
  commit grid and the tests' branch filter (``(branch, id)`` alone walks every repository's
  ``main``).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TESTS = {"last_seen": ["last_seen", "id"], "lost": ["lost_s", "id"], "failures": ["failures", "id"]}


def upgrade() -> None:
    for name, columns in _TESTS.items():
        op.create_index(f"ix_tests_{name}", "tests", columns)
    op.create_index("ix_result_uploads_repository_branch", "result_uploads", ["repository", "branch", "id"])


def downgrade() -> None:
    op.drop_index("ix_result_uploads_repository_branch", table_name="result_uploads")
    for name in reversed(_TESTS):
        op.drop_index(f"ix_tests_{name}", table_name="tests")
