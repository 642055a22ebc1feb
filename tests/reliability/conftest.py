"""The receiver's fixtures, shared with ``tests/orchestrator``: real captured bundles and the app
driven in-process (a database of each backend, SQLite and PostgreSQL, is tests/conftest.py's)."""

from __future__ import annotations

from tests.orchestrator.conftest import (  # noqa: F401 (fixtures, found by name)
    _clean_env,
    captured,
    make_receiver,
    receiver,
)
