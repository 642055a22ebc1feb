"""``POST /v1/results`` and ``GET /v1/tests``: uploads recorded whole and once, refused with one clear
answer when hostile or careless, and the history they make, as the API answers it."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from flaketriage.records import Case, CaseStatus, Occurrence, Work
from flaketriage.records.history import add_totals
from flaketriage.records.models import TestRow, UploadRow
from flaketriage.results import Attempt, ResultsUpload, TestResult
from flaketriage.signing import signed_headers
from flaketriage.work.dispatch import MemorySender
from tests.orchestrator.conftest import EVENTS_SECRET, MakeReceiver, Receiver

REPO = "acme/models"


def body(n: int = 1, tests: list[TestResult] | None = None, **fields: Any) -> bytes:
    base: dict[str, Any] = {"branch": "main", "commit": "abc1234", "job": "unit", "variant": {"os": "linux"}}
    up = ResultsUpload(
        upload_id=f"up-route-{n:08d}",
        repository=REPO,
        tests=tuple(
            tests
            if tests is not None
            else [
                TestResult(test_id="t::ok", outcome="passed", duration_s=1.0),
                TestResult(test_id="t::bad", outcome="failed", duration_s=2.0, message="boom"),
                TestResult(
                    test_id="t::retried",
                    outcome="passed",
                    attempts=(Attempt(outcome="failed", duration_s=3.0),),
                ),
            ]
        ),
        **{**base, **fields},
    )
    return up.to_json()


def post(receiver: Receiver, raw: bytes, *, secret: bytes = EVENTS_SECRET, **headers: str) -> Any:
    signed = signed_headers(secret, raw) | {"Content-Type": "application/json"} | headers
    return receiver.client.post("/v1/results", content=raw, headers=signed)


def totals(receiver: Receiver) -> None:
    """What each upload's history step does first: add its results to the tests' totals."""
    with receiver.database.session() as session:
        for upload in session.scalars(select(UploadRow.id)).all():
            add_totals(session, upload)


def test_an_upload_is_accepted_recorded_and_its_history_step_sent(receiver: Receiver) -> None:
    answer = post(receiver, body())
    assert answer.status_code == 202, answer.text
    data = answer.json()
    assert (data["outcome"], data["tests"], data["failures"], data["passed_on_retry"], data["storm"]) == (
        "accepted", 3, 1, 1, False,
    )  # fmt: skip
    [work] = receiver.works()
    assert (work.step, work.options) == ("history", {"upload": data["upload"]})
    assert [(name, order.work_id) for name, order, _ in receiver.sender.sent] == [
        ("flaketriage.history", work.id)
    ]
    assert receiver.counts()["test_results"] == 3
    assert receiver.events_total("results", "accepted") == 1


def test_the_same_upload_again_is_a_duplicate_that_changes_nothing(receiver: Receiver) -> None:
    assert post(receiver, body()).status_code == 202
    before = receiver.counts()
    again = post(receiver, body())
    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    assert receiver.counts() == before


def test_results_are_refused_unsigned_or_badly_signed(make_receiver: MakeReceiver) -> None:
    unsigned = make_receiver(webhook_secret=None)
    answer = post(unsigned, body())
    assert answer.status_code == 401 and "FLAKETRIAGE_WEBHOOK_SECRET" in answer.json()["detail"]
    receiver = make_receiver()
    assert post(receiver, body(), secret=b"another secret").status_code == 401
    assert receiver.counts()["test_results"] == 0


def test_an_upload_past_the_limit_is_refused_before_it_is_read_whole(make_receiver: MakeReceiver) -> None:
    receiver = make_receiver(max_results_mb=1)
    many = [
        TestResult(test_id=f"tests/test_big.py::test_{i:06d}" + "x" * 40, outcome="passed")
        for i in range(20000)
    ]
    raw = body(tests=many)
    assert len(raw) > 1024 * 1024
    answer = post(receiver, raw)
    assert answer.status_code == 413 and "FLAKETRIAGE_MAX_RESULTS_MB" in answer.json()["detail"]
    assert receiver.counts()["test_results"] == 0


def test_careless_bodies_get_one_clear_answer_and_record_nothing(receiver: Receiver) -> None:
    valid = json.loads(body())
    cases: list[tuple[bytes, int, str]] = [
        (b"<testsuites/>", 400, "not JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({**valid, "repository": "../etc"}).encode(), 422, "repository"),
        (json.dumps({k: v for k, v in valid.items() if k != "tests"}).encode(), 422, "tests"),
        (json.dumps({**valid, "tests": [{"test_id": "a\u0000b", "outcome": "passed"}]}).encode(), 422, "NUL"),
        (json.dumps({**valid, "tests": [{"test_id": "a", "outcome": "maybe"}]}).encode(), 422, "outcome"),
        (json.dumps({**valid, "variant": {"OS": "linux"}}).encode(), 422, "variant key"),
        (json.dumps({**valid, "schema_version": 2}).encode(), 422, "schema_version"),
        (json.dumps({**valid, "tests": [{"test_id": "a", "outcome": "passed", "duration_s": -1}]}).encode(),
         422, "duration_s"),
        (b'{"upload_id": "up-12345678", "repository": "a/b", '
         b'"tests": [{"test_id": "\\ud800", "outcome": "passed"}]}', 400, "not JSON"),
        (json.dumps({**valid, "extra": 1}).encode(), 422, "extra"),
    ]  # fmt: skip
    for raw, status, says in cases:
        answer = post(receiver, raw)
        assert answer.status_code == status, (raw[:80], answer.text)
        assert says in answer.json()["detail"], (raw[:80], answer.text)
    assert receiver.counts()["test_results"] == 0 and receiver.counts()["result_uploads"] == 0


def test_a_broker_that_is_down_loses_nothing(make_receiver: MakeReceiver) -> None:
    receiver = make_receiver(sender=MemorySender(fail=True))
    answer = post(receiver, body())
    assert answer.status_code == 503 and "broker" in answer.json()["detail"]
    [work] = receiver.works()  # recorded, with its step: the sweep sends it
    assert work.step == "history" and receiver.counts()["test_results"] == 3
    receiver.sender.fail = False
    assert post(receiver, body()).json()["outcome"] == "duplicate"  # the sender's retry


def test_tests_are_listed_filtered_and_shown(receiver: Receiver) -> None:
    assert post(receiver, body(1)).status_code == 202
    assert post(receiver, body(2, branch="feature", commit="def5678")).status_code == 202
    totals(receiver)
    listed = receiver.client.get("/v1/tests", params={"repository": REPO}).json()
    assert {t["test_id"] for t in listed} == {"t::ok", "t::bad", "t::retried"}
    bad = next(t for t in listed if t["test_id"] == "t::bad")
    assert (bad["runs"], bad["failures"], bad["blocked_runs"], bad["ci_lost_s"], bad["variant"]) == (
        2, 2, 2, 4.0, "os=linux",
    )  # fmt: skip
    assert receiver.client.get("/v1/tests", params={"repository": "other/repo"}).json() == []
    assert [t["test_id"] for t in receiver.client.get("/v1/tests", params={"sort": "lost"}).json()][:1] == [
        "t::retried"  # 3 s lost per run, twice
    ]
    assert len(receiver.client.get("/v1/tests", params={"branch": "feature"}).json()) == 3
    assert receiver.client.get("/v1/tests", params={"branch": "nowhere"}).json() == []
    assert receiver.client.get("/v1/tests", params={"sort": "sideways"}).status_code == 422
    detail = receiver.client.get(f"/v1/tests/{bad['id']}").json()
    assert [r["commit"] for r in detail["recent"]] == ["def5678", "abc1234"]  # newest first
    assert detail["recent"][0]["job"] == "unit" and detail["flip_rate"] == 0.0
    assert receiver.client.get("/v1/tests/999999").status_code == 404
    assert receiver.client.get(f"/v1/tests/{2**40}").status_code == 404


def test_tests_need_the_token_when_one_is_set(make_receiver: MakeReceiver) -> None:
    receiver = make_receiver(api_token="sesame")
    assert receiver.client.get("/v1/tests").status_code == 401
    answer = receiver.client.get("/v1/tests", headers={"Authorization": "Bearer sesame"})
    assert answer.status_code == 200


def test_flaky_and_quarantined_filters(receiver: Receiver) -> None:
    from flaketriage.records import QuarantineRow

    assert post(receiver, body()).status_code == 202
    with receiver.database.session() as session:
        session.query(TestRow).filter(TestRow.test_id == "t::retried").update({"suspected_flaky": True})
        session.add(QuarantineRow(fingerprint="ef" * 32, entry=quarantine_entry("t::bad")))
    flaky = receiver.client.get("/v1/tests", params={"flaky": "true"}).json()
    assert [t["test_id"] for t in flaky] == ["t::retried"]
    held = receiver.client.get("/v1/tests", params={"quarantined": "true"}).json()
    assert [(t["test_id"], t["quarantined"]) for t in held] == [("t::bad", True)]
    free = receiver.client.get("/v1/tests", params={"quarantined": "false"}).json()
    assert {t["test_id"] for t in free} == {"t::ok", "t::retried"}


def quarantine_entry(test_id: str) -> dict[str, Any]:
    return {
        "fingerprint": "ef" * 32,
        "test_id": test_id,
        "reason": "flaky",
        "evidence": {"replays": 10, "reproductions": 3, "rate": {"estimate": 0.3, "low": 0.1, "high": 0.6}},
        "command": "pytest t::bad",
        "bundle_id": "ab" * 32,
        "occurrences": 1,
        "quarantined_at": "2026-12-01T00:00:00Z",
        "updated_at": "2026-12-01T00:00:00Z",
    }


def test_a_case_shows_its_impact(receiver: Receiver) -> None:
    assert post(receiver, body()).status_code == 202
    totals(receiver)
    with receiver.database.session() as session:
        case = Case(
            fingerprint="12" * 32, kind="bundle", title="boom", test_id="t::bad", repository=REPO,
            status=CaseStatus.REPORTED.value, verdict="deterministic", occurrences=1,
        )  # fmt: skip
        session.add(case)
        session.flush()
        session.add(Occurrence(case_id=case.id, source="events", delivery_id="e1", test_id="t::bad"))
        case_id = case.id
    impact = receiver.client.get(f"/v1/cases/{case_id}").json()["impact"]
    assert impact == {
        "ci_lost_s": 2.0,
        "blocked_runs": 1,
        "replay_cpu_s": 0.0,
        "replay_gpu_s": 0.0,
        "replays": 0,
    }
    with receiver.database.session() as session:
        assert session.scalars(select(Work)).one().step == "history"
