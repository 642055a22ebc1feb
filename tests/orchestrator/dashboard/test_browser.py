"""The dashboard in a real browser (headless Chromium, Playwright; `browser`): every page renders
without a script or policy error, the filters work, the charts are drawn, the keyboard reaches
everything, and a screenshot of every page is saved."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flaketriage.records import Database
from tests.orchestrator.dashboard.browser import chromium, screenshots_dir, served
from tests.orchestrator.dashboard.conftest import World, _dashboard, seed
from tests.orchestrator.dashboard.test_quarantine_page import rerun


@dataclass
class Site:
    base: str
    world: World
    browser: Any
    errors: list[str] = field(default_factory=list)

    def page(self) -> Any:
        """A fresh page whose console errors, failed requests and uncaught exceptions are collected."""
        page = self.browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page: {e}"))
        page.on(
            "response",
            lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )
        return page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("dashboard")
    database = Database(f"sqlite:///{root / 'service.db'}")
    database.upgrade()
    dashboard = _dashboard(database, root)
    world = seed(dashboard)
    try:
        with served(dashboard.client.app) as base, chromium() as browser:
            yield Site(base, world, browser)
    finally:
        dashboard.client.close()
        database.dispose()


@pytest.fixture
def clean(site: Site) -> Iterator[Site]:
    """The site, failing the test for any console error, page error or 4xx/5xx it caused."""
    site.errors.clear()
    yield site
    assert site.errors == []


def shoot(page: Any, name: str) -> Path:
    path = screenshots_dir() / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


def test_the_overview_draws_its_chart_and_names_every_verdict_in_text(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/")  # / leads to the dashboard
    assert page.url == f"{clean.base}/dashboard"
    assert page.locator("h1").inner_text() == "Overview"
    chart = page.locator("#failures-heading ~ * svg").first
    box = chart.bounding_box()
    assert box is not None and box["width"] > 200 and box["height"] > 80
    bars = chart.locator("rect")
    drawn = [bars.nth(i).bounding_box() for i in range(bars.count())]
    assert sum(1 for b in drawn if b and b["height"] > 0) >= 5
    legend = page.locator("#failures-legend").inner_text()
    for verdict in ("deterministic", "flaky"):
        assert verdict in legend.lower()
    shoot(page, "overview")


def test_the_cases_filter_narrows_the_list_in_place(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/dashboard/cases")
    everything = page.locator("#cases-table tbody tr").count()
    assert everything == len(clean.world.cases)
    page.select_option("#filter-verdict", "flaky")
    with page.expect_response(lambda r: "/dashboard/cases?" in r.url):
        page.click("#case-filters button[type=submit]")
    page.wait_for_function(f"document.querySelectorAll('#cases-table tbody tr').length < {everything}")
    verdicts = page.locator("#cases-table tbody tr td:nth-child(4)").all_inner_texts()
    assert verdicts and all(v.strip().lower() == "flaky" for v in verdicts)
    assert "verdict=flaky" in page.url  # the filtered list has an address of its own
    page.reload()
    assert page.locator("#cases-table tbody tr").count() == len(verdicts)
    shoot(page, "cases")


def test_the_case_page_draws_the_failure_rate_interval(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/dashboard/cases/{clean.world.cases['flaky']}")
    assert "flaky" in page.locator("#case-verdict").inner_text().lower()
    figure = page.locator("#rate-figure svg")
    box = figure.bounding_box()
    assert box is not None and box["width"] > 100
    caption = page.locator("#rate-caption").inner_text()
    assert caption.startswith("Failure rate") and "interval" in caption
    shoot(page, "case")


def test_html_in_a_test_name_is_shown_never_run(clean: Site) -> None:
    page = clean.page()
    alerts: list[str] = []
    page.on("dialog", lambda d: (alerts.append(d.message), d.dismiss()))
    page.goto(f"{clean.base}/dashboard/cases/{clean.world.cases['hostile']}")
    assert "<script>" in page.locator("main").inner_text()
    assert alerts == []


def test_the_keyboard_reaches_the_content_and_the_navigation(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/dashboard")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent").strip() == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.goto(f"{clean.base}/dashboard")
    for _ in range(3):  # the skip link, the brand, then the first page of the navigation
        page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent").strip() == "Cases"
    page.keyboard.press("Enter")
    page.wait_for_url(f"{clean.base}/dashboard/cases")
    focused = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert focused in ("auto", "solid", "none")  # reached; its outline shows on :focus-visible


def test_the_tests_list_draws_each_strip_and_filters_in_place(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/dashboard/tests")
    everything = page.locator("#tests-table tbody tr").count()
    assert everything == 8
    strip = page.locator("#tests-table svg.chart-strip").first
    box = strip.bounding_box()
    assert box is not None and box["width"] > 10
    page.select_option("#filter-quarantined", "yes")
    with page.expect_response(lambda r: "/dashboard/tests?" in r.url):
        page.click("#test-filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#tests-table tbody tr').length === 1")
    assert "quarantined=yes" in page.url
    assert "quarantined since" in page.locator("#tests-table tbody tr").inner_text()
    shoot(page, "tests")


def test_a_test_page_draws_its_results(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/dashboard/tests/{clean.world.tests['tests/test_net.py::test_retry']}")
    cells = page.locator("#strip-figure svg rect")
    assert cells.count() == 12
    assert page.locator("#strip-summary").inner_text().startswith("12 runs: 12 passed on retry")
    shoot(page, "test")


def test_the_commit_grid_names_every_cell(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/dashboard/grid")
    cells = page.locator("#grid-table tbody td")
    assert cells.count() == 14
    texts = cells.all_inner_texts()
    assert all(any(w in t for w in ("passed", "failed", "not run")) for t in texts)
    shoot(page, "grid")


def test_the_quarantine_page_draws_the_evidence(clean: Site) -> None:
    still = {"verdict": "flaky", "decided": True, "replays": 59, "failures": 4, "state": "still flaky"}
    rerun(clean.world, "flaky", 1, "done", 0.01, result=still)
    rerun(clean.world, "flaky", 2, "done", 0.02, result=still | {"failures": 2})
    page = clean.page()
    page.goto(f"{clean.base}/dashboard/quarantine")
    chart = page.locator(".q-evidence svg").first
    box = chart.bounding_box()
    assert box is not None and box["width"] > 100
    assert "lifted when a rerun passes" in page.locator(".q-lift").first.inner_text()
    reruns = page.locator(".q-reruns li")
    assert reruns.count() == 2
    assert reruns.first.inner_text().endswith("2 of 59 replays reproduced the failure: still flaky")
    shoot(page, "quarantine")


def test_the_runners_page(clean: Site) -> None:
    page = clean.page()
    page.goto(f"{clean.base}/dashboard/runners")
    assert page.locator("#runners-table tbody tr").count() == 2
    shoot(page, "runners")
