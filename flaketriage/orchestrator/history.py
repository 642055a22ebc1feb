"""CI history at the service: recording an upload of results (``POST /v1/results``) and answering
``GET /v1/tests`` and ``GET /v1/tests/{id}``.

An upload is recorded in one transaction with the work it starts: a ``history`` step that looks at
what it says (tests suspected flaky, deterministic cases whose tests pass again, the pull
request's check run), so the receiver only writes rows and answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import ColumnElement, false, func, select, true
from sqlalchemy.orm import Session

from flaketriage.orchestrator.api_models import (
    CaseImpact,
    ResultsAccepted,
    TestDetail,
    TestResultView,
    TestSummary,
)
from flaketriage.quarantine import QuarantineEntry
from flaketriage.records import Case, Database, QuarantineRow, ReplayRow, Work
from flaketriage.records.history import HistoryStats, TestIds, recent_results, record_upload
from flaketriage.records.models import ResultRow, TestRow, UploadRow
from flaketriage.results.model import ResultsUpload
from flaketriage.settings import Settings
from flaketriage.variant import parse_variant, variant_covers
from flaketriage.work.dispatch import Dispatcher, Outgoing
from flaketriage.work.messages import Queue, Step

Sort = Literal["last_seen", "lost", "failures"]

BRANCH_UPLOADS = 200
"""The latest uploads of a branch that `branch_uploads` looks at."""
BRANCH_RESULTS = 100_000
"""The most results `branch_uploads`' uploads may hold together: what the branch filter reads (and
hashes: `on_branch`)."""


def accept_results(
    database: Database,
    dispatcher: Dispatcher,
    settings: Settings,
    upload: ResultsUpload,
    known: TestIds | None = None,
) -> ResultsAccepted:
    """Record `upload` and the ``history`` step that reads it; send that step once committed
    (`BrokerError` when the broker is down: recorded, and the sweep sends it). `known` is the
    receiver's `TestIds`, taught the upload's tests once they are committed."""
    outgoing: list[Outgoing | None] = []
    with database.session() as session:
        recorded = record_upload(
            session,
            upload,
            storm_share=settings.storm_share,
            storm_min_tests=settings.storm_min_tests,
            known=known,
        )
        work: list[int] = []
        if recorded.upload_pk is not None:
            row, sent = dispatcher.request(
                session,
                key=f"history:{recorded.upload_pk}",
                step=Step.HISTORY,
                queue=Queue.REPORT,
                options={"upload": recorded.upload_pk},
            )
            work.append(row.id)
            outgoing.append(sent)
    if known is not None and recorded.ids:
        known.learn(recorded.ids)  # committed: the rows and their ids stand
    counts = upload.counts()
    answer = ResultsAccepted(
        outcome="accepted" if recorded.upload_pk is not None else "duplicate",
        upload=recorded.upload_pk,
        tests=len(upload.tests),
        failures=counts["failed"] + counts["error"],
        passed_on_retry=counts["passed_on_retry"],
        storm=recorded.storm,
        work=work,
    )
    dispatcher.send(outgoing)
    return answer


def branch_uploads(session: Session, branch: str, repository: str | None = None) -> list[int]:
    """The uploads whose tests "ran on `branch`" (of `repository`, when given): the latest of each
    job and variant (in each repository) among the branch's latest `BRANCH_UPLOADS`, newest first
    while their results add up to at most `BRANCH_RESULTS` (the newest always counts). A test that
    no job has run since (deleted, renamed) is not on the branch any more. One range scan of
    ``result_uploads (repository, branch, id)`` (or ``(branch, id)``); their tests are then read by
    ``test_results (upload_pk)``, never by looking through every result of every test (a result's
    branch has no index, and there are 10 million of them)."""
    query = select(UploadRow.id, UploadRow.job, UploadRow.variant_key, UploadRow.repository, UploadRow.tests)
    query = query.where(UploadRow.branch == branch)
    if repository:
        query = query.where(UploadRow.repository == repository)
    rows = session.execute(query.order_by(UploadRow.id.desc()).limit(BRANCH_UPLOADS)).all()
    seen: set[tuple[object, ...]] = set()
    chosen: list[int] = []
    results = 0
    for row in rows:
        key = (row.repository, row.job, row.variant_key)
        if key in seen or (chosen and results + row.tests > BRANCH_RESULTS):
            continue
        seen.add(key)
        chosen.append(int(row.id))
        results += row.tests
    return chosen


def on_branch(session: Session, branch: str, repository: str | None = None) -> ColumnElement[bool]:
    """Tests (`TestRow`) that ran on `branch`: in one of its `branch_uploads`.

    Written ``(id IN (...)) IS TRUE`` (the same rows: neither side is ever NULL) so that PostgreSQL
    checks each test against one hash of the uploads' test ids, built once per statement, and stops
    at the page's last row. As a plain ``IN`` its planner joined the whole set (and, reading a page,
    either probed each listed test's whole history for a result in those uploads or joined and
    sorted every test of the branch: 25-60 ms at 20,000 tests, against ~5 ms). The hash holds at
    most `BRANCH_RESULTS` ids, which the server's default ``hash_mem`` (8 MB) holds."""
    uploads = branch_uploads(session, branch, repository)
    if not uploads:
        return false()
    ran = TestRow.id.in_(select(ResultRow.test_pk).where(ResultRow.upload_pk.in_(uploads)))
    return ran.is_(true())


@dataclass(frozen=True)
class _Quarantined:
    """The quarantine's entries by test id, to tell which tests (in which variants) it covers."""

    entries: dict[str, list[QuarantineEntry]]

    @classmethod
    def load(cls, session: Session) -> _Quarantined:
        by_test: dict[str, list[QuarantineEntry]] = {}
        for row in session.scalars(select(QuarantineRow)):
            entry = QuarantineEntry.model_validate(row.entry)
            if entry.expired():
                continue  # CI no longer forgives its test's failures
            for test in {entry.test_id, *entry.tests} - {None}:
                by_test.setdefault(str(test), []).append(entry)
        return cls(by_test)

    def covers(self, test_id: str, variant_key: str) -> bool:
        entries = self.entries.get(test_id, [])
        if not entries:
            return False
        variant = parse_variant(variant_key, where="a recorded variant")
        return any(variant_covers(e.variant, variant) for e in entries)


class TestQuery:
    """Tests as the API answers them."""

    __test__ = False

    def __init__(self, database: Database) -> None:
        self.database = database

    def list(
        self,
        *,
        repository: str | None = None,
        branch: str | None = None,
        flaky: bool | None = None,
        quarantined: bool | None = None,
        sort: Sort = "last_seen",
        limit: int = 100,
    ) -> list[TestSummary]:
        order = (
            TestRow.lost_s.desc()
            if sort == "lost"
            else TestRow.failures.desc()
            if sort == "failures"
            else TestRow.last_seen.desc()
        )
        query = select(TestRow).order_by(order, TestRow.id.desc())
        if repository:
            query = query.where(TestRow.repository == repository)
        if flaky is not None:
            query = query.where(TestRow.suspected_flaky.is_(flaky))
        with self.database.session() as session:
            if branch:
                query = query.where(on_branch(session, branch, repository))
            held = _Quarantined.load(session)
            if quarantined:
                query = query.where(TestRow.test_id.in_(list(held.entries)))
            rows: Iterable[TestRow] = session.scalars(
                query.limit(limit if quarantined is None else limit * 4)
            )
            out = [_summary(row, held.covers(row.test_id, row.variant_key)) for row in rows]
        if quarantined is not None:
            out = [t for t in out if t.quarantined is quarantined]
        return out[:limit]

    def get(self, test_pk: int, recent: int = 50) -> TestDetail | None:
        with self.database.session() as session:
            row = session.get(TestRow, test_pk)
            if row is None:
                return None
            held = _Quarantined.load(session)
            results = recent_results(session, test_pk, recent)
            uploads = {
                u.id: u
                for u in session.scalars(
                    select(UploadRow).where(UploadRow.id.in_({r.upload_pk for r in results}))
                )
            }
            stats = HistoryStats.of(results)
            cases = list(
                session.scalars(
                    select(Case.id)
                    .where(Case.repository == row.repository, Case.test_id == row.test_id)
                    .order_by(Case.last_seen.desc())
                    .limit(50)
                )
            )
            cpu, gpu = _replay_seconds(session, cases)
            return TestDetail(
                **_summary(row, held.covers(row.test_id, row.variant_key)).model_dump(),
                flaky_commits=stats.flaky_commits,
                flip_rate=round(stats.flip_rate, 4),
                recent=[
                    TestResultView(
                        outcome=r.outcome,
                        attempts=r.attempts,
                        failed_attempts=r.failed_attempts,
                        duration_s=r.duration_s,
                        commit=r.commit,
                        branch=r.branch,
                        job=uploads[r.upload_pk].job if r.upload_pk in uploads else None,
                        run_url=uploads[r.upload_pk].run_url if r.upload_pk in uploads else None,
                        quarantined=r.quarantined,
                        storm=r.storm,
                        received_at=r.received_at,
                    )
                    for r in results
                ],
                cases=cases,
                replay_cpu_s=cpu,
                replay_gpu_s=gpu,
            )


def _summary(row: TestRow, quarantined: bool) -> TestSummary:
    return TestSummary(
        id=row.id,
        repository=row.repository,
        test_id=row.test_id,
        variant=row.variant_key,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        runs=row.runs,
        failures=row.failures,
        passed_on_retry=row.passed_on_retry,
        skipped=row.skipped,
        blocked_runs=row.blocked_runs,
        mean_duration_s=round(row.duration_s / row.runs, 6) if row.runs else 0.0,
        ci_lost_s=round(row.lost_s, 3),
        last_outcome=row.last_outcome,
        suspected_flaky=row.suspected_flaky,
        quarantined=quarantined,
        case_id=row.case_id,
    )


def _replay_seconds(session: Session, case_ids: list[int]) -> tuple[float, float]:
    """CPU and GPU seconds of every replay of these cases."""
    if not case_ids:
        return 0.0, 0.0
    cpu, gpu = session.execute(
        select(func.coalesce(func.sum(ReplayRow.cpu_s), 0.0), func.coalesce(func.sum(ReplayRow.gpu_s), 0.0))
        .join(Work, Work.id == ReplayRow.work_id)
        .where(Work.case_id.in_(case_ids))
    ).one()
    return round(float(cpu or 0), 3), round(float(gpu or 0), 3)


def case_impact(session: Session, case: Case) -> CaseImpact:
    """A case's impact (`CaseImpact`): its test's CI cost in every variant and its replays."""
    lost, blocked = 0.0, 0
    if case.test_id and case.repository:
        lost, blocked = session.execute(
            select(
                func.coalesce(func.sum(TestRow.lost_s), 0.0), func.coalesce(func.sum(TestRow.blocked_runs), 0)
            ).where(TestRow.repository == case.repository, TestRow.test_id == case.test_id)
        ).one()
    cpu, gpu, replays = session.execute(
        select(
            func.coalesce(func.sum(ReplayRow.cpu_s), 0.0),
            func.coalesce(func.sum(ReplayRow.gpu_s), 0.0),
            func.count(ReplayRow.id),
        )
        .join(Work, Work.id == ReplayRow.work_id)
        .where(Work.case_id == case.id)
    ).one()
    return CaseImpact(
        ci_lost_s=round(float(lost or 0), 3),
        blocked_runs=int(blocked),
        replay_cpu_s=round(float(cpu or 0), 3),
        replay_gpu_s=round(float(gpu or 0), 3),
        replays=int(replays),
    )
