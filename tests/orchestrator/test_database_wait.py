"""A service process started before its database answers waits for it (`Database.upgrade_when_up`)
instead of exiting: workers restarted while PostgreSQL restarts came up as nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from flaketriage.errors import RecordsError
from flaketriage.records import Database


def test_the_schema_is_made_once_the_database_answers(tmp_path: Path) -> None:
    path = tmp_path / "service.db"
    path.mkdir()  # SQLite cannot open a directory: a database that does not answer yet
    database = Database(f"sqlite:///{path}")
    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        path.rmdir()  # the database comes up while the process waits

    database.upgrade_when_up(30, say, every_s=0.01)

    assert len(said) == 1 and "FLAKETRIAGE_DATABASE_WAIT_S" in said[0], said
    assert "cases" in inspect(database.engine).get_table_names()
    database.dispose()


def test_a_database_that_never_answers_is_the_last_error_after_the_wait(tmp_path: Path) -> None:
    (tmp_path / "service.db").mkdir()
    database = Database(f"sqlite:///{tmp_path / 'service.db'}")
    said: list[str] = []

    with pytest.raises(RecordsError, match="could not create or upgrade the schema"):
        database.upgrade_when_up(0.2, said.append, every_s=0.05)

    assert said, "each failed try is said before the next"
    with pytest.raises(RecordsError):
        database.upgrade_when_up(0, said.append)  # no wait: the first failure is the answer
    database.dispose()
