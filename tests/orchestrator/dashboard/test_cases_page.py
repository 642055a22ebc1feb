"""The cases list (``GET /dashboard/cases``): every filter (verdict, status, repository, branch,
test, fingerprint), both orders of impact and the newest first, pages, htmx's partial answer, and
what a hostile query string gets (422 naming what is allowed, or nothing found; never a 500); the
migration that gives occurrences the run and branch the branch filter reads. SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import select, text

from flaketriage.orchestrator.dashboard import cases as cases_page
from flaketriage.orchestrator.dashboard.views import duration
from flaketriage.records import Base, Case, Database, Occurrence
from flaketriage.records.database import MIGRATIONS
from tests.conftest import new_postgres_database
from tests.orchestrator.dashboard.conftest import (
    FEATURE_BRANCH,
    HOSTILE_TEST,
    WORKFLOW_BRANCH,
    Dashboard,
    World,
)
from tests.orchestrator.dashboard.reading import Page


def listed(world: World | Dashboard, query: str = "", status: int = 200, **headers: str) -> Page:
    response = world.client.get(f"/dashboard/cases{query}", headers=headers)
    assert response.status_code == status, response.text
    return Page(response.text)


def ids(page: Page) -> list[int]:
    """The cases the page lists, in order."""
    if not page.has("cases-table"):
        return []
    return [int(href.rsplit("/", 1)[1]) for href, text in page.links("cases-table") if text.startswith("#")]


def keys(world: World, page: Page) -> list[str]:
    by_id = {ident: key for key, ident in world.cases.items()}
    return [by_id[ident] for ident in ids(page)]


def newest_first(world: World) -> list[int]:
    with world.database.session() as session:
        return list(session.scalars(select(Case.id).order_by(Case.last_seen.desc(), Case.id.desc())))


def test_every_case_is_listed_newest_first_with_its_verdict_in_words(seeded: World) -> None:
    page = listed(seeded)
    assert ids(page) == newest_first(seeded)
    assert len(ids(page)) == len(seeded.cases) == 13
    assert page.text("case-results-heading") == "13 cases"
    rows = {row[0].split(" ")[0]: row for row in page.table("cases-table")[1:]}
    flaky = rows[f"#{seeded.cases['flaky']}"]
    assert flaky[1:6] == ["tests/test_net.py::test_retry", "acme/app", "flaky", "reported", "12"]
    assert flaky[6] == duration(72.0)
    assert rows[f"#{seeded.cases['queued']}"][3] == "undecided"
    assert rows[f"#{seeded.cases['order_dependent']}"][6] == "–"  # no CI history of its test
    # The test links to its CI history where it has one.
    assert (
        f"/dashboard/tests/{seeded.tests['tests/test_net.py::test_retry']}",
        "tests/test_net.py::test_retry",
    ) in (page.links("cases-table"))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("?verdict=flaky", {"flaky", "flaky_lib"}),
        ("?verdict=deterministic", {"deterministic", "fixed"}),
        ("?verdict=none", {"queued", "triaging", "suspected", "failed", "workflow", "hostile"}),
        ("?status=suspected_flaky", {"suspected"}),
        ("?status=reported", {"deterministic", "flaky", "environment_specific"}),
        ("?status=open", {"workflow"}),
        ("?repository=acme/lib", {"flaky_lib", "order_dependent", "environment_specific", "failed"}),
        ("?repository=acme/lib&verdict=flaky", {"flaky_lib"}),
        ("?test=TEST_API.PY", {"queued", "triaging"}),  # any case, any part of the id
        ("?test=%25", set()),  # a LIKE wildcard is a character like any other
        ("?test=script", {"hostile"}),
        ("?branch=main", {"deterministic", "flaky", "suspected"}),  # runs CI history knows on main
        (f"?branch={FEATURE_BRANCH}", {"flaky"}),
        (f"?branch={WORKFLOW_BRANCH}", {"workflow"}),  # named by the failed workflow run itself
        ("?branch=main&repository=acme/lib", set()),
        ("?branch=main&verdict=flaky", {"flaky"}),
        ("?branch=nowhere", set()),
        ("?repository=acme/none", set()),
        ("?verdict=&status=&repository=&unknown=1", None),  # empty and unknown parameters: no filter
    ],
)
def test_the_filters_find_the_cases_they_name(seeded: World, query: str, expected: set[str] | None) -> None:
    page = listed(seeded, query)
    if expected is None:
        assert ids(page) == newest_first(seeded)
        return
    assert set(keys(seeded, page)) == expected
    if expected:
        assert (
            page.text("case-results-heading")
            == f"{len(expected)} case{'s' if len(expected) > 1 else ''} matching"
        )
    else:
        assert page.text("no-cases") == "No case matches these filters."


def test_a_fingerprint_is_found_by_its_first_characters(seeded: World) -> None:
    fingerprint = seeded.specs["flaky"].fingerprint
    assert keys(seeded, listed(seeded, f"?fingerprint={fingerprint[:10]}")) == ["flaky"]
    assert keys(seeded, listed(seeded, f"?fingerprint={fingerprint}")) == ["flaky"]
    assert keys(seeded, listed(seeded, f"?fingerprint={fingerprint[1:12]}")) == []


def test_the_filters_are_a_form_that_keeps_what_was_asked(seeded: World) -> None:
    page = listed(seeded, "?verdict=flaky&repository=acme/app&sort=occurrences")
    form = page.by_id("case-filters")
    assert form.attrs["method"] == "get" and form.attrs["action"] == "/dashboard/cases"
    assert form.attrs["hx-get"] == "/dashboard/cases" and form.attrs["hx-target"] == "#case-results"
    assert form.attrs["hx-push-url"] == "true"
    labels = {label.attrs["for"] for label in form.iter("label")}
    assert labels == {
        f"filter-{n}" for n in ("verdict", "status", "repository", "branch", "test", "fingerprint", "sort")
    }
    selected = {
        select.attrs["name"]: [o.attrs["value"] for o in select.iter("option") if "selected" in o.attrs]
        for select in form.iter("select")
    }
    assert selected == {"verdict": ["flaky"], "status": [], "sort": ["occurrences"]}
    assert page.by_id("filter-repository").attrs["value"] == "acme/app"
    suggested = [o.attrs["value"] for o in page.by_id("known-branches").iter("option")]
    assert suggested == sorted({"main", FEATURE_BRANCH})
    assert [o.attrs["value"] for o in page.by_id("known-repositories").iter("option")] == [
        "acme/app",
        "acme/lib",
    ]


def test_cases_sort_by_occurrences_and_by_ci_time_lost(seeded: World) -> None:
    by_occurrences = keys(seeded, listed(seeded, "?sort=occurrences"))
    assert by_occurrences[:2] == ["flaky", "deterministic"]
    with seeded.database.session() as session:
        counts = {i: n for i, n in session.execute(select(Case.id, Case.occurrences))}
    listed_counts = [counts[seeded.cases[k]] for k in by_occurrences]
    assert listed_counts == sorted(listed_counts, reverse=True)
    # CI time lost by each case's test: 12 runs x 6 s, then 7 uploads x 10 s (all time), then 2 x 4 s.
    by_lost = keys(seeded, listed(seeded, "?sort=ci_lost"))
    assert by_lost[:3] == ["flaky", "deterministic", "suspected"]
    page = listed(seeded, "?sort=ci_lost")
    assert [row[6] for row in page.table("cases-table")[1:4]] == [
        duration(72.0),
        duration(70.0),
        duration(8.0),
    ]


def test_pages_go_forward_and_back_and_past_the_last_one_say_so(
    seeded: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cases_page, "PAGE_SIZE", 5)
    everything = newest_first(seeded)
    first = listed(seeded)
    assert ids(first) == everything[:5]
    assert first.text("case-range") == "Cases 1 to 5 of 13, by last seen."
    assert first.links("case-results")[-1] == ("/dashboard/cases?page=2", "Next page")
    third = listed(seeded, "?page=3")
    assert ids(third) == everything[10:]
    assert ("/dashboard/cases?page=2", "Previous page") in third.links("case-results")
    assert "Next page" not in third.text("case-results")
    filtered = listed(seeded, "?verdict=none&sort=occurrences&page=2")
    assert len(ids(filtered)) == 1
    assert ("/dashboard/cases?verdict=none&sort=occurrences", "Previous page") in filtered.links(
        "case-results"
    )
    past = listed(seeded, "?page=9")
    assert not past.has("cases-table")
    assert past.text("no-cases") == "There are no cases on page 9: the list has 3 pages."


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("?verdict=flakey", "verdict 'flakey' is not one of: deterministic, flaky, not_reproduced"),
        ("?status=done", "status 'done' is not one of: open, suspected_flaky, queued, triaging, decided"),
        ("?sort=random", "sort 'random' is not one of: last_seen, occurrences, ci_lost"),
        ("?page=0", "page '0' is not a page of this list: a whole number from 1 to 200"),
        ("?page=-3", "page '-3' is not a page"),
        ("?page=201", "page '201' is not a page"),
        ("?page=99999999999999999999999", "is not a page"),
        ("?page=2.5", "page '2.5' is not a page"),
        ("?page=%D9%A3", "is not a page"),  # an Arabic-Indic digit is a digit to Python, not a page
        ("?verdict=%00", "verdict '\ufffd' is not one of"),
        ("?test=" + "x" * 501, "test is 501 characters long: at most 500 are read"),
    ],
)
def test_a_value_that_is_not_allowed_answers_422_naming_what_is(
    seeded: World, query: str, problem: str
) -> None:
    page = listed(seeded, query, status=422)
    assert problem in page.text("filter-problems")
    assert not page.has("cases-table")
    assert page.has("case-filters")  # the form is there to put it right


@pytest.mark.parametrize(
    "query",
    [
        "?test=%00",
        "?test=a%00b&repository=%00",
        "?branch=%ED%A0%80",  # a lone surrogate's UTF-8: no such text
        "?fingerprint=%FF%FE",
        "?repository=%F0%9F%92%A5",
        "?test=%27%20OR%201%3D1%20--",
        "?branch=%27);DROP%20TABLE%20cases;--",
    ],
)
def test_hostile_text_filters_find_nothing_and_break_nothing(seeded: World, query: str) -> None:
    page = listed(seeded, query)
    assert ids(page) == []
    assert ids(listed(seeded)) == newest_first(seeded)  # the cases are all still there


def test_html_in_a_filter_or_a_test_id_is_shown_as_text(seeded: World) -> None:
    response = seeded.client.get("/dashboard/cases", params={"test": "<script>alert(1)</script>"})
    assert response.status_code == 200
    assert "<script>alert(1)</script>" not in response.text
    assert 'value="&lt;script&gt;alert(1)&lt;/script&gt;"' in response.text
    page = listed(seeded)
    assert "<script>alert" not in page.html
    assert HOSTILE_TEST in page.text("cases-table")  # shown, as text


def test_htmx_gets_the_results_alone_and_a_history_restore_the_whole_page(seeded: World) -> None:
    partial = listed(seeded, "?verdict=flaky", **{"HX-Request": "true"})
    assert "<html" not in partial.html and not partial.has("case-filters")
    assert set(keys(seeded, partial)) == {"flaky", "flaky_lib"}
    assert partial.by_id("case-results").tag == "section"
    restored = listed(
        seeded, "?verdict=flaky", **{"HX-Request": "true", "HX-History-Restore-Request": "true"}
    )
    assert "<html" in restored.html and restored.has("case-filters")
    refused = listed(seeded, "?verdict=nope", status=422, **{"HX-Request": "true"})
    assert "is not one of" in refused.text("filter-problems")


def test_an_empty_service_lists_no_cases(dashboard: Dashboard) -> None:
    page = listed(dashboard)
    assert page.text("no-cases") == "No cases yet."
    assert page.text("case-results-heading") == "0 cases"


# -- the migration ---------------------------------------------------------------------------------
def _upgrade(database: Database, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with database.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'old.db'}")
        yield database
        database.dispose()
        return
    with new_postgres_database("ft_dashboard") as url:
        database = Database(url)
        try:
            yield database
        finally:
            database.dispose()


def test_the_migration_copies_each_recorded_occurrences_run_and_branch(fresh_database: Database) -> None:
    _upgrade(fresh_database, "0005")
    now = datetime(2026, 12, 1, tzinfo=UTC)
    provenances = [
        '{"run_url": "https://github.com/acme/app/actions/runs/7", "job": "test"}',
        '{"head_branch": "main", "run_url": "https://github.com/acme/app/actions/runs/8"}',
        '{"run_url": "' + "https://ci/" + "x" * 1200 + '"}',  # too long to keep
        '{"note": "a NUL \\u0000 in it", "branch": "dev"}',  # PostgreSQL cannot read its fields
        "{}",
    ]
    with fresh_database.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO cases (fingerprint, kind, title, status, first_seen, last_seen, occurrences,"
                " generation) VALUES ('f', 'bundle', 't', 'queued', :now, :now, 5, 0)"
            ),
            {"now": now},
        )
        for i, provenance in enumerate(provenances):
            conn.execute(
                text(
                    "INSERT INTO occurrences (case_id, source, delivery_id, provenance, received_at)"
                    " VALUES (1, 'events', :d, :p, :now)"
                ),
                {"d": f"d{i}", "p": provenance, "now": now},
            )
    fresh_database.upgrade()
    with fresh_database.session() as session:
        rows = session.execute(select(Occurrence.run_url, Occurrence.branch).order_by(Occurrence.id)).all()
    assert [tuple(r) for r in rows] == [
        ("https://github.com/acme/app/actions/runs/7", None),
        ("https://github.com/acme/app/actions/runs/8", "main"),
        (None, None),
        (None, "dev"),
        (None, None),
    ]
    with fresh_database.engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert differences == []
