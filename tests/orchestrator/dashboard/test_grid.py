"""The commit grid over the seeded world: a branch's latest commits by job, every cell's outcome in
a symbol and words, its link (the CI run when it is a web address, else the upload's failing
tests), the legend, the defaults, the bounds, and hostile queries; and an upload's page."""

from __future__ import annotations

import pytest

from flaketriage.orchestrator.dashboard import grid as grid_page
from flaketriage.records.models import UploadRow
from flaketriage.results import TestResult
from tests.orchestrator.dashboard.conftest import FEATURE_BRANCH, Dashboard, World
from tests.orchestrator.dashboard.reading import Page
from tests.orchestrator.dashboard.test_tests_page import MIGRATE, upload

JOB = "test (os=linux,python=3.12)"
MAIN_UPLOADS = [9999, *range(2006, 2000, -1), *range(1005, 1000, -1), 25, 45]
"""The seeded uploads of main, newest first (one commit each: the upload's number in hex)."""


def sha(n: int) -> str:
    return f"{n:07x}"


def get(world: World, query: str = "", status: int = 200) -> Page:
    answer = world.client.get(f"/dashboard/grid{query}")
    assert answer.status_code == status, answer.text
    return Page(answer.text)


def upload_pk(world: World, n: int) -> int:
    with world.database.session() as session:
        found = session.query(UploadRow.id).filter(UploadRow.upload_id == f"upload-{n:06d}").scalar()
    assert found is not None
    return int(found)


def test_the_latest_branch_is_drawn_by_default(seeded: World) -> None:
    page = get(seeded)
    assert page.text("grid-heading") == "acme/app · main"
    table = page.table("grid-table")
    assert table[0] == ["Commit", JOB]
    assert [row[0].split(" ")[0] for row in table[1:]] == [sha(n) for n in MAIN_UPLOADS]
    cells = {row[0].split(" ")[0]: row[1] for row in table[1:]}
    assert cells[sha(9999)] == "⚠ 4 failed (storm)"
    assert cells[sha(1005)] == f"✗ 1 failed tests that failed in {JOB} on {sha(1005)}"  # a second link
    assert cells[sha(2001)] == "↻ passed on retry"
    assert cells[sha(45)] == "✗ 1 failed"
    legend = page.text("grid-legend")
    for words in ("passed", "failed", "passed on retry", "not run", "storm"):
        assert words in legend


def test_each_cell_leads_to_its_run_or_its_failing_tests(seeded: World) -> None:
    page = get(seeded)
    links = page.links("grid-table")
    assert ("https://github.com/acme/app/actions/runs/1005", "✗ 1 failed") in links
    assert (
        f"/dashboard/grid/uploads/{upload_pk(seeded, 1005)}",
        "tests that failed in " + JOB + " on 00003ed",
    ) in [(h, t) for h, t in links]
    assert ("https://github.com/acme/app/actions/runs/2003", "↻ passed on retry") in links
    # No run URL: the cell leads to the upload's failing tests.
    assert (f"/dashboard/grid/uploads/{upload_pk(seeded, 9999)}", "⚠ 4 failed (storm)") in links
    labels = [a.attrs["aria-label"] for a in page.by_id("grid-table").iter("a") if "aria-label" in a.attrs]
    assert f"{JOB} on {sha(1005)}: 1 failed (its CI run)" in labels


def test_another_branch_and_a_job_that_did_not_run(seeded: World) -> None:
    upload(seeded, 7, [TestResult(test_id=MIGRATE, outcome="passed", duration_s=1.0)], job="lint",
           branch=FEATURE_BRANCH)  # fmt: skip
    page = get(seeded, f"?repository=acme/app&branch={FEATURE_BRANCH}")
    table = page.table("grid-table")
    assert table[0] == ["Commit", "lint (os=linux,python=3.12)", JOB]
    assert table[1][1:] == ["✓ passed", "· not run"]
    assert [row[0].split(" ")[0] for row in table[2:]] == [sha(n) for n in range(2012, 2006, -1)]
    assert all(row[1:] == ["· not run", "↻ passed on retry"] for row in table[2:])


def test_the_grid_is_bounded_to_the_latest_commits(seeded: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grid_page, "COMMITS", 3)
    table = get(seeded, "?branch=main&repository=acme/app").table("grid-table")
    assert [row[0].split(" ")[0] for row in table[1:]] == [sha(n) for n in MAIN_UPLOADS[:3]]


def test_a_run_url_that_is_not_http_is_never_a_link(seeded: World) -> None:
    upload(seeded, 8, [TestResult(test_id=MIGRATE, outcome="failed", duration_s=1.0)],
           run_url="javascript:alert(1)")  # fmt: skip
    page = get(seeded)
    assert all(not href.startswith("javascript") for href, _ in page.links())
    assert page.table("grid-table")[1][1] == "✗ 1 failed"


def test_a_branch_without_uploads(seeded: World) -> None:
    page = get(seeded, "?repository=acme/app&branch=nowhere")
    assert page.text("no-commits") == "No results were uploaded from nowhere of acme/app."


def test_an_empty_database(dashboard: Dashboard) -> None:
    empty = Page(dashboard.client.get("/dashboard/grid").text)
    assert empty.text("no-commits").startswith("No results uploaded yet")


@pytest.mark.parametrize(
    "query", ["?branch=%00", "?branch=%ED%A0%80&repository=acme/app", "?repository=%3Cscript%3E&branch=main"]
)
def test_hostile_text_draws_an_empty_grid(seeded: World, query: str) -> None:
    answer = seeded.client.get(f"/dashboard/grid{query}")
    assert answer.status_code == 200 and "<script>" not in answer.text
    assert Page(answer.text).text("no-commits").startswith("No results were uploaded from")


def test_a_filter_too_long_answers_422(seeded: World) -> None:
    page = get(seeded, "?branch=" + "b" * 501, status=422)
    assert "branch is 501 characters long" in page.text("filter-problems")


def test_an_upload_page_lists_its_failing_tests(seeded: World) -> None:
    page = Page(seeded.client.get(f"/dashboard/grid/uploads/{upload_pk(seeded, 1005)}").text)
    assert page.text("upload-outcome") == "✗ failed: 3 tests, 1 failed, 1 passed on retry, 0 skipped"
    assert page.links("failing-tests") == [(f"/dashboard/tests/{seeded.tests[MIGRATE]}", MIGRATE)]
    assert page.text("upload-run") == "https://github.com/acme/app/actions/runs/1005"
    rolled = Page(seeded.client.get(f"/dashboard/grid/uploads/{upload_pk(seeded, 45)}").text)
    assert rolled.text("no-failing").startswith("Its results have been rolled up")


@pytest.mark.parametrize("ident", ["0", "-5", "999999", "99999999999999999999", "x"])
def test_an_unknown_upload_is_404(seeded: World, ident: str) -> None:
    answer = seeded.client.get(f"/dashboard/grid/uploads/{ident}")
    assert answer.status_code == 404
    assert Page(answer.text).text("upload-missing").startswith("There is no upload")
