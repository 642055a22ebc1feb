"""What an upload of CI results says, read by the ``history`` step after the receiver recorded it.

* A test that failed and passed on one commit (in two jobs, or on retry in one), or whose outcome
  flips past ``FLAKETRIAGE_FLIP_THRESHOLD``, is **suspected flaky**: its case (an existing one about
  the test, else a new ``history`` case) is ``suspected_flaky``, and a case with a bundle is
  triaged again, so a replay confirms or refutes what history suggests.
* A **deterministic** case whose test passes on one of ``FLAKETRIAGE_RESOLVE_BRANCHES`` is fixed
  once the sequential test, fed the test's results on that branch since the case was last seen,
  says the failure no longer reproduces: the same test that lifts a quarantine, never a number
  of days.
* A **storm** (more than ``FLAKETRIAGE_STORM_SHARE`` of a run's tests failed) is an outage: it opens
  no case and resolves none.
* An upload for a pull request sends the ``check`` step: the commit's check run is published or
  updated in place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from flaketriage.records import Case, CaseStatus, Occurrence, QuarantineRow
from flaketriage.records.history import (
    RECENT,
    HistoryStats,
    add_totals,
    mark_suspected,
    recent_results,
    same_commit_results,
)
from flaketriage.records.models import CheckRunRow, ResultRow, TestRow, UploadRow, utc_now
from flaketriage.records.transitions import case_fixed
from flaketriage.results.model import Outcome as ResultOutcome
from flaketriage.settings import Settings
from flaketriage.work.case_requests import latest_bundle, refresh_checks, retriage
from flaketriage.work.dispatch import Dispatcher, Outgoing
from flaketriage.work.messages import Queue, Step
from flaketriage.workers.verdict import Outcome, SequentialTest, Verdict, VerdictPolicy

MAX_NEW_CASES = 50
"""Cases one upload may open: a run failing this broadly but short of a storm is looked at by its
first 50 failures (by test id), the rest counted in the step's result."""

_SUSPECT_FROM = {CaseStatus.DECIDED.value, CaseStatus.REPORTED.value, CaseStatus.FIXED.value}
"""A case history may send back to triage: one with a verdict history contradicts."""
_RESOLVABLE = {CaseStatus.DECIDED.value, CaseStatus.REPORTED.value, CaseStatus.OPEN.value}


@dataclass
class HistoryFindings:
    """What the step did, as its work row's result records it."""

    storm: bool = False
    branch: str | None = None
    suspected: list[str] = field(default_factory=list)
    """Test ids newly suspected flaky."""
    retriaged: list[int] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    passes: dict[int, int] = field(default_factory=dict)
    """For each resolved case, the passing results on its branch that decided it."""
    left_out: int = 0
    check: bool = False

    def summary(self) -> str:
        """One line for the worker's log."""
        if self.storm:
            return "a storm: recorded as one outage, no test suspected"
        parts = [
            f"{len(self.suspected)} suspected flaky"
            + (f" ({self.left_out} more left out)" if self.left_out else ""),
            f"{len(self.opened)} cases opened",
            f"{len(self.retriaged)} sent to triage",
            f"{len(self.resolved)} resolved",
        ]
        return ", ".join(parts) + ("; check run asked for" if self.check else "")

    def to_json(self) -> dict[str, object]:
        return {
            "storm": self.storm,
            "branch": self.branch,
            "suspected": self.suspected,
            "retriaged": self.retriaged,
            "opened": self.opened,
            "resolved": self.resolved,
            "passes": {str(k): v for k, v in self.passes.items()},
            "left_out": self.left_out,
            "check": self.check,
        }


def history_fingerprint(repository: str, test_id: str, variant: str) -> str:
    """The fingerprint of a case history opens (it has no failure of its own yet)."""
    raw = "\x00".join(("history", repository, test_id, variant)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()


class HistoryReader:
    """Reads one recorded upload (`UploadRow`) in a session, asking `dispatcher` for the work it starts."""

    def __init__(
        self, session: Session, dispatcher: Dispatcher, settings: Settings, policy: VerdictPolicy
    ) -> None:
        self.session = session
        self.dispatcher = dispatcher
        self.settings = settings
        self.policy = policy
        self.outgoing: list[Outgoing | None] = []

    def read(self, upload_pk: int) -> HistoryFindings:
        upload = self.session.get(UploadRow, upload_pk)
        findings = HistoryFindings()
        if upload is None:
            return findings
        findings.storm, findings.branch = upload.storm, upload.branch
        add_totals(self.session, upload_pk)
        if not upload.storm:
            self._suspect(upload, self._candidates(upload), findings)
            if upload.branch and upload.branch in self.settings.resolve_branches:
                self._resolve(upload, findings)
        if upload.pull_request is not None and upload.commit and len(upload.commit) in (40, 64):
            # A check run is attached to a whole commit id; an abbreviated one names none for sure.
            self.request_check(upload.repository, upload.commit, upload.pull_request, f"upload-{upload_pk}")
            findings.check = True
        return findings

    # -- suspected flaky ------------------------------------------------------------------------
    def _candidates(self, upload: UploadRow) -> list[tuple[TestRow, ResultRow]]:
        """This upload's results that may make a test suspect: those that failed (or passed after a
        failed attempt), and the passes of tests that failed on the same commit before (a job
        rerun that passed), by test id."""
        failing = (ResultRow.outcome.in_([ResultOutcome.FAILED.value, ResultOutcome.ERROR.value])) | (
            ResultRow.failed_attempts > 0
        )
        rows = list(
            self.session.execute(
                select(TestRow, ResultRow)
                .join(ResultRow, ResultRow.test_pk == TestRow.id)
                .where(ResultRow.upload_pk == upload.id, failing)
            ).all()
        )
        if upload.commit:
            earlier = aliased(ResultRow)
            failed_before = (
                select(earlier.id)
                .where(
                    earlier.test_pk == ResultRow.test_pk,
                    earlier.commit == upload.commit,
                    earlier.upload_pk != upload.id,
                    earlier.storm.is_(False),
                    earlier.outcome.in_([ResultOutcome.FAILED.value, ResultOutcome.ERROR.value]),
                )
                .exists()
            )
            rows += self.session.execute(
                select(TestRow, ResultRow)
                .join(ResultRow, ResultRow.test_pk == TestRow.id)
                .where(
                    ResultRow.upload_pk == upload.id,
                    ResultRow.outcome == ResultOutcome.PASSED.value,
                    ResultRow.failed_attempts == 0,
                    failed_before,
                )
            ).all()
        return sorted(((t, r) for t, r in rows), key=lambda pair: (pair[0].test_id, pair[1].id))

    def _suspect(
        self, upload: UploadRow, failed: Sequence[tuple[TestRow, ResultRow]], findings: HistoryFindings
    ) -> None:
        opened = 0
        for test, result in failed:
            if test.suspected_flaky and test.case_id is not None:
                continue  # already suspected: its case is there, and its rate grows with each result
            results = same_commit_results(self.session, test.id, result.commit) if result.commit else [result]
            stats = HistoryStats.of(results)
            if not stats.suspects_flaky(self.settings.flip_threshold, self.settings.flip_min_runs):
                stats = HistoryStats.of(recent_results(self.session, test.id, RECENT))
                if not stats.suspects_flaky(self.settings.flip_threshold, self.settings.flip_min_runs):
                    continue
            if opened >= MAX_NEW_CASES:
                findings.left_out += 1
                continue
            opened += 1
            case = self._case_for(test, upload)
            mark_suspected(self.session, test.id, case.id)
            findings.suspected.append(test.test_id)
            if case.kind == "history" and case.id not in findings.opened and case.occurrences == 1:
                findings.opened.append(case.id)
            elif self._retriage(case, upload):
                findings.retriaged.append(case.id)

    def _case_for(self, test: TestRow, upload: UploadRow) -> Case:
        """The case about this test: the newest with a bundle, else one history opens (or opened)."""
        existing = self.session.scalars(
            select(Case)
            .where(Case.repository == test.repository, Case.test_id == test.test_id)
            .order_by(Case.last_seen.desc())
        ).all()
        with_bundle = [c for c in existing if c.kind != "history"]
        if with_bundle:
            return with_bundle[0]
        fingerprint = history_fingerprint(test.repository, test.test_id, test.variant_key)
        case = next((c for c in existing if c.fingerprint == fingerprint), None)
        now = utc_now()
        if case is None:
            case = Case(
                fingerprint=fingerprint,
                identity=fingerprint,
                kind="history",
                title=f"{test.test_id} failed and passed without a change" + _variant_note(test.variant_key),
                test_id=test.test_id,
                job=upload.job,
                repository=test.repository,
                status=CaseStatus.SUSPECTED_FLAKY.value,
                first_seen=now,
                last_seen=now,
                occurrences=0,
            )
            self.session.add(case)
            self.session.flush()
        case.occurrences += 1
        case.last_seen = now
        self.session.add(
            Occurrence(
                case_id=case.id,
                source="results",
                delivery_id=upload.upload_id,
                test_id=test.test_id,
                provenance={
                    "repository": upload.repository,
                    "branch": upload.branch,
                    "commit": upload.commit,
                    "run_url": upload.run_url,
                    "job": upload.job,
                    "variant": test.variant_key,
                },
                received_at=now,
            )
        )
        return case

    def _retriage(self, case: Case, upload: UploadRow) -> bool:
        """Send a case with a bundle back to triage, when its verdict is one history contradicts."""
        if case.status not in _SUSPECT_FROM or case.verdict in ("flaky", "order_dependent"):
            return False
        bundle = latest_bundle(self.session, case.id)
        if bundle is None:
            return False
        sent = retriage(
            self.session,
            self.dispatcher,
            case,
            bundle,
            why=f"history-{upload.id}",
            options={"minimize": False, "reason": "history"},
            suspected=True,
        )
        self.outgoing.append(sent)
        return True

    # -- resolved -------------------------------------------------------------------------------
    def _resolve(self, upload: UploadRow, findings: HistoryFindings) -> None:
        cases = self.session.scalars(
            select(Case).where(
                Case.repository == upload.repository,
                Case.verdict == Verdict.DETERMINISTIC.value,
                Case.status.in_(_RESOLVABLE),
                Case.test_id.is_not(None),
            )
        ).all()
        if not cases:
            return
        passed_here = set(
            self.session.scalars(
                select(TestRow.test_id)
                .join(ResultRow, ResultRow.test_pk == TestRow.id)
                .where(
                    ResultRow.upload_pk == upload.id,
                    ResultRow.outcome == ResultOutcome.PASSED.value,
                    TestRow.test_id.in_([c.test_id for c in cases]),
                )
            )
        )
        for case in cases:
            passes = self._no_longer_fails(case, str(upload.branch)) if case.test_id in passed_here else None
            if passes is not None:
                case_fixed(case, verdict=str(case.verdict))
                self.session.query(QuarantineRow).filter(QuarantineRow.case_id == case.id).delete()
                findings.resolved.append(case.id)
                findings.passes[case.id] = passes
                self.outgoing += refresh_checks(
                    self.session, self.dispatcher, case, why=f"resolved-{upload.id}"
                )

    def _no_longer_fails(self, case: Case, branch: str) -> int | None:
        """The passes that decided it, when the sequential test, fed the test's results on `branch`
        since the case was last seen (every variant, oldest first), says its failure no longer
        reproduces; else None."""
        results = self.session.scalars(
            select(ResultRow.outcome)
            .join(TestRow, TestRow.id == ResultRow.test_pk)
            .where(
                TestRow.repository == case.repository,
                TestRow.test_id == case.test_id,
                ResultRow.branch == branch,
                ResultRow.storm.is_(False),
                ResultRow.received_at >= case.last_seen,
            )
            .order_by(ResultRow.id)
            .limit(self.policy.max_replays * 4)
        ).all()
        test = SequentialTest(self.policy)
        for outcome in results:
            if outcome == ResultOutcome.SKIPPED.value:
                continue
            test.add(Outcome.REPRODUCED if ResultOutcome(outcome).failing else Outcome.PASSED)
            if test.done:
                break
        decided = test.done and test.result().verdict is Verdict.NOT_REPRODUCED
        return test.result().passes if decided else None

    # -- the check run --------------------------------------------------------------------------
    def request_check(self, repository: str, head_sha: str, pull_request: int | None, why: str) -> None:
        """Ask for the commit's check run to be published again (created the first time)."""
        row = self.session.scalars(
            select(CheckRunRow).where(CheckRunRow.repository == repository, CheckRunRow.head_sha == head_sha)
        ).first()
        if row is None:
            row = CheckRunRow(repository=repository, head_sha=head_sha, pull_request=pull_request)
            self.session.add(row)
            self.session.flush()
        _, sent = self.dispatcher.request(
            self.session,
            key=f"check:{row.id}:{why}",
            step=Step.CHECK,
            queue=Queue.REPORT,
            options={"check_run": row.id},
        )
        self.outgoing.append(sent)


def _variant_note(variant: str) -> str:
    return f" ({variant})" if variant else ""
