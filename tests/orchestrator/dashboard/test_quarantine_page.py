"""The quarantine page: every entry with what it forgives, since when, its evidence (the rate and
its interval, drawn), what happened since (its reruns, its test's CI results), what lifts it in
words, the forms that end it and the form to quarantine a test by hand."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flaketriage.orchestrator.dashboard import quarantine as quarantine_page
from flaketriage.quarantine import hand_entry
from flaketriage.records import Database, QuarantineRow, Work
from flaketriage.records.models import utc_now
from flaketriage.results import Attempt, TestResult
from tests.orchestrator.dashboard.conftest import Dashboard, World, seed
from tests.orchestrator.dashboard.reading import SVG, Page
from tests.orchestrator.dashboard.signing_in import make_dashboard, page_token, signed_in
from tests.orchestrator.dashboard.test_tests_page import RETRY, upload


@pytest.fixture
def world(database: Database, tmp_path: Path) -> Iterator[World]:
    made = make_dashboard(database, tmp_path)
    yield seed(made)
    made.client.close()


@pytest.fixture
def alice(world: World) -> TestClient:
    return signed_in(world.dashboard.service, "alice")


def entry_of(page: Page, fingerprint: str) -> dict[str, str]:
    """An entry's facts, by their names."""
    found = page.by_id(f"entry-{fingerprint}")
    names = [n.text for n in found.iter("dt")]
    return dict(zip(names, [n.text for n in found.iter("dd")], strict=True))


def hand(world: World, test_id: str, *, expires_in: timedelta, owner: str = "db-team") -> str:
    now = utc_now()
    entry = hand_entry(
        None, test_id=test_id, variant={"python": "3.12"}, owner=owner, expires_at=now + expires_in,
        by="alice (token)", now=now - timedelta(days=2),
    )  # fmt: skip
    with world.database.session() as session:
        session.add(QuarantineRow(fingerprint=entry.fingerprint, entry=entry.model_dump(mode="json")))
    return entry.fingerprint


def test_an_entry_shows_its_evidence_and_what_lifts_it(world: World) -> None:
    page = Page(world.client.get("/dashboard/quarantine").text)
    assert page.text("entries-heading") == "1 entry"
    flaky = world.specs["flaky"]
    facts = entry_of(page, flaky.fingerprint)
    assert page.text(f"entry-{flaky.fingerprint}-heading") == f"{RETRY} quarantined"
    assert facts["Reason"] == "flaky: failed 3 of 8 replays"
    assert facts["Runs it covers"] == "every run"
    assert facts["Failures it forgives"] == "any failure of its tests"
    assert facts["Evidence"].startswith(
        "flaky: 3 of 8 replays reproduced the failure; failure rate 37.5%, interval 8.5% to 75.5%"
    )
    assert facts["Lifted"] == (
        "Replayed in isolation every 6.0 h; lifted when a rerun passes 59 replays in a row without "
        "reproducing the failure: the sequential test then says its failure rate is below 5% (wrong "
        "at most 5% of the time). Or lifted by hand."
    )
    assert facts["Since then"].startswith("No isolation rerun yet (one every 6.0 h).")
    assert facts["Links"] == f"case {world.cases['flaky']}"
    chart = page.svg("rate-1")
    assert chart.find(f"{SVG}desc").text.startswith("Estimated failure rate 37.5%")  # type: ignore[union-attr]


def test_the_ci_results_since_the_quarantine_began(world: World) -> None:
    upload(world, 11, [TestResult(test_id=RETRY, outcome="failed", duration_s=3.0)])
    retried = TestResult(
        test_id=RETRY, outcome="passed", duration_s=3.0, attempts=(Attempt(outcome="failed", duration_s=3.0),)
    )
    upload(world, 12, [retried])
    page = Page(world.client.get("/dashboard/quarantine").text)
    since = entry_of(page, world.specs["flaky"].fingerprint)["Since then"]
    # The 12 seeded results came before it began; these two after.
    assert "In CI, os=linux,python=3.12: 2 runs: 1 passed on retry, 1 failed." in since
    assert (f"/dashboard/tests/{world.tests[RETRY]}", "os=linux,python=3.12") in page.links()


def rerun(world: World, case: str, n: int, status: str, hours_after: float, **fields: object) -> None:
    """A ``rerun`` step of a case's quarantine, as beat schedules it and a worker ends it."""
    with world.database.session() as session:
        began = session.get_one(QuarantineRow, world.specs["flaky"].fingerprint).entry["quarantined_at"]
        at = datetime.fromisoformat(began) + timedelta(hours=hours_after)
        session.add(
            Work(
                key=f"rerun:{world.specs[case].fingerprint}:{n}",
                case_id=world.cases[case],
                step="rerun",
                queue="cpu",
                status=status,
                options=fields.pop("options", {"fingerprint": world.specs[case].fingerprint}),
                created_at=at,
                finished_at=at + timedelta(minutes=5) if status in ("done", "failed") else None,
                **fields,
            )
        )


def test_the_isolation_reruns_since_the_quarantine_began(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    still = {"verdict": "flaky", "decided": True, "replays": 40, "failures": 3, "state": "still flaky"}
    rerun(world, "flaky", 1, "done", -30, result=still)  # before it began: another quarantine's
    rerun(world, "flaky", 2, "done", 6, result=still)
    rerun(world, "flaky", 3, "failed", 12, error="sandbox: docker is not running")
    rerun(world, "flaky", 4, "queued", 18)
    rerun(world, "deterministic", 5, "done", 6, result=still)  # another case's
    page = Page(world.client.get("/dashboard/quarantine").text)
    lists = [n for n in page.by_id(f"entry-{world.specs['flaky'].fingerprint}").iter("ul")]
    assert [n.attrs.get("class") for n in lists] == ["q-reruns"]
    reruns = [li.text for li in lists[0].iter("li")]
    assert [r.split(": ", 1)[1] for r in reruns] == [
        "queued, not finished yet",
        "failed: sandbox: docker is not running",
        "3 of 40 replays reproduced the failure: still flaky",
    ]
    assert all(r.endswith(" UTC") for r in (r.split(": ", 1)[0] for r in reruns))
    # Only the latest few are shown, and the page says so.
    monkeypatch.setattr(quarantine_page, "MAX_RERUNS", 2)
    page = Page(world.client.get("/dashboard/quarantine").text)
    facts = entry_of(page, world.specs["flaky"].fingerprint)
    assert facts["Since then"].startswith("Isolation reruns (the latest 2):")
    assert len(list(page.by_id(f"entry-{world.specs['flaky'].fingerprint}").iter("li"))) == 2


def test_a_rerun_whose_record_is_garbled_is_shown_as_far_as_it_reads(world: World) -> None:
    # Written by another release, or cut short: wrong types where a result's fields should be.
    rerun(world, "flaky", 1, "done", 1, result={"replays": "many", "failures": None, "state": 7})
    rerun(world, "flaky", 2, "done", 2, result=["not", "a", "mapping"], options=[])
    rerun(world, "flaky", 3, "failed", 3)  # no error recorded
    answer = world.client.get("/dashboard/quarantine")
    assert answer.status_code == 200
    page = Page(answer.text)
    lists = [n for n in page.by_id(f"entry-{world.specs['flaky'].fingerprint}").iter("ul")]
    assert [li.text.split(": ", 1)[1] for li in lists[0].iter("li")] == [
        "failed: no error recorded",
        "replays not recorded",
        "replays not recorded",
    ]


def test_a_hand_entry_and_an_expired_one(world: World) -> None:
    live = hand(world, "tests/test_a.py::test_live", expires_in=timedelta(days=3))
    gone = hand(world, "tests/test_b.py::test_gone", expires_in=-timedelta(hours=1), owner="<b>ml</b>")
    answer = world.client.get("/dashboard/quarantine")
    page = Page(answer.text)
    assert page.text("entries-heading") == "3 entries"
    facts = entry_of(page, live)
    assert facts["Owner"] == "db-team" and facts["Runs it covers"] == "python=3.12"
    assert facts["Evidence"] == "none: quarantined by hand"
    assert facts["Lifted"].startswith("Until ") and facts["Lifted"].endswith(
        "UTC, or lifted by hand (no rerun lifts a quarantine made by hand)."
    )
    expired = entry_of(page, gone)
    assert page.text(f"entry-{gone}-heading") == "tests/test_b.py::test_gone expired"
    assert (
        expired["Lifted"].startswith("Expired at ") and "no longer forgives any failure" in expired["Lifted"]
    )
    assert expired["Owner"] == "<b>ml</b>" and "<b>ml</b>" not in answer.text


def test_an_entry_this_release_cannot_read_is_still_listed(world: World) -> None:
    with world.database.session() as session:
        session.add(QuarantineRow(fingerprint="ab" * 16, entry={"fingerprint": "ab" * 16, "future": True}))
    answer = world.client.get("/dashboard/quarantine")
    assert answer.status_code == 200
    assert Page(answer.text).text(f"entry-{'ab' * 16}-heading") == f"Failure {'ab' * 6} unreadable"


def test_the_forms_are_there_for_a_person_signed_in(world: World, alice: TestClient) -> None:
    flaky = world.specs["flaky"].fingerprint
    anonymous = Page(world.client.get("/dashboard/quarantine").text)
    assert not anonymous.has("hand-form") and not anonymous.by_id(f"entry-{flaky}").iter("form")
    page = Page(alice.get("/dashboard/quarantine").text)
    assert page.has("hand-form")
    forms = [f for f in page.by_id(f"entry-{flaky}").iter("form")]
    assert [f.attrs["action"] for f in forms] == [
        "/dashboard/actions/lift",
        "/dashboard/actions/unquarantine",
    ]
    hidden = {i.attrs["name"]: i.attrs["value"] for i in forms[0].iter("input")}
    assert hidden["fingerprint"] == flaky and hidden["next"] == "/dashboard/quarantine"


def test_lifting_from_the_page_says_so_on_the_page(world: World, alice: TestClient) -> None:
    flaky = world.specs["flaky"].fingerprint
    form = {"csrf_token": page_token(alice, "/dashboard/quarantine"), "fingerprint": flaky,
            "next": "/dashboard/quarantine"}  # fmt: skip
    answer = alice.post("/dashboard/actions/lift", data=form)
    assert answer.status_code == 303 and answer.headers["location"] == "/dashboard/quarantine"
    page = Page(alice.get("/dashboard/quarantine").text)
    assert [p.text for p in page.root.iter("p") if p.attrs.get("class") == "flash"] == [
        f"Lifted the quarantine of {RETRY}; case {world.cases['flaky']} marked fixed."
    ]
    assert page.text("no-entries") == "Nothing is quarantined."


def test_nothing_quarantined(dashboard: Dashboard) -> None:
    page = Page(dashboard.client.get("/dashboard/quarantine").text)
    assert page.text("entries-heading") == "0 entries"
    assert page.text("no-entries") == "Nothing is quarantined."
    assert page.has("hand-quarantine")


@pytest.mark.parametrize(
    "query", ["?page=0", "?page=-1", "?page=999999999999999", "?page=%00", "?page=%ED%A0%80"]
)
def test_a_page_that_is_not_one_is_422(world: World, query: str) -> None:
    answer = world.client.get(f"/dashboard/quarantine{query}")
    assert answer.status_code == 422
    assert "is not a page" in Page(answer.text).text("filter-problems")
