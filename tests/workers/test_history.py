"""The history step: what recorded CI results say about tests and cases (suspected flaky, resolved
by the sequential test, storms), and the check run it asks for; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from flaketriage.records import Case, CaseStatus, Database, Occurrence, Work
from flaketriage.records.history import record_upload
from flaketriage.records.models import CheckRunRow, TestRow, utc_now
from flaketriage.results import Attempt, ResultsUpload, TestResult
from flaketriage.settings import Settings, load_settings
from flaketriage.work.dispatch import Dispatcher, MemorySender
from flaketriage.work.messages import Step
from flaketriage.workers.history import HistoryFindings, HistoryReader
from flaketriage.workers.verdict import VerdictPolicy

REPO = "acme/models"
HEAD = "feed123" + "0" * 33


class History:
    """Uploads recorded and read, as the receiver and the history step would."""

    def __init__(self, database: Database, **settings: Any) -> None:
        self.database = database
        self.sender = MemorySender()
        self.dispatcher = Dispatcher(database, self.sender)
        self.settings: Settings = load_settings(**settings)
        self.n = 0

    def upload(self, tests: list[TestResult], **fields: Any) -> HistoryFindings:
        self.n += 1
        base: dict[str, Any] = {
            "upload_id": f"up-hist-{self.n:08d}",
            "repository": REPO,
            "branch": "main",
            "commit": f"{self.n:07x}",
            "job": "unit",
        }
        up = ResultsUpload(tests=tuple(tests), **{**base, **fields})
        with self.database.session() as session:
            recorded = record_upload(
                session,
                up,
                storm_share=self.settings.storm_share,
                storm_min_tests=self.settings.storm_min_tests,
            )
            assert recorded.upload_pk is not None
            reader = HistoryReader(session, self.dispatcher, self.settings, VerdictPolicy())
            findings = reader.read(recorded.upload_pk)
        self.dispatcher.send(reader.outgoing)
        return findings

    def sent(self, step: Step) -> list[Work]:
        with self.database.session() as session:
            ids = [order.work_id for name, order, _ in self.sender.sent if name == f"flaketriage.{step}"]
            return [w for w in (session.get(Work, i) for i in ids) if w is not None]

    def case(self, **where: Any) -> Case:
        with self.database.session() as session:
            return session.scalars(select(Case).filter_by(**where)).one()

    def bundle_case(self, test_id: str, *, verdict: str, status: str = CaseStatus.REPORTED.value) -> int:
        """A case captured with a bundle, decided with `verdict`, as the service records one."""
        with self.database.session() as session:
            case = Case(
                fingerprint="ab" * 32,
                kind="bundle",
                title="AssertionError",
                test_id=test_id,
                repository=REPO,
                status=status,
                verdict=verdict,
                occurrences=1,
                last_seen=utc_now(),
            )
            session.add(case)
            session.flush()
            session.add(
                Occurrence(
                    case_id=case.id,
                    source="events",
                    delivery_id="e1",
                    bundle_id="cd" * 32,
                    store_url="memory://ci",
                    test_id=test_id,
                )
            )
            return case.id


@pytest.fixture
def history(database: Database) -> History:
    return History(database, storm_min_tests=4, resolve_branches=["main"])


def passed(test_id: str) -> TestResult:
    return TestResult(test_id=test_id, outcome="passed", duration_s=1.0)


def failed(test_id: str) -> TestResult:
    return TestResult(test_id=test_id, outcome="failed", duration_s=1.0, message="boom")


def others(n: int = 4) -> list[TestResult]:
    return [passed(f"t::ok{i}") for i in range(n)]


def test_failed_and_passed_on_one_commit_opens_a_suspected_flaky_case(history: History) -> None:
    first = history.upload([failed("t::a"), *others()], commit="abc1234")
    assert first.suspected == [] and first.opened == []  # one failure alone says nothing yet
    history.upload([passed("t::a"), *others()], commit="def5678")  # another commit: nothing either
    second = history.upload([passed("t::a"), *others()], commit="abc1234", job="rerun")
    assert second.suspected == ["t::a"]  # the job rerun passed where it had failed
    case = history.case(test_id="t::a")
    assert (case.kind, case.status, case.repository) == ("history", CaseStatus.SUSPECTED_FLAKY.value, REPO)
    assert second.opened == [case.id]
    with history.database.session() as session:
        test = session.scalars(select(TestRow).where(TestRow.test_id == "t::a")).one()
        assert test.suspected_flaky and test.case_id == case.id
        occurrence = session.scalars(select(Occurrence).where(Occurrence.case_id == case.id)).one()
        assert occurrence.source == "results" and occurrence.provenance["commit"] == "abc1234"
    # Suspected once: its next failures add to its rate, not to its cases.
    assert history.upload([failed("t::a"), *others()], commit="abc1234").suspected == []


def test_a_failure_after_a_pass_on_the_same_commit_is_suspected_too(history: History) -> None:
    assert history.upload([passed("t::a"), *others()], commit="abc1234").suspected == []
    assert history.upload([failed("t::a"), *others()], commit="abc1234").suspected == ["t::a"]


def test_a_pass_on_retry_in_one_job_is_suspected_at_once(history: History) -> None:
    retried = TestResult(test_id="t::r", outcome="passed", attempts=(Attempt(outcome="failed"),))
    findings = history.upload([retried, *others()])
    assert findings.suspected == ["t::r"]
    assert history.case(test_id="t::r").status == CaseStatus.SUSPECTED_FLAKY.value


def test_a_test_that_keeps_flipping_is_suspected(history: History) -> None:
    when = [
        i
        for i in range(12)
        if history.upload([failed("t::f") if i % 2 else passed("t::f"), *others()]).suspected == ["t::f"]
    ]
    assert when == [9]  # its first failure once it has 10 results (FLAKETRIAGE_FLIP_MIN_RUNS)
    assert history.case(test_id="t::f").kind == "history"


def test_a_test_that_broke_and_stays_broken_is_not_suspected(history: History) -> None:
    for i in range(12):
        findings = history.upload([failed("t::b") if i >= 6 else passed("t::b"), *others()])
        assert findings.suspected == []


def test_a_suspect_with_a_bundle_is_triaged_again(history: History) -> None:
    case_id = history.bundle_case("t::a", verdict="deterministic")
    history.upload([failed("t::a"), *others()], commit="abc1234")
    findings = history.upload([passed("t::a"), failed("t::a"), *others()], commit="abc1234")
    assert findings.retriaged == [case_id] and findings.opened == []
    case = history.case(id=case_id)
    assert case.status == CaseStatus.SUSPECTED_FLAKY.value and case.generation == 1
    [triage] = history.sent(Step.TRIAGE)
    assert (triage.case_id, triage.bundle_id, triage.store_url) == (case_id, "cd" * 32, "memory://ci")


def test_a_storm_opens_nothing(history: History) -> None:
    history.upload([failed("t::a"), *others()], commit="abc1234")
    findings = history.upload([failed(f"t::{i}") for i in range(6)] + [passed("t::a")], commit="abc1234")
    assert findings.storm and findings.suspected == []
    # Nothing in a storm counts: its pass of t::a on this commit does not make t::a flaky.
    assert history.upload([failed("t::a"), *others()], commit="abc1234").suspected == []
    assert history.upload([passed("t::a"), failed("t::a"), *others()], commit="abc1234").suspected == ["t::a"]


def test_a_deterministic_case_is_resolved_by_the_sequential_test_on_its_branch(history: History) -> None:
    case_id = history.bundle_case("t::d", verdict="deterministic")
    needed = VerdictPolicy().not_reproduced_after
    for _ in range(needed - 1):
        assert history.upload([passed("t::d")]).resolved == []
        assert history.upload([passed("t::d")], branch="feature").resolved == []  # not its branch
    findings = history.upload([passed("t::d")])
    assert findings.resolved == [case_id] and findings.passes[case_id] == needed
    case = history.case(id=case_id)
    assert (case.status, case.verdict) == (CaseStatus.FIXED.value, "deterministic")


def test_a_failure_on_the_branch_keeps_the_case_open(history: History) -> None:
    case_id = history.bundle_case("t::d", verdict="deterministic")
    needed = VerdictPolicy().not_reproduced_after
    history.upload([failed("t::d")])
    for _ in range(needed + 5):
        assert history.upload([passed("t::d")]).resolved == []
    assert history.case(id=case_id).status == CaseStatus.REPORTED.value


def test_a_pull_request_upload_asks_for_its_check_run_once_per_commit(history: History) -> None:
    first = history.upload([failed("t::a"), *others()], pull_request=7, commit=HEAD)
    history.upload([passed("t::a"), *others()], pull_request=7, commit=HEAD, job="gpu")
    assert first.check
    with history.database.session() as session:
        [row] = session.scalars(select(CheckRunRow)).all()
        assert (row.repository, row.head_sha, row.pull_request) == (REPO, HEAD, 7)
    checks = history.sent(Step.CHECK)
    assert len(checks) == 2 and {w.options["check_run"] for w in checks} == {row.id}
    assert history.upload([failed("t::a")]).check is False  # not a pull request
    assert history.upload([failed("t::a")], pull_request=7, commit="feed123").check is False  # abbreviated


def test_the_beat_rolls_old_results_and_the_overviews_failures_up_on_the_report_queue(tmp_path: Any) -> None:
    from flaketriage.records.models import FailureDayRow
    from flaketriage.work.messages import ROLL_UP_FAILURES_TASK, ROLL_UP_TASK
    from flaketriage.workers.celery_app import beat_schedule, create_celery

    database_url = f"sqlite:///{tmp_path / 'r.db'}"
    settings = load_settings(
        broker_url="memory://", gc_every_s=3600, failure_days_every_s=120, database_url=database_url
    )
    schedule = beat_schedule(settings)
    assert schedule["results-roll-up"]["task"] == ROLL_UP_TASK
    assert schedule["results-roll-up"]["schedule"].total_seconds() == 3600
    assert schedule["failures-roll-up"]["task"] == ROLL_UP_FAILURES_TASK
    assert schedule["failures-roll-up"]["schedule"].total_seconds() == 120
    app = create_celery(settings)
    for task in (ROLL_UP_TASK, ROLL_UP_FAILURES_TASK):
        assert task in app.tasks and app.conf.task_routes[task] == {"queue": "report"}
    assert {"flaketriage.history", "flaketriage.check"} <= set(app.tasks)
    database = Database(database_url)
    database.upgrade()
    with database.session() as session:
        case = Case(fingerprint="f", kind="bundle", verdict="flaky", status="reported")
        session.add(case)
        session.flush()
        two_days_ago = utc_now() - timedelta(days=2)
        session.add(Occurrence(case_id=case.id, source="events", delivery_id="d", received_at=two_days_ago))
    assert app.tasks[ROLL_UP_FAILURES_TASK].apply().get() == 1  # the task itself, run here
    with database.session() as session:
        [row] = session.scalars(select(FailureDayRow)).all()
        assert (row.day, row.verdict, row.failures) == (two_days_ago.date(), "flaky", 1)
    database.dispose()


def test_a_commits_check_run_says_what_is_known_of_each_failure(history: History, tmp_path: Any) -> None:
    from flaketriage.records import QuarantineRow
    from flaketriage.workers.check_runs import gather, publish
    from flaketriage.workers.report.checks import MarkdownCheckSink, render_check

    real = history.bundle_case("t::real", verdict="deterministic")
    with history.database.session() as session:
        case = session.get(Case, real)
        assert case is not None
        case.report_url = "issues/ab12.md"
        case.evidence = {"failure_rate": {"estimate": 1.0, "low": 0.48, "high": 1.0}}
        session.add(QuarantineRow(fingerprint="ef" * 32, entry=_entry("t::held")))
    history.upload(
        [failed("t::real"), failed("t::held"), failed("t::new"), *others()], pull_request=7, commit=HEAD
    )
    history.upload([passed("t::new"), *others()], pull_request=7, commit=HEAD, job="rerun")
    with history.database.session() as session:
        row = session.scalars(select(CheckRunRow)).one()
        summary = gather(session, row)
        states = {f.test_id: f.state for f in summary.failures}
        assert states == {"t::real": "real", "t::held": "quarantined", "t::new": "triaging"}
        by_id = {f.test_id: f for f in summary.failures}
        assert by_id["t::real"].issue_url == "issues/ab12.md" and by_id["t::held"].rate == (0.3, 0.1, 0.6)
        assert summary.tests == 12 and summary.pull_request == 7
        out = render_check(summary)
        assert (out.status, out.conclusion) == ("in_progress", "failure")
        sink = MarkdownCheckSink(tmp_path / "checks")
        publish(session, row, sink, history.settings)
        location = row.location
    assert location is not None and HEAD in location
    # The history case of t::new is decided flaky: published again, in place.
    with history.database.session() as session:
        case = session.scalars(select(Case).where(Case.test_id == "t::new")).one()
        case.status, case.verdict = CaseStatus.REPORTED.value, "flaky"
        row = session.scalars(select(CheckRunRow)).one()
        publish(session, row, sink, history.settings)
        assert row.location == location
        assert render_check(gather(session, row)).status == "completed"
    assert len(list((tmp_path / "checks").rglob("*.md"))) == 1


def _entry(test_id: str) -> dict[str, Any]:
    return {
        "fingerprint": "ef" * 32,
        "test_id": test_id,
        "reason": "flaky",
        "evidence": {"replays": 10, "reproductions": 3, "rate": {"estimate": 0.3, "low": 0.1, "high": 0.6}},
        "command": "pytest",
        "bundle_id": "ab" * 32,
        "occurrences": 1,
        "quarantined_at": "2026-12-01T00:00:00Z",
        "updated_at": "2026-12-01T00:00:00Z",
    }
