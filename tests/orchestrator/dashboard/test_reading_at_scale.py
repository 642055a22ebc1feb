"""How the dashboard reads CI history, on both backends: each test's latest results in one statement
whose size does not grow with the tests asked (a statement per test, or a part per test, grew to
seconds of planning and JIT on PostgreSQL), results received since a time among those latest, the
set of tests on a branch, and a condition on thousands of ids sent as one parameter."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import event, func, not_, select

from flaketriage.orchestrator.dashboard.tests import STRIP, latest_results
from flaketriage.records import Database
from flaketriage.records.database import among
from flaketriage.records.history import record_upload
from flaketriage.records.models import ResultRow, TestRow, utc_now
from flaketriage.results import ResultsUpload, TestResult

START = utc_now() - timedelta(days=10)


def ran(database: Database, runs: int, tests: int) -> dict[str, int]:
    """`runs` uploads of `tests` tests, a day apart from `START`; test k fails on run r when
    ``(r + k) % 3 == 0``. Answers the tests' primary keys by id."""
    for r in range(runs):
        upload = ResultsUpload(
            upload_id=f"upload-{r:08d}",
            repository="acme/app",
            branch="main",
            commit=f"{r:07x}",
            job="test",
            tests=tuple(
                TestResult(
                    test_id=f"tests/test_m.py::test_{k}",
                    outcome="failed" if (r + k) % 3 == 0 else "passed",
                    duration_s=1.0,
                )
                for k in range(tests)
            ),
        )
        with database.session() as session:
            record_upload(
                session, upload, storm_share=1.0, storm_min_tests=10**6, now=START + timedelta(days=r)
            )
    with database.session() as session:
        return {str(t): int(pk) for pk, t in session.execute(select(TestRow.id, TestRow.test_id))}


@pytest.fixture
def statements(database: Database) -> Iterator[list[str]]:
    """The SQL text of every statement the database runs."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(database.engine, "before_cursor_execute", record)
    yield seen
    event.remove(database.engine, "before_cursor_execute", record)


def test_each_test_gets_its_latest_results_newest_first(database: Database) -> None:
    pks = ran(database, runs=6, tests=4)
    asked = [pks["tests/test_m.py::test_2"], pks["tests/test_m.py::test_0"]]
    with database.session() as session:
        found = latest_results(session, asked, per_test=4)
    assert list(found) == asked
    for k, pk in ((2, asked[0]), (0, asked[1])):
        results = found[pk]
        assert [r.commit for r in results] == [f"{r:07x}" for r in (5, 4, 3, 2)]
        assert [r.outcome for r in results] == [
            "failed" if (r + k) % 3 == 0 else "passed" for r in (5, 4, 3, 2)
        ]
        assert all(r.test_pk == pk for r in results)
        assert results[0].received_at == START + timedelta(days=5)
    with database.session() as session:
        assert latest_results(session, [], per_test=4) == {}
        assert latest_results(session, [10**6], per_test=4) == {10**6: []}  # no such test: no results


def test_since_keeps_the_latest_results_received_since_then(database: Database) -> None:
    pks = ran(database, runs=6, tests=2)
    pk = pks["tests/test_m.py::test_1"]
    with database.session() as session:
        since = latest_results(session, [pk], per_test=4, since=START + timedelta(days=4))
        none_since = latest_results(session, [pk], per_test=4, since=START + timedelta(days=30))
    assert [r.commit for r in since[pk]] == [f"{r:07x}" for r in (5, 4)]
    assert none_since[pk] == []


def test_one_statement_of_one_size_however_many_tests(database: Database, statements: list[str]) -> None:
    pks = sorted(ran(database, runs=2, tests=60).values())
    sizes = []
    for asked in (pks[:1], pks):
        statements.clear()
        with database.session() as session:
            found = latest_results(session, asked, per_test=STRIP)
        assert sum(len(v) for v in found.values()) == 2 * len(asked)
        reads = [s for s in statements if "test_results" in s]
        assert len(reads) == 1  # one statement, not one per test
        sizes.append(len(reads[0]))
    if database.engine.dialect.name == "postgresql":
        assert sizes[0] == sizes[1]  # the tests are one array parameter
    else:
        assert sizes[1] > sizes[0]  # SQLite: a UNION ALL part per test (no LATERAL there)


@pytest.mark.parametrize("how_many", [0, 1, 5000])
def test_among_is_in_and_its_negation_on_both_backends(
    database: Database, statements: list[str], how_many: int
) -> None:
    pks = sorted(ran(database, runs=1, tests=8).values())
    chosen = pks[::3][: min(how_many, 3)] + list(range(10**6, 10**6 + max(0, how_many - 3)))
    with database.session() as session:
        statements.clear()
        inside = set(session.scalars(select(TestRow.id).where(among(session, TestRow.id, chosen))))
        outside = set(session.scalars(select(TestRow.id).where(not_(among(session, TestRow.id, chosen)))))
        counted = session.scalar(select(func.count()).select_from(ResultRow))
    assert inside == set(chosen) & set(pks)
    assert outside == set(pks) - inside
    assert counted == 8
    if database.engine.dialect.name == "postgresql":
        assert all(len(s) < 400 for s in statements)  # thousands of ids, one parameter
