"""The case and work transitions (`flaketriage.records.transitions`), on SQLite and PostgreSQL
(the `database` fixture of tests/conftest.py)."""

from __future__ import annotations

import itertools

from flaketriage.records import Case, CaseStatus, Database, Work, WorkStatus
from flaketriage.records.models import utc_now
from flaketriage.records.transitions import (
    case_decided,
    case_reported,
    case_triaging,
    work_done,
    work_resent,
    work_waiting,
)

_serial = itertools.count()


def _case(database: Database, status: CaseStatus, **values: object) -> int:
    with database.session() as session:
        values.setdefault("kind", "bundle")
        case = Case(fingerprint=f"fp-{next(_serial)}", status=status.value, **values)
        session.add(case)
        session.flush()
        return case.id


def _status(database: Database, case_id: int) -> str:
    with database.session() as session:
        return session.get_one(Case, case_id).status


def test_a_triage_starts_a_queued_case_and_leaves_any_other_where_it_stands(database: Database) -> None:
    queued, decided = _case(database, CaseStatus.QUEUED), _case(database, CaseStatus.DECIDED)
    with database.session() as session:
        case_triaging(session, queued)
        case_triaging(session, decided)  # not in only_from: the conditional UPDATE changes nothing
        case_triaging(session, None)  # a triage asked for by id alone has no case
    assert _status(database, queued) == "triaging"
    assert _status(database, decided) == "decided"


def test_a_reported_case_takes_its_storm_followers_with_it(database: Database) -> None:
    leader = _case(database, CaseStatus.TRIAGING)
    follower = _case(database, CaseStatus.QUEUED, storm_of=leader)
    with database.session() as session:
        case = session.get_one(Case, leader)
        case_decided(case, verdict="deterministic", evidence={"verdict": "deterministic"})
        case_reported(session, case, evidence={"verdict": "deterministic"}, report=("markdown", "/x.md"))
    with database.session() as session:
        followed = session.get_one(Case, follower)
        assert (followed.status, followed.verdict, followed.report_kind, followed.report_url) == (
            "reported",
            "deterministic",
            "markdown",
            "/x.md",
        )


def test_a_reported_case_answers_history_s_suspicion_about_its_test(database: Database) -> None:
    bundle = _case(database, CaseStatus.TRIAGING, test_id="tests/test_a.py::test_x", repository="o/r")
    suspected = dict(kind="history", test_id="tests/test_a.py::test_x", repository="o/r")
    same = _case(database, CaseStatus.SUSPECTED_FLAKY, **suspected)
    other_repository = _case(database, CaseStatus.SUSPECTED_FLAKY, **{**suspected, "repository": "o/other"})
    other_test = _case(database, CaseStatus.SUSPECTED_FLAKY, **{**suspected, "test_id": "tests/test_a.py::y"})
    with database.session() as session:
        case = session.get_one(Case, bundle)
        case_decided(case, verdict="flaky", evidence={"verdict": "flaky"})
        case_reported(session, case, evidence={"verdict": "flaky"}, report=("quarantine", "q.json"))
    with database.session() as session:
        answered = session.get_one(Case, same)
        assert (answered.status, answered.verdict, answered.storm_of) == ("reported", "flaky", bundle)
        for untouched in (other_repository, other_test):
            row = session.get_one(Case, untouched)
            assert (row.status, row.verdict, row.storm_of) == ("suspected_flaky", None, None)


def test_work_waits_for_its_replays_then_is_done_and_a_lost_lease_is_queued_again(database: Database) -> None:
    with database.session() as session:
        work = Work(key="triage:1", step="triage", queue="cpu", status=WorkStatus.RUNNING.value)
        session.add(work)
        session.flush()
        work_id = work.id
    with database.session() as session:
        work_waiting(session, work_id)
    with database.session() as session:
        row = session.get_one(Work, work_id)
        assert (row.status, row.heartbeat_at) == ("waiting", None) and row.sent_at is not None
        work_done(session, work_id, result={"verdict": "flaky"})
    with database.session() as session:
        row = session.get_one(Work, work_id)
        assert (row.status, row.result) == ("done", {"verdict": "flaky"}) and row.finished_at is not None
        row.status = WorkStatus.RUNNING.value
        now = utc_now()
        work_resent(row, now=now)
        assert (row.status, row.sent_at) == ("queued", now)
