"""CI history in SQL: uploads recorded whole and once, tests per variant with their totals, what
recent results say, and old results rolled up; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select

from flaketriage.records import Base, Database
from flaketriage.records.history import (
    HistoryStats,
    TestIds,
    add_totals,
    is_storm,
    recent_results,
    record_upload,
    roll_up,
    same_commit_results,
)
from flaketriage.records.models import ResultRow, TestDayRow, TestRow, UploadRow
from flaketriage.results import Attempt, ResultsUpload, TestResult

HISTORY_TABLES = ("result_uploads", "tests", "test_results", "test_days", "check_runs")


def upload(n: int, tests: list[TestResult], **fields: Any) -> ResultsUpload:
    base: dict[str, Any] = {
        "upload_id": f"up-test-{n:08d}",
        "repository": "acme/models",
        "branch": "main",
        "commit": f"{n:07x}",
        "job": "unit",
        "variant": {"os": "linux", "python": "3.12"},
    }
    return ResultsUpload(tests=tuple(tests), **{**base, **fields})


def passed(test_id: str, seconds: float = 1.0) -> TestResult:
    return TestResult(test_id=test_id, outcome="passed", duration_s=seconds)


def failed(test_id: str, seconds: float = 1.0, **fields: Any) -> TestResult:
    return TestResult(test_id=test_id, outcome="failed", duration_s=seconds, message="boom", **fields)


def record(database: Database, up: ResultsUpload, **kwargs: Any) -> Any:
    """Recorded as the receiver records it, then its totals added as its history step adds them."""
    with database.session() as session:
        recorded = record_upload(session, up, storm_share=0.5, storm_min_tests=4, **kwargs)
    if recorded.upload_pk is not None:
        with database.session() as session:
            assert add_totals(session, recorded.upload_pk)
    return recorded


def test_totals_are_added_once_by_the_history_step_not_by_the_receiver(database: Database) -> None:
    with database.session() as session:
        recorded = record_upload(session, upload(1, [failed("t::a")]), storm_share=0.5, storm_min_tests=4)
    with database.session() as session:
        test = session.scalars(select(TestRow)).one()
        assert (test.runs, test.failures) == (0, 0)  # the receiver only wrote the result
        assert recorded.upload_pk is not None and add_totals(session, recorded.upload_pk)
    with database.session() as session:
        assert not add_totals(session, recorded.upload_pk)  # a retried step adds nothing twice
        test = session.scalars(select(TestRow)).one()
        assert (test.runs, test.failures, test.blocked_runs, test.last_outcome) == (1, 1, 1, "failed")


def test_the_history_migration_builds_what_the_models_describe(database: Database) -> None:
    with database.engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert [d for d in differences if any(t in repr(d) for t in HISTORY_TABLES)] == []


def test_an_upload_is_recorded_with_a_row_per_result_and_a_test_per_variant(database: Database) -> None:
    up = upload(1, [passed("t::a", 2.0), failed("t::b", 3.0), TestResult(test_id="t::c", outcome="skipped")])
    recorded = record(database, up)
    assert recorded.upload_pk is not None and not recorded.storm
    with database.session() as session:
        row = session.get(UploadRow, recorded.upload_pk)
        assert row is not None
        assert (row.tests, row.failures, row.skipped, row.variant_key) == (3, 1, 1, "os=linux,python=3.12")
        tests = {t.test_id: t for t in session.scalars(select(TestRow))}
        assert set(tests) == {"t::a", "t::b", "t::c"}
        assert (tests["t::b"].runs, tests["t::b"].failures, tests["t::b"].blocked_runs) == (1, 1, 1)
        assert tests["t::b"].lost_s == 3.0 and tests["t::a"].lost_s == 0.0
        assert tests["t::a"].last_outcome == "passed"
        assert session.scalar(select(func.count()).select_from(ResultRow)) == 3
        assert [recorded.failed, recorded.passed] == [(tests["t::b"].id,), (tests["t::a"].id,)]


def test_the_same_upload_sent_twice_is_recorded_once(database: Database) -> None:
    up = upload(1, [failed("t::a")])
    assert record(database, up).upload_pk is not None
    again = record(database, up)
    assert again.upload_pk is None
    with database.session() as session:
        assert session.scalar(select(func.count()).select_from(ResultRow)) == 1
        test = session.scalars(select(TestRow)).one()
        assert (test.runs, test.failures) == (1, 1)


def test_totals_add_up_across_uploads_and_a_test_named_twice_in_one(database: Database) -> None:
    record(database, upload(1, [failed("t::a", 1.0), passed("t::a", 1.0)]))
    record(database, upload(2, [passed("t::a", 4.0)]))
    with database.session() as session:
        test = session.scalars(select(TestRow)).one()
        assert (test.runs, test.failures, test.duration_s, test.last_outcome) == (3, 1, 6.0, "passed")
        assert len(recent_results(session, test.id)) == 3


def test_another_variant_is_another_test(database: Database) -> None:
    record(database, upload(1, [failed("t::a")], variant={"gpu": "NVIDIA A100"}))
    record(database, upload(2, [passed("t::a")], variant={"gpu": "none"}))
    with database.session() as session:
        tests = {t.variant_key: t for t in session.scalars(select(TestRow))}
    assert set(tests) == {"gpu=NVIDIA A100", "gpu=none"}
    assert tests["gpu=NVIDIA A100"].failures == 1 and tests["gpu=none"].failures == 0


def test_a_pass_on_retry_counts_its_failed_attempt_as_lost_time(database: Database) -> None:
    retried = TestResult(
        test_id="t::a",
        outcome="passed",
        duration_s=2.0,
        attempts=(Attempt(outcome="failed", duration_s=5.0),),
    )
    recorded = record(database, upload(1, [retried]))
    with database.session() as session:
        test = session.scalars(select(TestRow)).one()
        assert (test.passed_on_retry, test.failures, test.lost_s) == (1, 0, 7.0)
        result = session.scalars(select(ResultRow)).one()
        assert (result.attempts, result.failed_attempts) == (2, 1)
    assert recorded.failed == (test.id,)  # what history looks at: it failed once


def test_a_quarantined_failure_counts_but_blocks_nothing(database: Database) -> None:
    record(database, upload(1, [failed("t::a", quarantined=True)]))
    with database.session() as session:
        test = session.scalars(select(TestRow)).one()
    assert (test.failures, test.blocked_runs) == (1, 0)


def test_a_storm_is_recorded_but_leaves_the_tests_totals_alone(database: Database) -> None:
    record(database, upload(1, [passed(f"t::{i}") for i in range(5)]))
    recorded = record(database, upload(2, [failed(f"t::{i}") for i in range(4)] + [passed("t::4")]))
    assert recorded.storm
    with database.session() as session:
        assert session.get(UploadRow, recorded.upload_pk).storm  # type: ignore[union-attr]
        tests = list(session.scalars(select(TestRow)))
        assert {(t.runs, t.failures) for t in tests} == {(1, 0)}
        stormy = session.scalars(select(ResultRow).where(ResultRow.storm.is_(True))).all()
        assert len(stormy) == 5


def test_what_a_storm_is() -> None:
    assert not is_storm(3, 3, share=0.5, min_tests=4)  # too few tests to say
    assert not is_storm(10, 5, share=0.5, min_tests=4)  # half is not more than half
    assert is_storm(10, 6, share=0.5, min_tests=4)


def stats(*outcomes: tuple[str, str | None, int]) -> HistoryStats:
    rows = [
        ResultRow(id=i, outcome=o, commit=c, failed_attempts=f, duration_s=1.0, storm=False)
        for i, (o, c, f) in enumerate(outcomes)
    ]
    return HistoryStats.of(rows)


def test_flaky_commits_are_those_that_both_failed_and_passed() -> None:
    s = stats(("failed", "a", 1), ("passed", "a", 0), ("failed", "b", 1), ("failed", "b", 1))
    assert s.flaky_commits == 1 and s.runs == 4 and s.failures == 3
    assert stats(("passed", "c", 1)).flaky_commits == 1  # passed on retry: failed and passed on c
    assert stats(("passed", "c", 1)).passed_on_retry == 1


def test_the_flip_rate_counts_changes_between_consecutive_results() -> None:
    assert stats(*[("failed" if i % 2 else "passed", None, 0) for i in range(11)]).flip_rate == 1.0
    broken = stats(*[("passed", None, 0)] * 5 + [("failed", None, 0)] * 6)
    assert broken.flip_rate == 0.1  # broke once and stayed broken: one flip in ten
    assert not broken.suspects_flaky(flip_threshold=0.3, min_runs=10)
    flipping = stats(*[("failed" if i % 3 == 0 else "passed", None, 0) for i in range(12)])
    assert flipping.suspects_flaky(flip_threshold=0.3, min_runs=10)
    assert not flipping.suspects_flaky(flip_threshold=0.3, min_runs=20)  # too few results to say


def test_same_commit_results_finds_every_job_on_one_commit(database: Database) -> None:
    record(database, upload(1, [failed("t::a")], commit="abc1234"))
    record(database, upload(2, [passed("t::a")], commit="abc1234", job="other"))
    record(database, upload(3, [passed("t::a")], commit="def5678"))
    with database.session() as session:
        test = session.scalars(select(TestRow)).one()
        on_commit = same_commit_results(session, test.id, "abc1234")
    assert sorted(r.outcome for r in on_commit) == ["failed", "passed"]
    assert HistoryStats.of(on_commit).flaky_commits == 1


def test_old_results_roll_up_into_days_and_the_totals_stay(database: Database) -> None:
    old = datetime(2026, 1, 10, 12, tzinfo=UTC)
    record(database, upload(1, [failed("t::a"), passed("t::b")]), now=old)
    record(database, upload(2, [passed("t::a")]), now=old + timedelta(hours=1))
    record(database, upload(3, [passed("t::a")]), now=old + timedelta(days=100))
    with database.session() as session:
        assert roll_up(session, keep_days=90, now=old + timedelta(days=100)) == 3
    with database.session() as session:
        assert session.scalar(select(func.count()).select_from(ResultRow)) == 1
        days = {(d.test_pk, d.day, d.runs, d.failures) for d in session.scalars(select(TestDayRow))}
        a = session.scalars(select(TestRow).where(TestRow.test_id == "t::a")).one()
        b = session.scalars(select(TestRow).where(TestRow.test_id == "t::b")).one()
        assert days == {(a.id, old.date(), 2, 1), (b.id, old.date(), 1, 0)}
        assert (a.runs, a.failures) == (3, 1)
    with database.session() as session:
        assert roll_up(session, keep_days=90, now=old + timedelta(days=100)) == 0


def test_text_no_record_can_hold_is_refused_by_the_model_not_the_database() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="x00"):
        TestResult(test_id="t::\x00a", outcome="passed")


def test_text_that_copy_escapes_is_stored_as_it_was_sent(database: Database) -> None:
    branch = "feature/a\\b\tc\nd\re é"
    record(database, upload(1, [failed("t::tab\there", signature="ab" * 8), passed("t::é\\")], branch=branch))
    with database.session() as session:
        rows = session.execute(select(TestRow.test_id, ResultRow.branch, ResultRow.signature).join(
            ResultRow, ResultRow.test_pk == TestRow.id)).all()  # fmt: skip
    assert sorted(rows) == [("t::tab\there", branch, "ab" * 8), ("t::é\\", branch, None)]


def test_known_test_ids_spare_the_lookup_and_are_learned_only_after_a_commit(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flaketriage.records import history

    known = TestIds(limit=3)
    with database.session() as session:
        first = record_upload(session, upload(1, [failed("t::a"), passed("t::b")]), storm_share=0.5,
                              storm_min_tests=4, known=known)  # fmt: skip
    assert known.found(first.ids) == {}  # nothing learned by recording alone
    known.learn(first.ids)
    lookups: list[list[str]] = []
    for writer in (history._SQLiteWriter, history._PostgresWriter):

        def looking(self: Any, keys: list[str], _real: Any = writer.existing) -> dict[str, int]:
            lookups.append(keys)
            return dict(_real(self, keys))

        monkeypatch.setattr(writer, "existing", looking)
    with database.session() as session:
        second = record_upload(session, upload(2, [passed("t::a"), passed("t::b")]), storm_share=0.5,
                               storm_min_tests=4, known=known)  # fmt: skip
    assert second.ids == first.ids and lookups == []  # every test known: no lookup at all
    with database.session() as session:
        third = record_upload(session, upload(3, [passed("t::a"), failed("t::c")]), storm_share=0.5,
                              storm_min_tests=4, known=known)  # fmt: skip
    assert lookups[0] == [_key("t::c")]  # only the new test is looked up
    assert third.ids[_key("t::a")] == first.ids[_key("t::a")]
    known.learn(third.ids)
    known.learn({"x" * 64: 99, "y" * 64: 98})
    assert len(known.found([*first.ids, *third.ids, "x" * 64, "y" * 64])) == 3  # bounded: oldest gone
    with database.session() as session:
        results = session.execute(select(TestRow.test_id, func.count()).join(
            ResultRow, ResultRow.test_pk == TestRow.id).group_by(TestRow.test_id)).all()  # fmt: skip
    assert dict(results) == {"t::a": 3, "t::b": 2, "t::c": 1}


def _key(test_id: str) -> str:
    from flaketriage.records.history import test_key

    return test_key("acme/models", test_id, "os=linux,python=3.12")
