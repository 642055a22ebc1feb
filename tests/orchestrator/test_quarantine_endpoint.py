"""``GET /v1/quarantine`` as the CI side asks for it each session: an ETag on every answer, and
``304 Not Modified`` to a client whose copy is current (``If-None-Match``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from flaketriage.quarantine import FailureRate, QuarantineDocument, QuarantineEvidence, refreshed_entry
from flaketriage.records import QuarantineRow

if TYPE_CHECKING:
    from conftest import MakeReceiver, Receiver  # tests/orchestrator/conftest.py


def quarantine(receiver: Receiver, fingerprint: str) -> None:
    entry = refreshed_entry(
        None,
        fingerprint=fingerprint,
        test_id="tests/test_a.py::test_x",
        command="pytest tests/test_a.py::test_x",
        bundle_id="c" * 64,
        evidence=QuarantineEvidence(
            verdict="flaky", replays=20, reproductions=7, rate=FailureRate(estimate=0.35, low=0.15, high=0.59)
        ),
        reason="flaky: failed 7 of 20 replays",
        issue_url=None,
        now=datetime(2024, 6, 10, 14, 0, tzinfo=UTC),
    )
    with receiver.database.session() as session:
        session.add(QuarantineRow(fingerprint=entry.fingerprint, entry=entry.model_dump(mode="json")))


def test_every_answer_has_a_strong_etag_and_asks_caches_to_revalidate(receiver: Receiver) -> None:
    first = receiver.client.get("/v1/quarantine")
    again = receiver.client.get("/v1/quarantine")

    etag = first.headers["etag"]
    assert first.status_code == 200 and etag.startswith('"') and etag.endswith('"') and len(etag) > 10
    assert again.headers["etag"] == etag  # the same list, the same tag
    assert first.headers["cache-control"] == "no-cache"


def test_a_current_copy_is_answered_304_and_a_change_is_answered_200(receiver: Receiver) -> None:
    etag = receiver.client.get("/v1/quarantine").headers["etag"]

    unchanged = receiver.client.get("/v1/quarantine", headers={"If-None-Match": etag})

    assert unchanged.status_code == 304 and unchanged.content == b""
    assert unchanged.headers["etag"] == etag

    quarantine(receiver, "ab" * 32)
    changed = receiver.client.get("/v1/quarantine", headers={"If-None-Match": etag})

    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert list(QuarantineDocument.from_json(changed.content).entries) == ["ab" * 32]
    new = changed.headers["etag"]
    assert receiver.client.get("/v1/quarantine", headers={"If-None-Match": new}).status_code == 304


@pytest.mark.parametrize(
    "if_none_match",
    ['"other", {etag}', "W/{etag}", " {etag} ", "*"],
    ids=["in-a-list", "weak-form", "spaces", "star"],
)
def test_if_none_match_is_compared_as_rfc_9110_says(receiver: Receiver, if_none_match: str) -> None:
    etag = receiver.client.get("/v1/quarantine").headers["etag"]

    response = receiver.client.get(
        "/v1/quarantine", headers={"If-None-Match": if_none_match.format(etag=etag)}
    )

    assert response.status_code == 304


@pytest.mark.parametrize(
    "if_none_match",
    ['"stale"', "", "garbage without quotes", '"' + "x" * 4000 + '"', ",,,", 'W/"', "\u00e9t\u00e9".encode()],
    ids=["other-tag", "empty", "unquoted", "huge", "commas", "half-weak", "non-ascii"],
)
def test_a_tag_that_does_not_match_gets_the_whole_list(
    receiver: Receiver, if_none_match: str | bytes
) -> None:
    response = receiver.client.get("/v1/quarantine", headers={"If-None-Match": if_none_match})

    assert response.status_code == 200, response.text
    assert QuarantineDocument.from_json(response.content) == QuarantineDocument()


def test_with_an_api_token_a_304_needs_the_bearer_too(make_receiver: MakeReceiver) -> None:
    receiver = make_receiver(api_token="s3cret-token")
    bearer = {"Authorization": "Bearer s3cret-token"}
    etag = receiver.client.get("/v1/quarantine", headers=bearer).headers["etag"]

    refused = receiver.client.get("/v1/quarantine", headers={"If-None-Match": etag})

    assert refused.status_code == 401 and "etag" not in refused.headers
    ok = receiver.client.get("/v1/quarantine", headers={"If-None-Match": etag, **bearer})
    assert ok.status_code == 304
