"""``flaketriage cases``: the real CLI against the real receiver on loopback, and against the
embedded database beside the store, when no service is set."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flaketriage.records import Case, Database, Occurrence, ReplayRow, Work
from flaketriage.settings import load_settings
from tests.ci.live_service import LiveService, live_service
from tests.cli.conftest import Run

TOKEN = "cases-api-token"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EVIDENCE = {
    "bundle": "b" * 64,
    "verdict": "order_dependent",
    "decided": True,
    "replays": 24,
    "failures": 6,
    "passes": 18,
    "failure_rate": {"estimate": 0.25, "low": 0.1, "high": 0.47},
    "findings": [{"fingerprint": "f" * 16, "kind": "different", "summary": "KeyError: 'x'", "count": 2}],
    "polluters": ["tests/test_cache.py::test_fill"],
    "order_cause": "fails after tests/test_cache.py::test_fill",
    "cost": {
        "runs": 24,
        "cpu_s": 12.5,
        "gpu_s": 0.0,
        "wall_s": 30.0,
        "unmeasured": 0,
        "gpus": 0,
        "budget_s": None,
        "budget_spent": False,
        "phases": {"verdict": {"runs": 24, "cpu_s": 12.5, "gpu_s": 0.0, "wall_s": 30.0, "unmeasured": 0}},
    },
}


def add_cases(database: Database) -> None:
    """Two cases: a reported flaky one with its evidence and replays, and a newer queued one."""
    with database.session() as session:
        flaky = Case(
            fingerprint="a" * 64,
            kind="pytest",
            title="test_lookup: AssertionError: stale entry",
            test_id="tests/test_lookup.py::test_lookup",
            status="reported",
            verdict="flaky",
            occurrences=3,
            first_seen=NOW - timedelta(days=2),
            last_seen=NOW - timedelta(hours=1),
            report_kind="markdown",
            report_url="/srv/issues/aaaaaaaaaaaa.md",
            evidence=EVIDENCE,
        )
        queued = Case(
            fingerprint="c" * 64,
            kind="training",
            title="train.py: loss is NaN",
            status="queued",
            occurrences=1,
            first_seen=NOW,
            last_seen=NOW,
        )
        session.add_all([flaky, queued])
        session.flush()
        session.add(Occurrence(case_id=flaky.id, source="events", delivery_id="d1", bundle_id="b" * 64))
        work = Work(
            key="triage:1", case_id=flaky.id, bundle_id="b" * 64, step="triage", queue="cpu", status="done"
        )
        session.add(work)
        session.flush()
        session.add_all(
            ReplayRow(work_id=work.id, idx=i, outcome="reproduced" if i < 6 else "passed") for i in range(24)
        )


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    with live_service(tmp_path_factory.mktemp("cases"), api_token=TOKEN) as live:
        add_cases(live.service.database)
        yield live


def env_for(live: LiveService, token: str | None = TOKEN) -> dict[str, str]:
    env = {"FLAKETRIAGE_NOTIFY_URL": live.events_url}  # the service URL is derived from it
    if token is not None:
        env["FLAKETRIAGE_API_TOKEN"] = token
    return env


def error_line(result: object) -> str:
    stderr = getattr(result, "stderr", "")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


def test_service_url_defaults_to_the_origin_of_the_events_endpoint() -> None:
    assert load_settings(notify_url="https://ft.acme.dev:8443/v1/events").resolved_service_url() == (
        "https://ft.acme.dev:8443"
    )
    assert (
        load_settings(notify_url="https://acme.dev/ft/v1/events").resolved_service_url()
        == "https://acme.dev/ft"
    )
    assert load_settings(
        notify_url="https://a/v1/events", service_url="http://b:8000/"
    ).resolved_service_url() == ("http://b:8000")
    assert load_settings().resolved_service_url() is None


def test_list_reads_the_service_newest_first(cli: Run, service: LiveService) -> None:
    result = cli("cases", env=env_for(service))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["id", "status", "verdict", "kind", "title", "occurrences", "last", "seen"]
    assert "train.py: loss is NaN" in lines[1] and "queued" in lines[1]
    assert "flaky" in lines[2] and "reported" in lines[2] and "2026-12-01 11:00:00" in lines[2]


def test_filters_and_json_are_the_apis(cli: Run, service: LiveService) -> None:
    result = cli("cases", "--verdict", "flaky", "--json", env=env_for(service))
    assert result.returncode == 0, result.stderr
    cases = json.loads(result.stdout)
    assert [c["verdict"] for c in cases] == ["flaky"]
    assert cases[0]["bundles"] == ["b" * 64]
    assert len(json.loads(cli("cases", "--limit", "1", "--json", env=env_for(service)).stdout)) == 1


def test_show_gives_the_evidence(cli: Run, service: LiveService) -> None:
    flaky = json.loads(cli("cases", "--verdict", "flaky", "--json", env=env_for(service)).stdout)[0]
    result = cli("cases", "show", str(flaky["id"]), env=env_for(service))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "verdict flaky" in text
    assert "rate reproduced 6 of 24 replays (rate 0.25, 95% interval 0.10–0.47)" in text
    assert "polluters tests/test_cache.py::test_fill" in text
    assert "seen 3 times, first 2026-11-29 12:00:00, last 2026-12-01 11:00:00" in text
    assert "finding different failure (2×): KeyError: 'x'" in text
    assert "replays 24 (18 passed, 6 reproduced); runs: triage done" in text
    assert "report markdown: /srv/issues/aaaaaaaaaaaa.md" in text
    assert "cost 12.5 CPU s" in text

    as_json = json.loads(cli("cases", "show", str(flaky["id"]), "--json", env=env_for(service)).stdout)
    assert as_json["evidence"] == EVIDENCE and len(as_json["triage_runs"][0]["replays"]) == 24


def test_each_refusal_is_one_error_line_and_exit_1(cli: Run, service: LiveService) -> None:
    missing = cli("cases", "show", "999999", env=env_for(service))
    assert missing.returncode == 1
    assert f"no case 999999 at {service.base}" in error_line(missing)

    bad_filter = cli("cases", "--verdict", "bogus", env=env_for(service))
    assert bad_filter.returncode == 1
    assert "--verdict" in error_line(bad_filter) and "flaky" in error_line(bad_filter)

    no_token = cli("cases", env=env_for(service, token=None))
    assert no_token.returncode == 1
    assert "needs its API token (401): set FLAKETRIAGE_API_TOKEN" in error_line(no_token)

    wrong_token = cli("cases", "show", "1", env=env_for(service, token="wrong"))
    assert wrong_token.returncode == 1
    assert "refused FLAKETRIAGE_API_TOKEN (401)" in error_line(wrong_token)
    assert "wrong" not in error_line(wrong_token)  # the token is never printed

    not_the_api = cli("cases", "--service", f"{service.base}/elsewhere", env=env_for(service))
    assert not_the_api.returncode == 1
    assert "answered 404: is FLAKETRIAGE_SERVICE_URL" in error_line(not_the_api)


def test_a_service_that_does_not_answer_is_one_error_line(cli: Run) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = cli("cases", env={"FLAKETRIAGE_SERVICE_URL": f"http://127.0.0.1:{port}"})
    assert result.returncode == 1
    assert f"the service at http://127.0.0.1:{port} does not answer" in error_line(result)
    assert "Traceback" not in result.stderr

    not_a_url = cli("cases", "--service", "ftp://x")
    assert not_a_url.returncode == 2  # a bad option, as everywhere
    assert "--service ftp://x is not valid: must be the service's http(s) base URL" in error_line(not_a_url)


def test_without_a_service_the_embedded_database_is_read(cli: Run, tmp_path: Path) -> None:
    store = tmp_path / "store"
    empty = cli("cases", "--store", str(store))
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no cases at sqlite:///" in empty.stderr
    assert not (store / "service.db").exists()  # reading created nothing

    store.mkdir()
    database = Database(load_settings(store=str(store)).resolved_database_url())
    database.upgrade()
    add_cases(database)
    database.dispose()
    listed = json.loads(cli("cases", "--store", str(store), "--status", "reported", "--json").stdout)
    assert [c["verdict"] for c in listed] == ["flaky"]
    shown = cli("cases", "show", str(listed[0]["id"]), "--store", str(store))
    assert shown.returncode == 0, shown.stderr
    assert "reproduced 6 of 24 replays" in shown.stdout

    bad = cli("cases", "--store", str(store), "--verdict", "bogus")
    assert bad.returncode == 1 and "--verdict 'bogus' is not a verdict" in error_line(bad)
    missing = cli("cases", "show", "77", "--store", str(store))
    assert missing.returncode == 1 and "no case 77 in sqlite:///" in error_line(missing)


def test_a_file_that_is_not_a_database_is_one_error_line(cli: Run, tmp_path: Path) -> None:
    (tmp_path / "service.db").write_text("not sqlite\n" * 100)
    result = cli("cases", "--store", str(tmp_path))
    assert result.returncode == 1
    assert "cannot read the cases in sqlite:///" in error_line(result)
