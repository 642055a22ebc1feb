"""The receiver's fixtures, shared with ``tests/orchestrator``: real captured bundles, a database
of each backend (SQLite, PostgreSQL), and the app driven in-process."""

from __future__ import annotations

from tests.orchestrator.conftest import (  # noqa: F401 (fixtures, found by name)
    _clean_env,
    captured,
    database,
    make_receiver,
    postgres_url,
    receiver,
)
