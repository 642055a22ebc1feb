"""The dashboard's actions over the seeded world: re-triage a case (its triage recorded and sent),
quarantine a test by hand (served by ``GET /v1/quarantine`` and enforced by the pytest plugin until
it expires), lift a quarantine (the case fixed) and remove one (the case as it was). Each answers
with a 303 to a page that says what was done; each is refused, changing no row, without a session,
without the session's form token, with another session's, or from another site; hostile values
change nothing either. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx2 import Response
from sqlalchemy import select

from flaketriage.quarantine import QuarantineDocument, hand_fingerprint
from flaketriage.records import Case, Database, QuarantineRow, Work
from flaketriage.work.dispatch import MemorySender
from tests.orchestrator.dashboard.conftest import HOSTILE_TEST, World, seed
from tests.orchestrator.dashboard.reading import Page
from tests.orchestrator.dashboard.signing_in import (
    TOKEN,
    client,
    make_dashboard,
    page_token,
    rows,
    signed_in,
)

TEST = "test_suite.py::test_known_flaky"


@pytest.fixture
def world(database: Database, tmp_path: Path) -> Iterator[World]:
    made = make_dashboard(database, tmp_path)
    yield seed(made)
    made.client.close()


@pytest.fixture
def alice(world: World) -> TestClient:
    browser = signed_in(world.dashboard.service, "alice")
    sender(world).take()  # what seeding sent
    return browser


def sender(world: World) -> MemorySender:
    sent = world.dashboard.service.sender
    assert isinstance(sent, MemorySender)
    return sent


def act(browser: TestClient, action: str, **fields: str) -> Response:
    """Post an action's form with the browser's own form token (as its page gives it)."""
    form = {"csrf_token": page_token(browser, "/dashboard/login"), **fields}
    return browser.post(f"/dashboard/actions/{action}", data=form)


def shown(browser: TestClient, answer: Response) -> str:
    """The message the page an action redirected to shows."""
    assert answer.status_code == 303, answer.text
    after = browser.get(answer.headers["location"])
    assert after.status_code == 200, after.text
    page = Page(after.text)
    flashes = [p for p in page.root.iter("p") if p.attrs.get("class") == "flash"]
    assert len(flashes) == 1, "no message on the page"
    return flashes[0].text


def case(world: World, key: str) -> Case:
    with world.database.session() as session:
        return session.get_one(Case, world.cases[key])


def in_a_week() -> str:
    return (datetime.now(UTC) + timedelta(days=7)).date().isoformat()


def quarantine_doc(browser: TestClient) -> tuple[QuarantineDocument, str]:
    answer = browser.get("/v1/quarantine")
    assert answer.status_code == 200
    return QuarantineDocument.from_json(answer.content), answer.headers["etag"]


VALID = {
    "retriage": lambda w: {"case_id": str(w.cases["flaky"])},
    "quarantine": lambda w: {"test_id": TEST, "owner": "ml-infra", "expires": in_a_week()},
    "lift": lambda w: {"fingerprint": w.specs["flaky"].fingerprint},
    "unquarantine": lambda w: {"case_id": str(w.cases["flaky"])},
}
"""A form each action would take, signed in."""


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("action", sorted(VALID))
def test_an_action_without_a_session_is_refused_and_changes_nothing(world: World, action: str) -> None:
    before, sent = rows(world.database), len(sender(world).sent)
    stranger = client(world.dashboard.service)
    token = page_token(stranger)  # the sign-in page's: a browser's, not a session's
    answer = stranger.post(f"/dashboard/actions/{action}", data={"csrf_token": token, **VALID[action](world)})
    assert answer.status_code == 403
    page = Page(answer.text)
    assert "sign in to do this" in page.text("refusal").lower()
    assert page.by_id("refused-login").attrs["href"].startswith("/dashboard/login?next=/dashboard/")
    bearer_wrong = client(world.dashboard.service, headers={"Authorization": "Bearer wrong"})
    assert bearer_wrong.post(f"/dashboard/actions/{action}", data=VALID[action](world)).status_code == 403
    assert rows(world.database) == before
    assert len(sender(world).sent) == sent  # nothing was sent


@pytest.mark.parametrize("action", sorted(VALID))
def test_an_action_without_its_form_token_is_refused_and_changes_nothing(
    world: World, alice: TestClient, action: str
) -> None:
    bob = signed_in(world.dashboard.service, "bob")
    before = rows(world.database)
    fields = VALID[action](world)
    for form in (
        fields,
        {"csrf_token": "", **fields},
        {"csrf_token": "forged-" + "x" * 36, **fields},
        {"csrf_token": page_token(bob), **fields},  # another session's
        {"csrf_token": page_token(client(world.dashboard.service)), **fields},  # a browser's, signed out
    ):
        answer = alice.post(f"/dashboard/actions/{action}", data=form)
        assert answer.status_code == 403, form
        assert "token is missing or is not this session" in Page(answer.text).text("refusal")
    cross = alice.post(
        f"/dashboard/actions/{action}",
        data={"csrf_token": page_token(alice), **fields},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status_code == 403 and "from another site" in cross.text
    referred = alice.post(
        f"/dashboard/actions/{action}",
        data={"csrf_token": page_token(alice), **fields},
        headers={"Referer": "http://evil.example/dashboard"},
    )
    assert referred.status_code == 403
    assert rows(world.database) == before
    assert sender(world).take() == []


def test_a_form_that_is_not_a_form_is_refused(world: World, alice: TestClient) -> None:
    before = rows(world.database)
    as_json = alice.post("/dashboard/actions/retriage", json={"case_id": world.cases["flaky"]})
    assert as_json.status_code == 400
    too_big = alice.post(
        "/dashboard/actions/retriage", data={"csrf_token": page_token(alice), "pad": "x" * 20000}
    )
    assert too_big.status_code == 413
    assert rows(world.database) == before


# -- re-triage ------------------------------------------------------------------------------------
def test_retriage_queues_a_triage_and_sends_it(world: World, alice: TestClient) -> None:
    flaky = case(world, "flaky")
    answer = act(alice, "retriage", case_id=str(flaky.id))
    assert answer.headers["location"] == f"/dashboard/cases/{flaky.id}"
    assert (
        shown(alice, answer)
        == f"Case {flaky.id} is queued for triage again (generation {flaky.generation + 1})."
    )
    after = case(world, "flaky")
    assert (after.status, after.generation, after.verdict) == ("queued", flaky.generation + 1, "flaky")
    with world.database.session() as session:
        work = session.scalars(select(Work).where(Work.case_id == flaky.id).order_by(Work.id.desc())).first()
        assert work is not None
        assert re.fullmatch(rf"triage:{flaky.id}:dashboard-[0-9a-f]{{16}}", work.key)
        assert (work.step, work.status, work.bundle_id) == ("triage", "queued", world.specs["flaky"].bundle)
        assert work.options["reason"] == "dashboard" and work.options["by"] == "alice (token)"
        work_id = work.id
    (task,) = sender(world).take()
    assert task[0] == "flaketriage.triage" and task[1].work_id == work_id and task[2] == "cpu"
    # Asked again while it waits: one triage.
    again = act(alice, "retriage", case_id=str(flaky.id))
    assert (
        shown(alice, again) == f"Case {flaky.id} is already waiting for its triage: nothing more was asked."
    )
    assert sender(world).take() == []


def test_retriage_of_a_case_without_a_bundle_or_of_no_case_changes_nothing(
    world: World, alice: TestClient
) -> None:
    before = rows(world.database)
    workflow = world.cases["workflow"]
    message = shown(alice, act(alice, "retriage", case_id=str(workflow)))
    assert (
        message
        == f"Nothing was done: case {workflow} has no bundle to replay (no occurrence of it captured one)."
    )
    for bad in ("99999999", "2147483648", "-1", "abc", "", "1\x00", "<b>1</b>"):
        answer = act(alice, "retriage", case_id=bad)
        message = shown(alice, answer)
        assert message.startswith("Nothing was done:"), bad
    assert rows(world.database) == before
    assert sender(world).take() == []


def test_an_api_token_acts_without_a_form_token(world: World) -> None:
    script = client(world.dashboard.service, headers={"Authorization": f"Bearer {TOKEN}"})
    answer = script.post("/dashboard/actions/retriage", data={"case_id": str(world.cases["deterministic"])})
    assert answer.status_code == 303
    assert case(world, "deterministic").status == "queued"


# -- quarantine by hand ---------------------------------------------------------------------------
def test_a_test_quarantined_by_hand_is_served_with_its_owner_and_expiry(
    world: World, alice: TestClient
) -> None:
    before, etag = quarantine_doc(alice)
    expires = in_a_week()
    answer = act(
        alice, "quarantine", test_id=TEST, owner="ml-infra", expires=expires, variant="gpu=NVIDIA H100"
    )
    assert answer.headers["location"] == "/dashboard/quarantine"
    until = datetime.fromisoformat(expires).replace(tzinfo=UTC) + timedelta(days=1)
    message = f"Quarantined {TEST} on gpu=NVIDIA H100, owner ml-infra, until {until:%Y-%m-%d %H:%M} UTC."
    assert shown(alice, answer) == message
    after, new_etag = quarantine_doc(alice)
    assert new_etag != etag
    fingerprint = hand_fingerprint(TEST, {"gpu": "NVIDIA H100"})
    assert set(after.entries) == set(before.entries) | {fingerprint}
    entry = after.entries[fingerprint]
    assert (entry.test_id, entry.owner, entry.expires_at, entry.variant) == (
        TEST, "ml-infra", until, {"gpu": "NVIDIA H100"}
    )  # fmt: skip
    assert entry.reason == "by hand by alice (token)" and entry.by_hand
    # Quarantined again: the same entry, its owner and expiry changed.
    act(alice, "quarantine", test_id=TEST, owner="qa", expires=expires, variant="gpu=NVIDIA H100")
    again, _ = quarantine_doc(alice)
    assert again.entries[fingerprint].owner == "qa" and again.entries[fingerprint].occurrences == 2
    assert len(again.entries) == len(after.entries)


def test_a_case_quarantined_by_hand_is_its_tests_and_the_case_page_says_so(
    world: World, alice: TestClient
) -> None:
    det = world.cases["deterministic"]
    page = Page(alice.get(f"/dashboard/cases/{det}").text)
    assert page.text("case-quarantine") == "not quarantined"
    assert page.has("quarantine-form") and page.has("retriage-form") and not page.has("lift-form")
    answer = act(alice, "quarantine", case_id=str(det), owner="db-team", expires=in_a_week())
    assert answer.headers["location"] == f"/dashboard/cases/{det}"
    assert shown(alice, answer).startswith(
        f"Quarantined {world.specs['deterministic'].test_id}, owner db-team"
    )
    page = Page(alice.get(f"/dashboard/cases/{det}").text)
    assert page.text("case-quarantine").startswith("quarantined")
    assert page.has("lift-form") and page.has("unquarantine-form")
    with world.database.session() as session:
        row = session.scalars(select(QuarantineRow).where(QuarantineRow.case_id == det)).one()
        assert row.entry["test_id"] == world.specs["deterministic"].test_id
    assert case(world, "deterministic").status == "reported"  # quarantining decides nothing about it


def test_the_case_page_offers_anonymous_readers_a_sign_in_instead_of_forms(world: World) -> None:
    page = Page(client(world.dashboard.service).get(f"/dashboard/cases/{world.cases['flaky']}").text)
    assert not page.has("retriage-form") and not page.has("quarantine-form")
    assert "Sign in to re-triage" in page.text("case-actions-sign-in")


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"owner": "a\x00b"}, "an owner"),
        ({"owner": ""}, "give an owner"),
        ({"owner": "x" * 101}, "at most 100 characters"),
        ({"expires": "99999-12-31"}, "is not an expiry"),
        ({"expires": "2024-13-45"}, "is not an expiry"),
        ({"expires": "tomorrow"}, "is not an expiry"),
        ({"expires": "2020-01-01"}, "has passed already"),
        ({"expires": "2999-01-01"}, "at most 90 days ahead"),
        ({"expires": ""}, "no expiry"),
        ({"variant": "gpu"}, "is not key=value"),
        ({"variant": "GPU=x"}, "is not a variant key"),
        ({"test_id": ""}, "give a test id"),
        ({"test_id": "t\x00x"}, "a test id"),
        ({"test_id": "t" * 1001}, "at most 1000"),
        ({"case_id": "2147483648"}, "is not a case number"),
        ({"case_id": "999999"}, "there is no case 999999"),
    ],
)
def test_hostile_quarantine_forms_change_nothing(
    world: World, alice: TestClient, fields: dict[str, str], why: str
) -> None:
    before = rows(world.database)
    form = {"test_id": TEST, "owner": "ml-infra", "expires": in_a_week()} | fields
    message = shown(alice, act(alice, "quarantine", **form))
    assert message.startswith("Nothing was done:") and why in message, message
    assert rows(world.database) == before


def test_text_that_is_not_utf8_is_refused_before_anything_is_read(world: World, alice: TestClient) -> None:
    before = rows(world.database)
    body = f"csrf_token={page_token(alice)}&test_id=x&owner=%ED%A0%80&expires={in_a_week()}".encode()
    answer = alice.post(
        "/dashboard/actions/quarantine",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 400
    assert rows(world.database) == before


def test_html_in_an_owner_or_test_is_kept_as_text_and_shown_escaped(world: World, alice: TestClient) -> None:
    owner = '<img src=x onerror="alert(1)">'
    answer = act(alice, "quarantine", test_id=HOSTILE_TEST, owner=owner, expires=in_a_week())
    assert answer.status_code == 303
    html = alice.get("/dashboard").text  # the message, on a page
    assert owner not in html and HOSTILE_TEST not in html
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html
    entry = quarantine_doc(alice)[0].entries[hand_fingerprint(HOSTILE_TEST, {})]
    assert (entry.owner, entry.test_id) == (owner, HOSTILE_TEST)


def test_messages_come_only_from_the_service(world: World, alice: TestClient) -> None:
    html = alice.get("/dashboard?flash=%3Cscript%3Ealert(1)%3C/script%3E&message=hacked").text
    assert "<script>alert(1)" not in html and "hacked" not in html
    forged = client(world.dashboard.service, cookies={"ft_flash": "eyJtIjoiaGFja2VkIn0.forged"})
    assert "hacked" not in forged.get("/dashboard").text


def test_an_expired_hand_quarantine_is_not_enforced_by_the_plugin(
    world: World, alice: TestClient, tmp_path: Path
) -> None:
    """The list as the service serves it, read by the pytest plugin in a real pytest run: it forgives
    the test's failure until the entry expires, then fails the run and says why."""
    act(alice, "quarantine", test_id=TEST, owner="ml-infra", expires=in_a_week())
    served = json.loads(alice.get("/v1/quarantine").content)
    project, store = tmp_path / "project", tmp_path / "project" / "store"
    store.mkdir(parents=True)
    (project / "test_suite.py").write_text("def test_known_flaky():\n    assert False, 'flaky again'\n")

    def run_pytest(document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        (store / "quarantine.json").write_text(json.dumps(document))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
        env |= {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "flaketriage", "--flaketriage",
             f"--flaketriage-store={store}", "-p", "no:cacheprovider", "-q", "test_suite.py"],
            cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    held = run_pytest(served)
    assert held.returncode == 0, held.stdout + held.stderr
    assert f"QUARANTINED {TEST} - by hand by alice (token), owner ml-infra, until" in held.stdout
    fingerprint = hand_fingerprint(TEST, {})
    served["entries"][fingerprint]["expires_at"] = "2024-06-01T09:30:00Z"  # the week has passed
    expired = run_pytest(served)
    assert expired.returncode == 1, expired.stdout
    assert (
        f"NOT QUARANTINED {TEST} - its quarantine (owner ml-infra) expired at 2024-06-01 09:30 UTC"
        in expired.stdout
    )


# -- lift and un-quarantine -----------------------------------------------------------------------
def test_lifting_ends_the_entry_and_fixes_the_case_once(world: World, alice: TestClient) -> None:
    flaky = world.specs["flaky"]
    answer = act(alice, "lift", fingerprint=flaky.fingerprint, next="/dashboard/quarantine")
    assert answer.headers["location"] == "/dashboard/quarantine"
    assert (
        shown(alice, answer)
        == f"Lifted the quarantine of {flaky.test_id}; case {world.cases['flaky']} marked fixed."
    )
    assert flaky.fingerprint not in quarantine_doc(alice)[0].entries
    after = case(world, "flaky")
    assert (after.status, after.verdict) == ("fixed", "flaky")
    before = rows(world.database)
    twice = act(alice, "lift", fingerprint=flaky.fingerprint, next="/dashboard/quarantine")
    assert (
        shown(alice, twice)
        == f"Nothing to do: entry {flaky.fingerprint[:12]} is not quarantined (already lifted?)."
    )
    assert rows(world.database) == before


def test_lifting_from_the_case_page_ends_its_entries(world: World, alice: TestClient) -> None:
    flaky = world.cases["flaky"]
    answer = act(alice, "lift", case_id=str(flaky))
    assert answer.headers["location"] == f"/dashboard/cases/{flaky}"
    page = Page(alice.get(answer.headers["location"]).text)
    assert page.text("case-status") == "fixed" and page.text("case-quarantine") == "not quarantined"
    assert "marked fixed" in next(p for p in page.root.iter("p") if p.attrs.get("class") == "flash").text


def test_unquarantine_ends_the_entry_and_the_case_keeps_its_verdict(world: World, alice: TestClient) -> None:
    flaky = world.specs["flaky"]
    answer = act(alice, "unquarantine", case_id=str(world.cases["flaky"]))
    assert (
        shown(alice, answer)
        == f"Removed the quarantine of {flaky.test_id}; case {world.cases['flaky']} keeps its verdict."
    )
    assert flaky.fingerprint not in quarantine_doc(alice)[0].entries
    after = case(world, "flaky")
    assert (after.status, after.verdict) == ("reported", "flaky")
    before = rows(world.database)
    twice = act(alice, "unquarantine", case_id=str(world.cases["flaky"]))
    assert (
        shown(alice, twice)
        == f"Nothing to do: case {world.cases['flaky']} is not quarantined (already removed?)."
    )
    assert rows(world.database) == before


def test_a_hand_quarantine_is_removed_by_its_key(world: World, alice: TestClient) -> None:
    act(alice, "quarantine", test_id=TEST, owner="ml-infra", expires=in_a_week())
    fingerprint = hand_fingerprint(TEST, {})
    answer = act(alice, "unquarantine", fingerprint=fingerprint, next="/dashboard/quarantine")
    assert shown(alice, answer) == f"Removed the quarantine of {TEST}."
    assert fingerprint not in quarantine_doc(alice)[0].entries


@pytest.mark.parametrize("fingerprint", ["xyz", "AB" * 16, "ab" * 100, "ab\x00cd" * 8])
def test_lifting_a_key_that_is_no_fingerprint_changes_nothing(
    world: World, alice: TestClient, fingerprint: str
) -> None:
    before = rows(world.database)
    message = shown(alice, act(alice, "lift", fingerprint=fingerprint))
    assert message.startswith("Nothing was done:") and "is not a quarantine entry's key" in message
    assert rows(world.database) == before


@pytest.mark.parametrize("next_path", ["https://evil.example/", "//evil.example", "/v1/cases"])
def test_an_action_returns_only_into_the_dashboard(world: World, alice: TestClient, next_path: str) -> None:
    answer = act(alice, "lift", fingerprint=world.specs["flaky"].fingerprint, next=next_path)
    assert answer.headers["location"] == "/dashboard/quarantine"


# -- in a real browser ----------------------------------------------------------------------------
def test_signing_in_and_acting_in_a_real_browser(tmp_path: Path) -> None:
    """Chromium signs in through the form, re-triages a case from its page and signs out: the
    cookies, the 303s and the page's policy (forms to this site only) work as a browser reads them,
    with no console error."""
    from tests.orchestrator.dashboard.browser import chromium, served

    database = Database(f"sqlite:///{tmp_path / 'service.db'}")
    database.upgrade()
    made = make_dashboard(database, tmp_path)
    world = seed(made)
    flaky = world.cases["flaky"]
    errors: list[str] = []
    try:
        with served(made.client.app) as base, chromium() as browser:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"{base}/dashboard/cases/{flaky}")
            page.click("#case-actions-sign-in a")
            page.fill("#login-name", "alice")
            page.fill("#login-token", TOKEN)
            page.click("#token-form button[type=submit]")
            page.wait_for_url(f"{base}/dashboard/cases/{flaky}")
            assert page.locator(".flash").inner_text() == "Signed in as alice."
            assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads the session
            page.click("#retriage-form button[type=submit]")
            page.wait_for_load_state()
            assert "is queued for triage again" in page.locator(".flash").inner_text()
            assert page.locator("#case-status").inner_text() == "queued"
            page.click("header form button[type=submit]")  # sign out
            page.wait_for_url(f"{base}/dashboard")
            assert page.locator(".flash").inner_text() == "Signed out."
            assert page.locator("header .viewer a").inner_text() == "Sign in"
    finally:
        made.client.close()
        database.dispose()
    assert errors == []
    assert case(world, "flaky").status == "queued"
