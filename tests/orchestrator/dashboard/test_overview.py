"""The overview (``GET /dashboard``): failures per day by verdict (chart and table), the top flaky
tests with their links, the CI time lost, the triage's CPU and GPU time, the cases waiting; on
SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter

import pytest

from flaketriage.orchestrator.dashboard.views import duration
from tests.orchestrator.dashboard.conftest import SPECS, Dashboard, World
from tests.orchestrator.dashboard.reading import SVG, Page


def overview(world: World | Dashboard) -> Page:
    response = world.client.get("/dashboard")
    assert response.status_code == 200, response.text
    assert "script-src 'self'" in response.headers["content-security-policy"]
    return Page(response.text)


def test_an_empty_service_says_there_is_nothing_yet(dashboard: Dashboard) -> None:
    page = overview(dashboard)
    assert page.text("card-waiting").startswith("0 cases waiting")
    assert "No failures in the last 30 days" in page.text("failures-legend")
    assert "No test has been found flaky yet" in page.html
    rows = page.table("failures-table")
    assert rows[0] == ["Day", "Total"] and len(rows) == 31
    assert all(row[-1] == "0" for row in rows[1:])
    chart = page.svg("failures-chart")
    assert chart.findall(f".//{SVG}rect") == []  # no bars, and still well-formed


def test_the_cases_waiting_are_counted_by_status_and_link_to_their_list(seeded: World) -> None:
    page = overview(seeded)
    assert page.text("card-waiting").startswith("4 cases waiting")
    assert page.links("card-waiting") == [
        ("/dashboard/cases?status=queued", "2 queued"),
        ("/dashboard/cases?status=triaging", "1 triaging"),
        ("/dashboard/cases?status=suspected_flaky", "1 suspected flaky"),
    ]


def expected_failures(world: World) -> dict[int, Counter[str]]:
    """Occurrences of the last 30 days by days ago, counted by their case's verdict label."""
    by_day: dict[int, Counter[str]] = {}
    for spec in SPECS:
        verdict = world.verdict(spec.key)
        for days in spec.days:
            if days < 30:
                by_day.setdefault(days, Counter())[(verdict or "undecided").replace("_", " ")] += 1
    return by_day


def test_failures_per_day_are_counted_by_verdict_in_a_table_and_a_stacked_chart(seeded: World) -> None:
    page = overview(seeded)
    expected = expected_failures(seeded)
    rows = page.table("failures-table")
    header, days = rows[0], rows[1:]
    assert len(days) == 30
    assert header[0] == "Day" and header[-1] == "Total"
    # The verdicts with failures, in the order they are stacked (and nothing for the fixed case, 40 days ago).
    assert header[1:-1] == [
        "deterministic", "flaky", "order dependent", "environment specific", "not reproduced", "undecided"
    ]  # fmt: skip
    assert days[-1][0] == seeded.now.date().isoformat() and days[0][0] == seeded.at(29).date().isoformat()
    for i, row in enumerate(reversed(days)):  # i days ago
        counts = expected.get(i, Counter())
        assert row[1:-1] == [str(counts[verdict]) for verdict in header[1:-1]], (i, row)
        assert row[-1] == str(sum(counts.values()))
    assert days[-1][-1] == "6"  # today: deterministic 1, flaky 2 + 1, queued 1, hostile 1
    assert days[-21][-1] == "1"  # 20 days ago: the not reproduced case's one occurrence
    legend = page.text("failures-legend")
    assert "deterministic: 5" in legend and "flaky: 13" in legend and "undecided: 7" in legend


def test_the_chart_draws_a_bar_per_day_and_verdict_with_heights_in_proportion(seeded: World) -> None:
    page = overview(seeded)
    expected = expected_failures(seeded)
    chart = page.svg("failures-chart")
    assert chart.get("role") == "img"
    assert chart.findtext(f"{SVG}title") == "Failures per day by verdict, last 30 days"
    assert "The table below gives each day's numbers" in (chart.findtext(f"{SVG}desc") or "")
    bars = chart.findall(f".//{SVG}rect")
    assert len(bars) == sum(len(c) for c in expected.values())  # one per day and verdict with failures
    tips = {bar.findtext(f"{SVG}title"): float(bar.get("height", "0")) for bar in bars}
    today = seeded.now.strftime("%m-%d")
    unit = tips[f"{today}: deterministic 1"]
    assert abs(tips[f"{today}: flaky 3"] - 3 * unit) < 0.02
    tallest = max(sum(c.values()) for c in expected.values())
    assert tallest * unit == pytest.approx(220 - 8 - 22, abs=0.05)  # the tallest stack fills the plot
    classes = {g.get("class") for g in chart.findall(f"{SVG}g")}
    assert {"series verdict-flaky", "series verdict-deterministic", "series verdict-none"} <= classes


def test_the_top_flaky_tests_link_to_their_ci_history_or_else_to_their_case(seeded: World) -> None:
    page = overview(seeded)
    rows = page.table("flaky-tests")
    assert [row[0].split(" (")[0] for row in rows[1:]] == [
        "tests/test_net.py::test_retry",  # 12 occurrences, flaky
        "tests/test_time.py::test_clock",  # 2, suspected by CI history
        "tests/test_sched.py::test_timer",  # 1, flaky
    ]
    assert rows[1][2] == "flaky" and rows[1][3] == "12"
    assert rows[2][2] == "suspected flaky"
    links = page.links("flaky-tests")
    retry, clock = (
        seeded.tests["tests/test_net.py::test_retry"],
        seeded.tests["tests/test_time.py::test_clock"],
    )
    assert (f"/dashboard/tests/{retry}", "tests/test_net.py::test_retry") in links
    assert (f"/dashboard/tests/{clock}", "tests/test_time.py::test_clock") in links
    # No CI history of this one: its link is its case.
    assert (f"/dashboard/cases/{seeded.cases['flaky_lib']}", "tests/test_sched.py::test_timer") in links
    assert rows[1][4] == duration(12 * 6.0)  # its 12 runs each lost a failed attempt and its rerun
    assert rows[3][4] == "–"


def test_ci_time_lost_and_triage_time_are_those_of_the_last_30_days(seeded: World) -> None:
    page = overview(seeded)
    # 5 runs of the deterministic test (10 s each), two retries of the suspected one (2 + 2 s),
    # 12 retries of the flaky one (3 + 3 s), an upload 25 days ago (10 s, its results rolled up
    # since); not the storm, nor the upload 45 days ago.
    assert seeded.ci_lost_30_days_s == 50 + 8 + 72 + 10
    assert page.text("card-ci-lost").startswith(duration(140.0) + " CI time lost")
    assert "18 results uploads" in page.text("card-ci-lost")
    # 8 replays of 12.5 CPU s and 30 GPU s, 5 of 4 CPU s; not those of 40 days ago.
    assert page.text("card-triage-cpu") == f"{duration(120.0)} triage CPU time, last 30 days (13 replays)"
    assert page.text("card-triage-gpu").startswith(duration(240.0))
