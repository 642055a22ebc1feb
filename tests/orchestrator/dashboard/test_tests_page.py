"""The tests list and a test's page over the seeded world: each test's latest results in text and as
a strip, its flip rate, flaky commits, quarantine, CI time lost and failures; the filters (repository,
branch, suspicion, quarantine, name), the orders, the pages, and hostile queries."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flaketriage.orchestrator.dashboard import tests as tests_page
from flaketriage.quarantine import hand_entry
from flaketriage.records import QuarantineRow
from flaketriage.records.history import add_totals, mark_suspected, record_upload
from flaketriage.records.models import utc_now
from flaketriage.results import ResultsUpload, TestResult
from tests.orchestrator.dashboard.conftest import FEATURE_BRANCH, HOSTILE_TEST, Dashboard, World
from tests.orchestrator.dashboard.reading import SVG, Page

MIGRATE = "tests/test_db.py::test_migrate"
RETRY = "tests/test_net.py::test_retry"
EVERY_TEST = {
    MIGRATE,
    "tests/test_db.py::test_connect",
    "tests/test_time.py::test_clock",
    RETRY,
    *(f"tests/test_all.py::test_{k}" for k in range(4)),
}
STORM = {f"tests/test_all.py::test_{k}" for k in range(4)}
"""The tests of main's latest upload (the seeded outage)."""


def listed(page: Page) -> list[str]:
    """The test ids of the list, in its order."""
    return [row[0].split(" ")[0] for row in page.table("tests-table")[1:]]


def get(world: World, query: str = "", status: int = 200) -> Page:
    answer = world.client.get(f"/dashboard/tests{query}")
    assert answer.status_code == status, answer.text
    return Page(answer.text)


def upload(world: World, n: int, tests: list[TestResult], **fields: object) -> None:
    """An upload received now (after the seeded quarantine began)."""
    made = ResultsUpload(
        upload_id=f"extra-{n:08d}",
        repository=str(fields.pop("repository", "acme/app")),
        branch=str(fields.pop("branch", "main")),
        commit=f"{n:07x}",
        job=str(fields.pop("job", "test")),
        variant={"os": "linux", "python": "3.12"},
        tests=tuple(tests),
        **fields,  # type: ignore[arg-type]
    )
    with world.database.session() as session:
        recorded = record_upload(session, made, storm_share=0.5, storm_min_tests=4, now=utc_now())
    assert recorded.upload_pk is not None
    with world.database.session() as session:
        add_totals(session, recorded.upload_pk)


def test_every_test_is_listed_with_its_latest_results_in_words(seeded: World) -> None:
    page = get(seeded)
    assert page.text("test-results-heading") == "8 tests"
    assert set(listed(page)) == EVERY_TEST
    rows = {r[0].split(" ")[0]: r for r in page.table("tests-table")[1:]}
    migrate, retry = rows[MIGRATE], rows[RETRY]
    # Its results older than 20 days were rolled up: 5 remain, every one failed.
    assert migrate[1].endswith("5 runs: 5 failed")  # after the strip's own words
    assert page.text(f"summary-{seeded.tests[MIGRATE]}") == "5 runs: 5 failed"
    assert migrate[2] == "0%"  # it fails for good: it never flips
    assert migrate[6] == "7 of 7"  # its totals count the rolled-up runs
    assert migrate[5] == "70 s"  # 7 failures of 10 s
    assert page.text(f"summary-{seeded.tests[RETRY]}") == "12 runs: 12 passed on retry"
    assert retry[4] == "12"  # failed and passed on each of its 12 commits
    assert retry[3].startswith("quarantined since")
    assert rows["tests/test_db.py::test_connect"][3] == "not quarantined"
    strip = page.svg(f"strip-{seeded.tests[MIGRATE]}")
    titles = [r.find(f"{SVG}title").text for r in strip.iter(f"{SVG}rect")]  # type: ignore[union-attr]
    assert len(titles) == 5 and all(t and t.startswith("failed on 00003e") for t in titles)
    assert [r.get("class") for r in strip.iter(f"{SVG}rect")] == ["outcome-failed"] * 5
    assert (f"/dashboard/tests/{seeded.tests[RETRY]}", RETRY) in page.links("tests-table")
    assert ("/dashboard/quarantine#entry-" + seeded.specs["flaky"].fingerprint, "quarantined") in page.links(
        "tests-table"
    )


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("?repository=acme/app", EVERY_TEST),
        ("?repository=acme/lib", set()),
        ("?name=TEST_CLOCK", {"tests/test_time.py::test_clock"}),
        ("?name=test_db.py", {MIGRATE, "tests/test_db.py::test_connect"}),
        ("?name=%25", set()),  # a LIKE wildcard is a character like any other
        ("?quarantined=yes", {RETRY}),
        ("?quarantined=no", EVERY_TEST - {RETRY}),
        (f"?branch={FEATURE_BRANCH}", {RETRY}),
        ("?branch=main", STORM),  # main's one job ran last in the outage
        ("?branch=main&repository=acme/lib", set()),
        ("?branch=nowhere", set()),
        ("?flaky=yes", set()),
        ("?flaky=no", EVERY_TEST),
        ("?flaky=false&quarantined=1", {RETRY}),  # as the API spells them
    ],
)
def test_the_filters_narrow_the_list(seeded: World, query: str, expected: set[str]) -> None:
    page = get(seeded, query)
    if expected:
        assert set(listed(page)) == expected
        assert (
            page.text("test-results-heading") == f"{len(expected)} test{'s' * (len(expected) > 1)} matching"
        )
    else:
        assert not page.has("tests-table")
        assert page.text("no-tests") == "No test matches these filters."


def test_a_test_history_suspects_is_found_by_the_flaky_filter(seeded: World) -> None:
    with seeded.database.session() as session:
        mark_suspected(session, seeded.tests["tests/test_time.py::test_clock"], seeded.cases["suspected"])
    page = get(seeded, "?flaky=yes")
    assert listed(page) == ["tests/test_time.py::test_clock"]
    assert "suspected flaky" in page.table("tests-table")[1][0]


def test_the_branch_filter_reads_the_branch_latest_uploads_only(
    seeded: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for one upload's results only: main's newest (the storm's 4 tests) and nothing older.
    monkeypatch.setattr("flaketriage.orchestrator.history.BRANCH_RESULTS", 4)
    assert set(listed(get(seeded, "?branch=main"))) == {f"tests/test_all.py::test_{k}" for k in range(4)}
    # The API's branch filter is the same.
    api = seeded.client.get("/v1/tests", params={"branch": "main"}).json()
    assert {t["test_id"] for t in api} == {f"tests/test_all.py::test_{k}" for k in range(4)}


def test_a_test_is_on_a_branch_while_the_latest_run_of_some_job_ran_it(seeded: World) -> None:
    def ran(*names: str) -> list[TestResult]:
        return [TestResult(test_id=f"tests/test_x.py::{n}", outcome="passed", duration_s=1.0) for n in names]

    upload(seeded, 1, ran("test_a", "test_gone"), job="unit", branch="topic")
    upload(seeded, 2, ran("test_b"), job="integration", branch="topic")
    upload(seeded, 3, ran("test_a", "test_new"), job="unit", branch="topic")  # test_gone was deleted
    upload(seeded, 4, ran("test_c"), job="unit", branch="other")
    expected = {"tests/test_x.py::test_a", "tests/test_x.py::test_new", "tests/test_x.py::test_b"}
    assert set(listed(get(seeded, "?branch=topic"))) == expected
    api = seeded.client.get("/v1/tests", params={"branch": "topic"}).json()
    assert {t["test_id"] for t in api} == expected


def test_the_orders(seeded: World) -> None:
    by_failures = get(seeded, "?sort=failures").table("tests-table")[1:]
    failures = [int(r[6].split(" of ")[0]) for r in by_failures]
    assert failures == sorted(failures, reverse=True) and by_failures[0][0].startswith(MIGRATE)
    by_lost = get(seeded, "?sort=lost").table("tests-table")[1:]
    assert [r[0].split(" ")[0] for r in by_lost[:2]] == [RETRY, MIGRATE]
    assert [r[5] for r in by_lost[:3]] == ["72 s", "70 s", "8.0 s"]
    assert listed(get(seeded))[-1].startswith("tests/test_all.py")  # the storm, a day ago


def test_pages_of_the_list(seeded: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tests_page, "PAGE_SIZE", 3)
    first, third = get(seeded, "?sort=lost"), get(seeded, "?sort=lost&page=3")
    assert first.text("test-range").startswith("Tests 1 to 3 of 8, by CI time lost")
    assert ("/dashboard/tests?sort=lost&page=2", "Next page") in first.links()
    assert third.text("test-range").startswith("Tests 7 to 8 of 8")
    assert ("/dashboard/tests?sort=lost&page=2", "Previous page") in third.links()
    seen = listed(first) + listed(get(seeded, "?sort=lost&page=2")) + listed(third)
    assert sorted(seen) == sorted(EVERY_TEST)
    past = get(seeded, "?page=9")
    assert past.text("no-tests") == "There are no tests on page 9: the list has 3 pages."


def test_no_results_yet(dashboard: Dashboard) -> None:
    page = Page(dashboard.client.get("/dashboard/tests").text)
    assert page.text("test-results-heading") == "0 tests"
    assert page.text("no-tests").startswith("No test results uploaded yet")


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("?sort=name", "sort 'name' is not one of: last_seen, lost, failures"),
        ("?flaky=maybe", "flaky 'maybe' is not one of: yes, no"),
        ("?quarantined=2", "quarantined '2' is not one of: yes, no"),
        ("?page=0", "page '0' is not a page of this list"),
        ("?page=-1", "page '-1' is not a page of this list"),
        ("?page=99999999999999999999", "is not a page of this list"),
        ("?page=%EF%BC%91", "is not a page of this list"),  # a full-width digit
        ("?name=" + "x" * 501, "name is 501 characters long"),
    ],
)
def test_filters_it_cannot_read_answer_422(seeded: World, query: str, problem: str) -> None:
    page = get(seeded, query, status=422)
    assert problem in page.text("filter-problems")
    assert not page.has("tests-table")


@pytest.mark.parametrize(
    "query", ["?name=a%00b", "?name=%ED%A0%80", "?branch=%00", "?repository=%F0%9F%92%A5%00", "?unknown=1"]
)
def test_hostile_text_in_a_filter_matches_nothing(seeded: World, query: str) -> None:
    answer = seeded.client.get(f"/dashboard/tests{query}")
    assert answer.status_code == 200
    if "unknown" not in query:
        assert Page(answer.text).text("no-tests") == "No test matches these filters."


def test_html_in_a_test_name_is_escaped(seeded: World) -> None:
    upload(seeded, 1, [TestResult(test_id=HOSTILE_TEST, outcome="failed", duration_s=1.0)])
    answer = seeded.client.get("/dashboard/tests", params={"name": "<script>"})
    assert HOSTILE_TEST not in answer.text and "<script>alert" not in answer.text
    assert listed(Page(answer.text)) == [HOSTILE_TEST]
    assert Page(answer.text).by_id("filter-name").attrs["value"] == "<script>"


# -- a test's page ----------------------------------------------------------------------------------
def test_a_test_page_says_what_its_history_says(seeded: World) -> None:
    ident = seeded.tests[RETRY]
    page = Page(seeded.client.get(f"/dashboard/tests/{ident}").text)
    assert page.text("test-variant") == "os=linux,python=3.12"
    assert page.text("test-flaky-commits").startswith("12 commits")
    assert page.text("test-flip-rate") == "0% over its latest 12 results"
    assert page.text("strip-summary").startswith("12 runs: 12 passed on retry")
    fingerprint = seeded.specs["flaky"].fingerprint
    quarantine = page.text("test-quarantine")
    assert quarantine.startswith("quarantined since") and f"entry {fingerprint[:12]}" in quarantine
    runs = page.table("runs-table")
    assert len(runs) == 13 and runs[1][1].startswith("passed on retry (1 of 2 attempts failed)")
    assert runs[1][3] == FEATURE_BRANCH and runs[-1][3] == "main"
    run_links = [href for href, text in page.links("runs-table") if text == "CI run"]
    assert run_links[0] == "https://github.com/acme/app/actions/runs/2012" and len(run_links) == 12
    assert (f"/dashboard/cases/{seeded.cases['flaky']}", f"case {seeded.cases['flaky']}") in page.links(
        "test-case-list"
    )


def test_a_run_url_that_is_not_http_is_never_a_link(seeded: World) -> None:
    upload(
        seeded,
        2,
        [TestResult(test_id=MIGRATE, outcome="failed", duration_s=1.0)],
        run_url="javascript:alert(1)",
    )
    page = Page(seeded.client.get(f"/dashboard/tests/{seeded.tests[MIGRATE]}").text)
    assert all(not href.startswith("javascript") for href, _ in page.links())
    assert page.table("runs-table")[1][6] == "javascript:alert(1)"
    det = seeded.cases["deterministic"]
    assert page.links("test-case-list") == [(f"/dashboard/cases/{det}", f"case {det}")]


def test_an_expired_hand_quarantine_does_not_hold_its_test(seeded: World) -> None:
    now = utc_now()
    entry = hand_entry(
        None,
        test_id=MIGRATE,
        variant={},
        owner="db-team",
        expires_at=now - timedelta(hours=1),
        by="alice (token)",
        now=now - timedelta(days=2),
    )
    with seeded.database.session() as session:
        session.add(QuarantineRow(fingerprint=entry.fingerprint, entry=entry.model_dump(mode="json")))
    page = Page(seeded.client.get(f"/dashboard/tests/{seeded.tests[MIGRATE]}").text)
    assert page.text("test-quarantine").startswith("not quarantined: its hand quarantine expired at")
    assert MIGRATE not in listed(get(seeded, "?quarantined=yes"))


@pytest.mark.parametrize("ident", ["0", "-1", "999999", "2147483648", "99999999999999999999", "abc", "1.0"])
def test_a_test_that_does_not_exist_is_404(seeded: World, ident: str) -> None:
    answer = seeded.client.get(f"/dashboard/tests/{ident}")
    assert answer.status_code == 404
    assert Page(answer.text).text("test-missing").startswith("There is no test")


def test_a_test_id_with_html_is_escaped_in_the_404(seeded: World) -> None:
    answer = seeded.client.get("/dashboard/tests/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert answer.status_code == 404 and "<script>alert(1)" not in answer.text
