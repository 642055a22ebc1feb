"""One case's page (``GET /dashboard/cases/{id}``): its facts, its verdict with the failure rate's
interval drawn, the minimal reproduction and the commands that reproduce it, its bundle, report and
CI runs, a bounded timeline of occurrences and replays; a 404 page for any id that names no case,
and evidence or links a sender could have made hostile shown as text. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from flaketriage.orchestrator.dashboard import case as case_module
from flaketriage.records import Case
from tests.orchestrator.dashboard.conftest import (
    CPU_RUNNER,
    GPU_RUNNER,
    HOSTILE_TEST,
    STORE,
    Dashboard,
    World,
)
from tests.orchestrator.dashboard.reading import SVG, Page


def shown(world: World, key: str) -> Page:
    response = world.client.get(f"/dashboard/cases/{world.cases[key]}")
    assert response.status_code == 200, response.text
    assert response.headers["x-frame-options"] == "DENY"
    return Page(response.text)


def update(world: World, key: str, **values: object) -> None:
    with world.database.session() as session:
        case = session.get_one(Case, world.cases[key])
        for name, value in values.items():
            setattr(case, name, value)


def test_a_deterministic_case_shows_its_facts_verdict_and_interval(seeded: World) -> None:
    page = shown(seeded, "deterministic")
    spec = seeded.specs["deterministic"]
    assert (
        page.root.iter("h1")[0].text
        == f"Case {seeded.cases['deterministic']}: {spec.test_id}: AssertionError"
    )
    assert page.text("case-verdict") == "deterministic"
    assert page.text("case-status") == "reported"
    assert page.text("case-fingerprint") == spec.fingerprint
    assert page.text("case-occurrences") == "5"
    # Its test's CI time lost (7 failing runs of 10 s, rolled up or not) and its replays.
    assert page.text("case-ci-lost") == "70 s (7 CI runs it made fail)"
    assert page.text("case-triage-time") == "5 replays: 20 s CPU, 0.0 s GPU"
    assert page.text("case-quarantine") == "not quarantined"
    assert ("/dashboard/tests/" + str(seeded.tests[str(spec.test_id)]), "its CI history") in page.links(
        "case-facts"
    )
    assert (
        page.text("verdict-summary") == "deterministic after 5 replays: 5 reproduced the failure, 0 passed."
    )
    assert page.text("rate-caption") == "Failure rate 100.0%, interval 47.8% to 100.0%."
    chart = page.svg("rate-chart")
    interval = chart.find(f"{SVG}rect[@class='interval']")
    assert interval is not None
    # 0..1 drawn from x=16 over 328 units: the interval starts at 47.8% and ends at 100%.
    assert float(interval.get("x", "0")) == pytest.approx(16 + 0.478 * 328, abs=0.01)
    assert float(interval.get("x", "0")) + float(interval.get("width", "0")) == pytest.approx(344, abs=0.01)
    estimate = chart.find(f"{SVG}line[@class='estimate']")
    assert estimate is not None and float(estimate.get("x1", "0")) == pytest.approx(344)


def test_the_minimal_reproduction_its_data_and_the_commands_are_shown(seeded: World) -> None:
    page = shown(seeded, "deterministic")
    spec = seeded.specs["deterministic"]
    minimal = page.text("minimal-bundle")
    assert len(minimal) == 64 and minimal != spec.bundle
    assert page.table("minimal-data") == [
        ["Input", "Kept", "Of"],
        ["data/batch.csv", "3", "1000"],
        ["data/labels.jsonl", "1", "250"],
    ]
    assert page.table("minimal-args") == [["Option", "Before", "After"], ["--epochs", "10", "1"]]
    commands = page.text("reproduce-commands")
    assert f"export FLAKETRIAGE_STORE={STORE}" in commands
    assert f"flaketriage bundle pull {minimal} --from {STORE}" in commands
    assert f"flaketriage bundle export {minimal} repro && (cd repro && bash run.sh)" in commands
    assert f"flaketriage triage {spec.bundle}" in commands  # the captured bundle: triage starts there
    assert f"flaketriage cases show {seeded.cases['deterministic']}" in commands
    assert page.text("case-bundle") == spec.bundle and page.text("case-store") == STORE


def test_its_report_ci_runs_and_the_other_cases_of_those_runs_are_linked(seeded: World) -> None:
    page = shown(seeded, "deterministic")
    assert page.links("case-report") == [
        ("https://github.com/acme/app/issues/7", "GitHub issue https://github.com/acme/app/issues/7")
    ]
    runs = page.links("case-runs")
    assert [href for href, _ in runs] == [
        f"https://github.com/acme/app/actions/runs/{n}" for n in range(1005, 1000, -1)
    ]
    # The runs' results uploads say which branch and commit each was.
    assert "https://github.com/acme/app/actions/runs/1005 on main at 00003ed" in page.text("case-runs")
    # The suspected test failed in runs 1004 and 1005 too.
    assert page.links("linked-cases") == [
        (f"/dashboard/cases/{seeded.cases['suspected']}", f"case {seeded.cases['suspected']}")
    ]


def test_the_timeline_merges_occurrences_and_replays_newest_first(seeded: World) -> None:
    page = shown(seeded, "flaky")
    rows = page.table("timeline")[1:]
    assert len(rows) == 12 + 8
    assert [row[0] for row in rows] == sorted((row[0] for row in rows), reverse=True)
    replays = [row for row in rows if "replay" in row[1]]
    assert [row[2] for row in replays] == [
        "reproduced" if letter == "R" else "passed" for letter in reversed("RPPRPPRP")
    ]
    assert all(
        row[1].endswith(f"on {GPU_RUNNER.id}") and row[3] == "12.5 CPU s, 30.0 GPU s" for row in replays
    )
    occurrence = next(row for row in rows if row[1].startswith("occurrence"))
    assert occurrence[1] == "occurrence from events, job test (CI run)"
    assert page.text("timeline-bounds") == "Its latest 12 occurrences and 8 replays, newest first."
    assert page.text("case-quarantine").startswith("quarantined (entry updated")
    assert "reproduced" in page.text("verdict-summary") and "3 reproduced the failure, 5 passed" in page.text(
        "verdict-summary"
    )
    # Its report is the quarantine, not a page: named, not linked.
    assert page.links("case-report") == []
    assert f"quarantine:{seeded.specs['flaky'].fingerprint}" in page.text("case-report")
    assert CPU_RUNNER.id not in page.text("timeline")


def test_the_timeline_is_bounded_and_counts_the_rest(seeded: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(case_module, "LATEST_OCCURRENCES", 3)
    monkeypatch.setattr(case_module, "LATEST_REPLAYS", 2)
    page = shown(seeded, "flaky")
    assert len(page.table("timeline")) == 1 + 3 + 2
    assert page.text("timeline-bounds") == (
        "Its latest 3 occurrences and 2 replays, newest first; "
        "9 earlier occurrences and 6 earlier replays are not shown."
    )
    assert len(page.links("case-runs")) == 3


def test_an_undecided_case_without_a_bundle_says_so(seeded: World) -> None:
    page = shown(seeded, "workflow")
    assert page.text("case-verdict") == "undecided" and page.text("case-status") == "open"
    assert page.text("verdict-summary") == "No triage has decided this case yet."
    assert "No bundle was captured for this case: there is nothing to replay." in page.text("reproduction")
    assert not page.has("reproduce-commands")
    assert page.text("case-runs").startswith("https://github.com/acme/app/actions/runs/5001 on release/1.0")
    assert page.text("case-report") == "No report filed yet."


def test_a_queued_case_has_its_commands_before_any_verdict(seeded: World) -> None:
    page = shown(seeded, "queued")
    assert page.text("verdict-summary") == "No triage has decided this case yet."
    assert f"flaketriage triage {seeded.specs['queued'].bundle}" in page.text("reproduce-commands")
    assert "This failure was not minimized" in page.text("reproduction")


def test_the_cases_actions_have_a_place_of_their_own(dashboard: Dashboard) -> None:
    from flaketriage.orchestrator.dashboard.views import Views

    template = Views(dashboard.service).env.get_template("case.html")
    assert "actions" in template.blocks


@pytest.mark.parametrize(
    "ident",
    [
        "999999",
        "0",
        "-1",
        "2147483648",
        "99999999999999999999999999",
        "abc",
        "1.5",
        "%00",
        "%ED%A0%80",
        "%D9%A3",
    ],
)
def test_an_id_that_names_no_case_is_a_404_page(seeded: World, ident: str) -> None:
    response = seeded.client.get(f"/dashboard/cases/{ident}")
    assert response.status_code == 404
    page = Page(response.text)
    assert page.text("case-missing").startswith("There is no case")
    assert ("/dashboard/cases", "list of cases") in page.links("case-missing")


def test_html_in_a_test_id_and_a_hostile_report_link_are_text(seeded: World) -> None:
    update(seeded, "hostile", report_url="javascript:alert(1)", report_kind="github")
    response = seeded.client.get(f"/dashboard/cases/{seeded.cases['hostile']}")
    assert response.status_code == 200
    assert "<script>alert" not in response.text
    page = Page(response.text)
    assert HOSTILE_TEST in page.text("case-facts")
    assert page.links("case-report") == []  # never a javascript: link
    assert "javascript:alert(1)" in page.text("case-report")


def test_evidence_of_another_shape_shows_what_it_has(seeded: World) -> None:
    update(
        seeded,
        "not_reproduced",
        evidence={
            "verdict": "different_failure",
            "failure_rate": {"low": "x", "estimate": None},
            "minimal": 5,
            "findings": [1, {"kind": "different_failure", "summary": "KeyError: 'b'", "count": 2}],
            "polluters": "not a list",
            "cost": [],
        },
    )
    page = shown(seeded, "not_reproduced")
    assert "different failure" in page.text("verdict-summary")
    assert not page.has("rate-figure")
    assert page.text("findings") == "different failure: KeyError: 'b' (2×)"
    assert "This failure was not minimized" in page.text("reproduction")
    update(seeded, "not_reproduced", evidence=["not", "an", "object"])
    assert shown(seeded, "not_reproduced").text("verdict-summary") == "No triage has decided this case yet."
