"""The read side: cases (listed, filtered, one in full), the quarantine document, the bearer token,
health, readiness and the Prometheus metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flaketriage.orchestrator.api_models import CaseDetail, CaseSummary, CaseVerdict
from flaketriage.orchestrator.sender import receiver_sender
from flaketriage.quarantine import FailureRate, QuarantineDocument, QuarantineEvidence, refreshed_entry
from flaketriage.records import CaseStatus, Database, QuarantineRow
from flaketriage.settings import load_settings
from flaketriage.work.dispatch import MemorySender
from flaketriage.workers.verdict import Verdict

if TYPE_CHECKING:
    from conftest import Captured, MakeReceiver, Receiver  # tests/orchestrator/conftest.py

Load = Callable[[str], dict[str, Any]]


@pytest.fixture
def three_cases(receiver: Receiver, captured: Captured, load_payload: Load) -> dict[str, int]:
    """A triaged bundle case decided flaky, a queued one, and an open workflow case; by name."""
    assert receiver.post_event(captured.event(captured.value_error)).status_code == 202
    assert receiver.post_event(captured.event(captured.key_error)).status_code == 202
    assert (
        receiver.github("workflow_run", load_payload("github_workflow_run.completed.json")).status_code == 200
    )
    flaky, queued, workflow = (c.id for c in receiver.cases())
    receiver.update_case(flaky, status="decided", verdict="flaky")
    return {"flaky": flaky, "queued": queued, "workflow": workflow}


def metric(receiver: Receiver, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(receiver.client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


# -- cases ----------------------------------------------------------------------------------------
def test_cases_are_listed_newest_first(receiver: Receiver, three_cases: dict[str, int]) -> None:
    response = receiver.client.get("/v1/cases")

    assert response.status_code == 200
    cases = [CaseSummary.model_validate(c) for c in response.json()]
    assert [c.id for c in cases] == [three_cases["workflow"], three_cases["queued"], three_cases["flaky"]]
    assert [c.status for c in cases] == ["open", "queued", "decided"]
    assert [c.kind for c in cases] == ["workflow", "bundle", "bundle"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status": "open"}, ["workflow"]),
        ({"status": "decided"}, ["flaky"]),
        ({"status": "queued"}, ["queued"]),
        ({"status": "fixed"}, []),
        ({"verdict": "flaky"}, ["flaky"]),
        ({"verdict": "deterministic"}, []),
        ({"status": "decided", "verdict": "flaky"}, ["flaky"]),
        ({"status": "open", "verdict": "flaky"}, []),
        ({"limit": 1}, ["workflow"]),
        ({"limit": 0}, ["workflow"]),
    ],
)
def test_cases_are_filtered(
    receiver: Receiver, three_cases: dict[str, int], query: dict[str, Any], expected: list[str]
) -> None:
    response = receiver.client.get("/v1/cases", params=query)

    assert response.status_code == 200
    assert [c["id"] for c in response.json()] == [three_cases[name] for name in expected]


@pytest.mark.parametrize(
    "query",
    [
        {"status": "nonsense"},
        {"status": "open\x00"},
        {"verdict": "flaky\x00"},
        {"verdict": "bogus"},
        {"verdict": "FLAKY"},
        {"verdict": ""},
        {"limit": "many"},
    ],
    ids=[
        "unknown-status",
        "nul-status",
        "nul-verdict",
        "unknown-verdict",
        "verdict-in-capitals",
        "empty-verdict",
        "limit-not-a-number",
    ],
)
def test_a_bad_filter_is_a_422(
    receiver: Receiver, three_cases: dict[str, int], query: dict[str, Any]
) -> None:
    response = receiver.client.get("/v1/cases", params=query)

    assert response.status_code == 422, response.text
    assert next(iter(query)) in response.json()["detail"]


@pytest.mark.parametrize("name", ["status", "verdict"])
def test_an_unknown_filter_value_is_refused_naming_the_values_there_are(
    receiver: Receiver, name: str
) -> None:
    response = receiver.client.get("/v1/cases", params={name: "bogus"})

    assert response.status_code == 422, response.text
    values = {"status": list(CaseStatus), "verdict": list(Verdict)}[name]
    assert all(f"'{value}'" in response.json()["detail"] for value in values)
    for value in values:
        assert receiver.client.get("/v1/cases", params={name: str(value)}).status_code == 200


def test_the_verdict_filter_knows_every_verdict_the_workers_give() -> None:
    assert {str(v) for v in CaseVerdict} == {str(v) for v in Verdict}


def test_one_case_in_full(receiver: Receiver, captured: Captured, three_cases: dict[str, int]) -> None:
    receiver.post_event(captured.event(captured.value_error_again))

    response = receiver.client.get(f"/v1/cases/{three_cases['flaky']}")

    assert response.status_code == 200
    case = CaseDetail.model_validate(response.json())
    assert (case.status, case.verdict, case.occurrences) == ("decided", "flaky", 2)
    assert case.bundles == [captured.value_error, captured.value_error_again]
    assert [o.bundle_id for o in case.occurrence_list] == case.bundles
    assert {o.source for o in case.occurrence_list} == {"events"}
    [run] = case.triage_runs
    assert (run.step, run.status, run.bundle_id, run.queue, run.replays) == (
        "triage",
        "queued",
        captured.value_error,
        "cpu",
        [],
    )


def test_a_case_shows_what_its_triage_cost(receiver: Receiver, three_cases: dict[str, int]) -> None:
    phase = {"runs": 5, "cpu_s": 2.5, "gpu_s": 0.0, "wall_s": 3.0, "unmeasured": 0}
    cost = {**phase, "gpus": 0, "budget_s": 10.0, "budget_spent": False, "phases": {"verdict": phase}}
    receiver.update_case(three_cases["flaky"], evidence={"verdict": "flaky", "cost": cost})
    receiver.update_case(three_cases["queued"], evidence={"verdict": "flaky"})  # recorded before costs

    shown = receiver.client.get(f"/v1/cases/{three_cases['flaky']}").json()

    assert shown["cost"] == cost
    assert CaseDetail.model_validate(shown).cost is not None
    assert receiver.client.get(f"/v1/cases/{three_cases['queued']}").json()["cost"] is None


@pytest.mark.parametrize("case_id", ["999999", "0", "-1", str(2**31), str(2**63), str(10**30)])
def test_an_unknown_case_is_a_404(receiver: Receiver, three_cases: dict[str, int], case_id: str) -> None:
    response = receiver.client.get(f"/v1/cases/{case_id}")

    assert response.status_code == 404, response.text
    assert "/v1/cases" in response.json()["detail"]


def test_a_case_id_that_is_not_a_number_is_a_422(receiver: Receiver) -> None:
    response = receiver.client.get("/v1/cases/latest")

    assert response.status_code == 422
    assert "case_id" in response.json()["detail"]


# -- quarantine -----------------------------------------------------------------------------------
def test_the_quarantine_document_is_what_the_ci_side_reads(receiver: Receiver, captured: Captured) -> None:
    empty = receiver.client.get("/v1/quarantine")
    assert empty.status_code == 200
    assert empty.headers["content-type"] == "application/json"
    assert QuarantineDocument.from_json(empty.content) == QuarantineDocument()

    manifest = captured.manifest(captured.value_error)
    entry = refreshed_entry(
        None,
        fingerprint=manifest.failure.fingerprint,
        test_id=None,
        command="python fail.py",
        bundle_id=captured.value_error,
        evidence=QuarantineEvidence(
            verdict="flaky",
            decided=True,
            replays=20,
            reproductions=7,
            passes=13,
            different=0,
            rate=FailureRate(estimate=0.35, low=0.15, high=0.59),
        ),
        reason="flaky: failed 7 of 20 replays",
        issue_url="https://github.com/acme/trainer/issues/12",
        now=datetime(2024, 6, 10, 14, 0, tzinfo=UTC),
    )
    with receiver.database.session() as session:
        session.add(QuarantineRow(fingerprint=entry.fingerprint, entry=entry.model_dump(mode="json")))

    document = QuarantineDocument.from_json(
        receiver.client.get("/v1/quarantine").content, where="GET /v1/quarantine"
    )

    assert document.entries == {entry.fingerprint: entry}
    assert document.find([], manifest.failure.fingerprint) == entry


# -- the API token --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/cases", "/v1/cases/1", "/v1/quarantine"])
@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        ("Bearer wrong-token", 401),
        ("Bearer ", 401),
        ("s3cret-token", 401),
        ("Basic s3cret-token", 401),
        ("Bearer s3cret-token-and-more", 401),
        ("Bearer s3cret-token", 200),
    ],
)
def test_with_an_api_token_reads_need_the_bearer(
    make_receiver: MakeReceiver, captured: Captured, path: str, authorization: str | None, status: int
) -> None:
    receiver = make_receiver(api_token="s3cret-token")
    receiver.post_event(captured.event(captured.value_error))
    headers = {"Authorization": authorization} if authorization is not None else {}

    response = receiver.client.get(path, headers=headers)

    assert response.status_code == status, response.text
    if status == 401:
        assert "Bearer" in response.json()["detail"]


def test_health_and_metrics_need_no_token(make_receiver: MakeReceiver) -> None:
    receiver = make_receiver(api_token="s3cret-token")

    for path in ("/healthz", "/readyz", "/metrics"):
        assert receiver.client.get(path).status_code == 200, path


# -- health ---------------------------------------------------------------------------------------
def test_healthz_and_readyz(receiver: Receiver) -> None:
    assert receiver.client.get("/healthz").json() == {"status": "ok", "database": None, "broker": None}
    ready = receiver.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok", "database": "ok", "broker": "ok"}


def test_readyz_is_a_503_when_the_broker_is_down(make_receiver: MakeReceiver) -> None:
    receiver = make_receiver(sender=MemorySender(fail=True))

    ready = receiver.client.get("/readyz")

    assert ready.status_code == 503
    assert ready.json() == {"status": "unavailable", "database": "ok", "broker": "unavailable"}
    assert receiver.client.get("/healthz").status_code == 200


def test_head_probes_are_answered_without_a_body(make_receiver: MakeReceiver) -> None:
    """Load balancers probe with HEAD: the status of the GET, no body."""
    up = make_receiver()
    down = make_receiver(sender=MemorySender(fail=True))

    for receiver, ready in ((up, 200), (down, 503)):
        healthz, readyz = receiver.client.head("/healthz"), receiver.client.head("/readyz")
        assert (healthz.status_code, healthz.content) == (200, b"")
        assert (readyz.status_code, readyz.content) == (ready, b"")


def test_readyz_names_what_is_down_only_to_the_api_token(
    make_receiver: MakeReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """An outage's details (the database's user, host, port and name; the broker's address) are
    for the operator: a request with the API token, and the server's log. Others see "unavailable"."""
    down = Database("postgresql://secret_user@127.0.0.1:1/secret_db")
    broker = "redis://127.0.0.1:1/7"
    receiver = make_receiver(
        database=down, sender=receiver_sender(load_settings(broker_url=broker)), api_token="tok"
    )
    caplog.set_level(logging.WARNING, logger="flaketriage.receiver")

    anonymous = receiver.client.get("/readyz")
    wrong = receiver.client.get("/readyz", headers={"Authorization": "Bearer nope"})
    operator = receiver.client.get("/readyz", headers={"Authorization": "Bearer tok"})

    hidden = {"status": "unavailable", "database": "unavailable", "broker": "unavailable"}
    assert (anonymous.status_code, anonymous.json()) == (503, hidden)
    assert (wrong.status_code, wrong.json()) == (503, hidden)
    assert operator.status_code == 503
    assert "secret_user" in operator.json()["database"] and "127.0.0.1:1" in operator.json()["broker"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "secret_user" in logged and "127.0.0.1:1" in logged
    down.dispose()


def test_readyz_and_reads_are_503_when_the_database_is_down(
    make_receiver: MakeReceiver, database: Database, tmp_path: Path
) -> None:
    if database.is_sqlite:
        (tmp_path / "a-directory").mkdir()
        down = Database(f"sqlite:///{tmp_path / 'a-directory'}")
    else:
        down = Database("postgresql://postgres@127.0.0.1:1/nothing")
    receiver = make_receiver(database=down)

    ready = receiver.client.get("/readyz")

    assert ready.status_code == 503
    assert ready.json() == {"status": "unavailable", "database": "unavailable", "broker": "ok"}
    for path in ("/v1/cases", "/v1/cases/1", "/v1/quarantine"):
        response = receiver.client.get(path)
        assert response.status_code == 503, path
        assert "retry" in response.json()["detail"]
    assert receiver.client.get("/healthz").status_code == 200
    assert metric(receiver, "flaketriage_records_up") == 0
    down.dispose()


# -- metrics --------------------------------------------------------------------------------------
def test_metrics_count_cases_work_and_events(receiver: Receiver, three_cases: dict[str, int]) -> None:
    response = receiver.client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert metric(receiver, "flaketriage_records_up") == 1
    assert metric(receiver, "flaketriage_cases", status="open") == 1
    assert metric(receiver, "flaketriage_cases", status="queued") == 1
    assert metric(receiver, "flaketriage_cases", status="decided") == 1
    assert metric(receiver, "flaketriage_verdicts", verdict="flaky") == 1
    assert metric(receiver, "flaketriage_queue_depth", queue="cpu", status="queued") == 2
    assert metric(receiver, "flaketriage_queue_depth", queue="replays", status="queued") == 0
    assert metric(receiver, "flaketriage_events_total", source="events", outcome="accepted") == 2
    assert metric(receiver, "flaketriage_events_total", source="github", outcome="recorded") == 1
    assert metric(receiver, "flaketriage_triage_duration_seconds_count") == 0
