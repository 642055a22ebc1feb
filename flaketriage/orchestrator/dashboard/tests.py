"""The tests list and a test's page: each test in each variant with a strip of its latest results
(every outcome in text too), its flip rate, whether it failed and passed on one commit, the CI time
it lost, its failures and its quarantine; filtered by repository, branch, suspicion, quarantine and
name, sorted by when last seen, CI time lost or failures, a page of `PAGE_SIZE` at a time.

Bounded for 10 million results: a page's tests come off one of ``tests``' indexes (migration 0007);
their latest results are one query of one index range each (``test_results (test_pk, id)``,
`latest_results`); the branch filter reads the branch's latest upload of each job
(`flaketriage.orchestrator.history.on_branch`), never every result; the quarantine is read once
(`Held`, at most `MAX_ENTRIES` entries).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from pydantic import ValidationError
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Select,
    Text,
    bindparam,
    cast,
    func,
    not_,
    select,
    true,
    union_all,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql import FromClause

from flaketriage.errors import ConfigError
from flaketriage.orchestrator.dashboard.case import parse_case_id, web_link
from flaketriage.orchestrator.dashboard.cases import recent_branches, verdict_label
from flaketriage.orchestrator.dashboard.charts import Cell, strip
from flaketriage.orchestrator.dashboard.query import in_place, read_filters
from flaketriage.orchestrator.history import on_branch
from flaketriage.quarantine import QuarantineEntry
from flaketriage.records import Case, QuarantineRow
from flaketriage.records.database import among
from flaketriage.records.history import RECENT, HistoryStats
from flaketriage.records.models import ResultRow, TestRow, UploadRow
from flaketriage.records.text import storable_text
from flaketriage.results.model import Outcome
from flaketriage.variant import parse_variant, variant_covers

if TYPE_CHECKING:
    from flaketriage.orchestrator.dashboard.views import Views

PAGE_SIZE = 50
MAX_PAGE = 200
"""The last page the list goes to (10,000 tests): past it, narrow the filters."""
STRIP = 20
"""The latest results each test of the list shows (its page shows `RECENT`)."""
MAX_ENTRIES = 5000
"""The most quarantine entries read to tell which tests are quarantined."""
MAX_QUARANTINED_TESTS = 5000
"""The most tests (in every variant) the quarantined filter considers."""
SORTS = {"last_seen": "last seen", "lost": "CI time lost", "failures": "failures"}
CHOICES = ("yes", "no")
YES_NO = {"1": "yes", "true": "yes", "yes": "yes", "0": "no", "false": "no", "no": "no"}
TEXT_FILTERS = ("repository", "branch", "name")
FILTERS = (*TEXT_FILTERS, "flaky", "quarantined", "sort", "page")


# -- the quarantine, as it concerns tests --------------------------------------------------------
@dataclass(frozen=True)
class Quarantine:
    """A test's quarantine: the entry that holds it (None: not quarantined), and an expired entry
    that named it (a hand quarantine past its expiry, which forgives nothing)."""

    entry: QuarantineEntry | None = None
    expired: QuarantineEntry | None = None

    @property
    def held(self) -> bool:
        return self.entry is not None


class Held:
    """The quarantine's entries by the tests they name (read once: `load`)."""

    def __init__(self, entries: Iterable[QuarantineEntry]) -> None:
        self.now = datetime.now(UTC)
        """When the page is read: what has expired by then (one time for the whole page)."""
        self.variants: dict[str, dict[str, str]] = {}
        """Each variant key met, parsed (thousands of tests share a few variants)."""
        self.by_test: dict[str, list[QuarantineEntry]] = {}
        for entry in entries:
            for test in {entry.test_id, *entry.tests} - {None}:
                self.by_test.setdefault(str(test), []).append(entry)

    @classmethod
    def load(cls, session: Session) -> Held:
        """The entries as the database stores them, each read once per process while its text
        is the same (`entry_of`: validating every entry took ~17 ms a page at 300 entries)."""
        texts = session.scalars(select(cast(QuarantineRow.entry, Text)).limit(MAX_ENTRIES))
        return cls(entry for entry in map(entry_of, texts) if entry is not None)

    def of(self, test_id: str, variant_key: str) -> Quarantine:
        covering = self._covering(test_id, variant_key)
        if not covering:
            return Quarantine()
        live = sorted((e for e in covering if not e.expired(self.now)), key=lambda e: e.quarantined_at)
        gone = sorted(
            (e for e in covering if e.expired(self.now)), key=lambda e: e.expires_at or e.updated_at
        )
        return Quarantine(live[0] if live else None, gone[-1] if gone else None)

    def holds(self, test_id: str, variant_key: str) -> bool:
        """Whether a live entry holds the test in that variant (`of`'s ``held``, without the rest)."""
        return any(not e.expired(self.now) for e in self._covering(test_id, variant_key))

    def _covering(self, test_id: str, variant_key: str) -> list[QuarantineEntry]:
        """The entries that name the test and whose variant pattern covers `variant_key`."""
        entries = self.by_test.get(test_id)
        if not entries:
            return []
        variant = self.variants.get(variant_key)
        if variant is None:
            try:
                variant = parse_variant(variant_key, where="a recorded variant")
            except ConfigError:
                variant = {}
            self.variants[variant_key] = variant
        return [e for e in entries if variant_covers(e.variant, variant)]

    @property
    def test_ids(self) -> list[str]:
        return sorted(self.by_test)


@lru_cache(maxsize=2 * MAX_ENTRIES)
def entry_of(text: str) -> QuarantineEntry | None:
    """A stored entry's text as a `QuarantineEntry`; None for one this release cannot read (written
    by a newer one). Entries are frozen, so one read serves every page until the text changes."""
    try:
        return QuarantineEntry.model_validate_json(text)
    except ValidationError:
        return None


def quarantined_tests(session: Session, held: Held, repository: str = "") -> list[int]:
    """The ids of the tests (in each variant) an entry holds: those whose id an entry names, read
    by ``tests (test_id)``, kept where the entry's variant pattern covers theirs."""
    if not held.by_test:
        return []
    query = select(TestRow.id, TestRow.test_id, TestRow.variant_key).where(TestRow.test_id.in_(held.test_ids))
    if repository:
        query = query.where(TestRow.repository == repository)
    rows = session.execute(query.limit(MAX_QUARANTINED_TESTS)).all()
    return [int(pk) for pk, test, variant in rows if held.holds(test, variant)]


# -- results ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Result:
    """One CI result as the pages show it: a `ResultRow`'s columns read without the ORM (a page of
    tests shows 1,000 results; as ORM objects they took longer to load and read than to query)."""

    id: int
    test_pk: int
    upload_pk: int
    commit: str | None
    branch: str | None
    outcome: str
    attempts: int
    failed_attempts: int
    duration_s: float
    quarantined: bool
    storm: bool
    received_at: datetime


RESULT_COLUMNS = tuple(getattr(ResultRow, f.name) for f in fields(Result))


def latest_results(
    session: Session, test_pks: Sequence[int], per_test: int, since: datetime | None = None
) -> dict[int, list[Result]]:
    """Each test's latest `per_test` results, newest first, in one query: per test a
    ``test_results (test_pk, id)`` range read backwards and stopped after `per_test` rows; with
    `since`, those of them received since then (the filter is applied to those rows: a test with no
    result since costs `per_test` rows, not its whole history).

    On PostgreSQL the tests are one array joined LATERAL to that range: a plan as small for a
    thousand tests as for one (a UNION ALL of a part per test took ~200 ms to plan at 500 tests and
    crossed the server's JIT threshold: seconds of compiling). Elsewhere (SQLite) a UNION ALL."""
    if not test_pks:
        return {}
    pks = list(dict.fromkeys(test_pks))

    def newest(test_pk: Any) -> Select[Any]:
        return (
            select(*RESULT_COLUMNS)
            .where(ResultRow.test_pk == test_pk)
            .order_by(ResultRow.id.desc())
            .limit(per_test)
        )

    if session.get_bind().dialect.name == "postgresql":
        asked = select(func.unnest(bindparam("pks", pks, type_=ARRAY(Integer))).column_valued("pk"))
        asked_pk = asked.subquery("asked").c.pk
        shown: FromClause = newest(asked_pk).lateral("newest")
        query = select(*shown.c).select_from(asked_pk.table.join(shown, true()))
    else:
        shown = union_all(*(select(newest(pk).subquery()) for pk in pks)).subquery()
        query = select(*shown.c)
    if since is not None:
        query = query.where(shown.c.received_at >= since)
    found: dict[int, list[Result]] = {pk: [] for pk in pks}
    for row in session.execute(query):
        result = Result(*row)
        found[result.test_pk].append(result)
    for results in found.values():
        results.sort(key=lambda r: r.id, reverse=True)
    return found


def outcome_of(result: Result) -> str:
    """A result's outcome as the pages name it (and its class: ``outcome-<this>``)."""
    if result.outcome == Outcome.PASSED.value and result.failed_attempts:
        return "passed_on_retry"
    return result.outcome


def outcome_label(outcome: str) -> str:
    return outcome.replace("_", " ")


def summary(results: Sequence[Result]) -> str:
    """``12 runs: 9 passed, 3 failed`` (newest first or not, the same words)."""
    return tally([outcome_of(r) for r in results])


def tally(outcomes: Sequence[str]) -> str:
    """`summary` of results by their outcomes (`outcome_of`)."""
    if not outcomes:
        return "no runs recorded"
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    order = ("passed", "passed_on_retry", "failed", "error", "skipped")
    parts = [f"{counts[o]} {outcome_label(o)}" for o in order if o in counts]
    parts += [f"{n} {outcome_label(o)}" for o, n in sorted(counts.items()) if o not in order]
    n = len(outcomes)
    return f"{n} run{'' if n == 1 else 's'}: " + ", ".join(parts)


def results_strip(shown: Sequence[tuple[str, Result]], ident: str, name: str, described: str) -> Markup:
    """The strip of results given oldest first with their outcomes (`TestLine.outcomes`), described
    by `described` (their `tally`)."""
    cells = [cell_of(outcome, r.commit, r.received_at, r.storm) for outcome, r in shown]
    return strip(
        cells, title=f"Latest results of {name}, oldest to newest", description=described + ".", ident=ident
    )


@lru_cache(maxsize=4096)
def cell_of(outcome: str, commit: str | None, received_at: datetime | None, storm: bool) -> Cell:
    """A result's cell in a strip: its outcome in words, commit, time and whether it was a storm.
    The tests of a page mostly ran in the same uploads: their cells are made once."""
    return Cell(
        f"{outcome_label(outcome)}"
        + (f" on {commit[:10]}" if commit else "")
        + (f" ({received_at:%Y-%m-%d %H:%M} UTC)" if received_at else "")
        + (", a storm run" if storm else ""),
        f"outcome-{outcome}",
    )


# -- the list -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TestFilters:
    """What the list shows: each filter ``""`` when not given."""

    __test__ = False

    repository: str = ""
    branch: str = ""
    name: str = ""
    flaky: str = ""
    quarantined: str = ""
    sort: str = "last_seen"
    page: int = 1

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> tuple[TestFilters, list[str]]:
        """As `CaseFilters.parse`: the filters, and what is wrong with the query (a wrong value is
        left out); NUL and lone surrogates become U+FFFD and match nothing."""
        values, problems = read_filters(
            params,
            FILTERS,
            {"flaky": CHOICES, "quarantined": CHOICES, "sort": tuple(SORTS)},
            most_pages=MAX_PAGE,
            aliases={"flaky": YES_NO, "quarantined": YES_NO},  # the API's spelling of a boolean too
        )
        return cls(**values), problems

    @property
    def active(self) -> bool:
        return any(getattr(self, name) for name in (*TEXT_FILTERS, "flaky", "quarantined"))

    def link(self, **changes: Any) -> str:
        changed = replace(self, **changes)
        pairs = [
            (name, str(getattr(changed, name)))
            for name in FILTERS
            if getattr(changed, name) not in ("", None)
            and getattr(changed, name) != getattr(TestFilters, name)
        ]
        return "?" + urlencode(pairs) if pairs else "?"

    def conditions(self, session: Session, held: Held) -> list[ColumnElement[bool]]:
        found: list[ColumnElement[bool]] = []
        if self.repository:
            found.append(TestRow.repository == self.repository)
        if self.name:
            found.append(TestRow.test_id.icontains(self.name, autoescape=True))
        if self.flaky:
            found.append(TestRow.suspected_flaky.is_(self.flaky == "yes"))
        if self.quarantined:
            held_ids = among(session, TestRow.id, quarantined_tests(session, held, self.repository))
            found.append(held_ids if self.quarantined == "yes" else not_(held_ids))
        if self.branch:
            found.append(on_branch(session, self.branch, self.repository or None))
        return found


def order_of(sort: str) -> tuple[Any, ...]:
    column = {"lost": TestRow.lost_s, "failures": TestRow.failures}.get(sort, TestRow.last_seen)
    return (column.desc(), TestRow.id.desc())


@dataclass(frozen=True)
class TestLine:
    """A test in one variant, as the list and its page show it."""

    __test__ = False

    row: TestRow
    results: list[Result]
    """Its latest, newest first."""
    quarantine: Quarantine

    @cached_property
    def stats(self) -> HistoryStats:
        return HistoryStats.of(self.results)

    @cached_property
    def outcomes(self) -> list[tuple[str, Result]]:
        """(outcome, result) oldest to newest, as the strip draws them."""
        return [(outcome_of(r), r) for r in reversed(self.results)]

    @cached_property
    def summary(self) -> str:
        return tally([outcome for outcome, _ in self.outcomes])

    def strip(self, ident: str) -> Markup:
        return results_strip(self.outcomes, ident, self.row.test_id, self.summary)


@dataclass(frozen=True)
class TestPage:
    __test__ = False

    lines: list[TestLine]
    total: int
    filters: TestFilters

    @property
    def pages(self) -> int:
        return min(max(1, math.ceil(self.total / PAGE_SIZE)), MAX_PAGE)

    @property
    def first(self) -> int:
        return (self.filters.page - 1) * PAGE_SIZE + 1 if self.lines else 0

    @property
    def last(self) -> int:
        return (self.filters.page - 1) * PAGE_SIZE + len(self.lines)


def page_of_tests(session: Session, filters: TestFilters) -> TestPage:
    """One count, one page of tests, one query of their latest results, one read of the quarantine."""
    held = Held.load(session)
    conditions = filters.conditions(session, held)
    total = int(session.scalar(select(func.count()).select_from(TestRow).where(*conditions)) or 0)
    rows = list(
        session.scalars(
            select(TestRow)
            .where(*conditions)
            .order_by(*order_of(filters.sort))
            .limit(PAGE_SIZE)
            .offset((filters.page - 1) * PAGE_SIZE)
        )
    )
    results = latest_results(session, [r.id for r in rows], STRIP)
    lines = [TestLine(r, results.get(r.id, []), held.of(r.test_id, r.variant_key)) for r in rows]
    return TestPage(lines, total, filters)


def repositories(session: Session, limit: int = 200) -> list[str]:
    """Repositories of the latest uploads, for the filter's suggestions."""
    latest = select(UploadRow.repository).order_by(UploadRow.id.desc()).limit(500).subquery()
    return sorted(str(r) for r in session.scalars(select(latest.c.repository).distinct().limit(limit)))


# -- one test -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One of a test's latest results with the upload it came in."""

    result: Result
    outcome: str
    job: str | None
    run_url: str | None
    link: str | None
    """`run_url` when the page may link to it (http(s) only)."""


@dataclass
class TestDetails:
    __test__ = False

    line: TestLine
    runs: list[Run]
    cases: list[tuple[int, str, str | None, str]]
    """(id, title, verdict, status) of the cases about the test, latest first."""
    variants: list[tuple[int, str]] = field(default_factory=list)
    """The test's other variants in its repository: (id, variant key)."""


MAX_CASES = 20
MAX_VARIANTS = 50


def load_test(session: Session, test_pk: int) -> TestDetails | None:
    row = session.get(TestRow, test_pk)
    if row is None:
        return None
    results = latest_results(session, [test_pk], RECENT)[test_pk]
    held = Held.load(session)
    uploads = {
        u.id: (u.job, u.run_url)
        for u in session.execute(
            select(UploadRow.id, UploadRow.job, UploadRow.run_url).where(
                UploadRow.id.in_({r.upload_pk for r in results})
            )
        )
    }
    runs = []
    for r in results:
        job, url = uploads.get(r.upload_pk, (None, None))
        runs.append(Run(r, outcome_of(r), job, url, web_link(url)))
    cases = [
        (int(i), str(t), v, str(s))
        for i, t, v, s in session.execute(
            select(Case.id, Case.title, Case.verdict, Case.status)
            .where(Case.test_id == row.test_id, Case.repository == row.repository)
            .order_by(Case.last_seen.desc(), Case.id.desc())
            .limit(MAX_CASES)
        )
    ]
    variants = [
        (int(i), str(v))
        for i, v in session.execute(
            select(TestRow.id, TestRow.variant_key)
            .where(TestRow.test_id == row.test_id, TestRow.repository == row.repository, TestRow.id != row.id)
            .order_by(TestRow.variant_key)
            .limit(MAX_VARIANTS)
        )
    ]
    line = TestLine(row, results, held.of(row.test_id, row.variant_key))
    return TestDetails(line, runs, cases, variants)


def router(views: Views) -> APIRouter:
    routes = APIRouter()

    @routes.get("/tests", response_class=HTMLResponse)
    def tests(request: Request) -> HTMLResponse:
        filters, problems = TestFilters.parse(request.query_params)
        partial = in_place(request)
        with views.service.database.session() as session:
            page = None if problems else page_of_tests(session, filters)
            suggestions = (
                {}
                if partial
                else {"repositories": repositories(session), "branches": recent_branches(session)}
            )
        return views.page(
            request,
            "partials/test_results.html" if partial else "tests.html",
            status_code=422 if problems else 200,
            title="Tests",
            page_key="tests",
            filters=filters,
            problems=problems,
            results=page,
            sorts=SORTS,
            strip_size=STRIP,
            outcome_label=outcome_label,
            **suggestions,
        )

    @routes.get("/tests/{test_pk}", response_class=HTMLResponse)
    def test(request: Request, test_pk: str) -> HTMLResponse:
        ident = parse_case_id(test_pk)  # the same range: an INTEGER key
        details = None
        if ident is not None:
            with views.service.database.session() as session:
                details = load_test(session, ident)
        if details is None:
            return views.page(
                request,
                "test_missing.html",
                status_code=404,
                title="No such test",
                page_key="tests",
                asked=storable_text(test_pk),
            )
        return views.page(
            request,
            "test.html",
            title=f"Test {details.line.row.test_id}",
            page_key="tests",
            details=details,
            line=details.line,
            test=details.line.row,
            recent=RECENT,
            verdict_label=verdict_label,
            outcome_label=outcome_label,
        )

    return routes
