"""The quarantine document: one model for the workers' file, the service's answer and the CI cache."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from flaketriage.ci.quarantine_list import load_quarantine
from flaketriage.errors import QuarantineError
from flaketriage.quarantine import FailureRate, QuarantineDocument, QuarantineEntry, QuarantineEvidence
from flaketriage.settings import Settings
from flaketriage.workers.quarantine.file import Quarantine

FP = "ab" * 32
WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
EVIDENCE = QuarantineEvidence(
    verdict="flaky",
    decided=True,
    replays=20,
    reproductions=3,
    passes=17,
    different=0,
    rate=FailureRate(estimate=0.15, low=0.032, high=0.379),
)


def entry(fingerprint: str = FP, **changes: Any) -> QuarantineEntry:
    fields: dict[str, Any] = {
        "fingerprint": fingerprint,
        "test_id": "tests/test_a.py::test_x",
        "reason": "flaky: reproduced 3 of 20 replays",
        "evidence": EVIDENCE,
        "command": "python -m pytest tests/test_a.py::test_x",
        "bundle_id": "c" * 64,
        "bundles": ("c" * 64,),
        "occurrences": 1,
        "issue_url": "https://github.com/acme/app/issues/7",
        "quarantined_at": WHEN,
        "updated_at": WHEN,
    }
    return QuarantineEntry(**{**fields, **changes})


def as_json(doc: QuarantineDocument) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(doc.to_json())
    return data


def test_round_trip_is_exact_and_stable() -> None:
    doc = QuarantineDocument().with_entry(entry()).with_entry(entry("cd" * 32, test_id=None))
    raw = doc.to_json()
    again = QuarantineDocument.from_json(raw)
    assert again == doc and again.to_json() == raw
    data = json.loads(raw)
    assert data["version"] == 1 and list(data["entries"]) == [FP, "cd" * 32]
    assert data["entries"][FP]["quarantined_at"] == "2024-05-01T12:00:00Z"
    assert data["entries"][FP]["issue_url"] == "https://github.com/acme/app/issues/7"
    assert raw.endswith(b"}\n")


def test_find_by_fingerprint_first_then_by_test_id() -> None:
    other = entry("cd" * 32, test_id="tests/test_b.py::test_y")
    doc = QuarantineDocument().with_entry(entry()).with_entry(other)
    assert doc.find({"nothing"}, fingerprint="cd" * 32) == other
    assert doc.find({"tests/test_a.py::test_x"}) == entry()
    assert doc.find({"tests/test_a.py::test_x"}, fingerprint="ef" * 32) == entry()
    assert doc.find({"nothing"}) is None
    assert doc.without("cd" * 32).find({"tests/test_b.py::test_y"}) is None


def test_a_document_from_a_newer_flaketriage_is_refused_but_not_called_damaged() -> None:
    newer = r"has version 2, this flaketriage reads version 1; upgrade"
    with pytest.raises(QuarantineError, match=newer) as e:
        QuarantineDocument.from_json('{"version": 2, "entries": {}}', where="the list")
    assert e.value.damaged is False


def _doc_with(**changes: Any) -> str:
    data = as_json(QuarantineDocument().with_entry(entry()))
    data["entries"][FP].update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("raw", "pattern"),
    [
        ("{nope", "is damaged: it is not valid JSON"),
        ("[]", re.escape('is damaged: expected an object {"version": 1, "entries": {...}}')),
        ('{"entries": {}}', "is damaged: its version is None, expected 1"),
        (_doc_with(surprise=1), f"entries.{FP}.surprise: Extra inputs are not permitted"),
        (_doc_with(occurrences=0), f"entries.{FP}.occurrences: Input should be greater than or equal to 1"),
        (_doc_with(fingerprint="cd" * 32), f"the entry under '{FP}' has fingerprint '{'cd' * 32}'"),
        (_doc_with(quarantined_at="2024-05-01T12:00:00"), f"entries.{FP}.quarantined_at: .*timezone"),
        (_doc_with(evidence={"replays": 3}), rf"{FP}.evidence.reproductions: Field required; .*rate: Field"),
    ],
)
def test_a_bad_document_is_an_error_that_says_what_is_wrong(raw: str, pattern: str) -> None:
    with pytest.raises(QuarantineError, match=f"^the list q.json .*{pattern}") as e:
        QuarantineDocument.from_json(raw, where="the list q.json")
    assert e.value.damaged is True


def test_a_list_written_before_the_model_still_reads() -> None:
    old = {
        "fingerprint": FP,
        "test_id": None,
        "command": "python train.py",
        "bundle_id": "c" * 64,
        "bundles": ["c" * 64],
        "evidence": {"replays": 7, "reproductions": 3, "rate": {"estimate": 0.43, "low": 0.1, "high": 0.82}},
        "reason": "flaky: reproduced 3 of 7 replays",
        "occurrences": 2,
        "quarantined_at": "2024-05-01T12:01:00+00:00",
        "updated_at": "2024-05-01T12:03:00+00:00",
    }
    doc = QuarantineDocument.from_json(json.dumps({"version": 1, "entries": {FP: old}}))
    evidence = doc.entries[FP].evidence
    assert (evidence.verdict, evidence.replays, evidence.passes, evidence.decided) == ("flaky", 7, None, None)
    assert doc.entries[FP].issue_url is None and doc.entries[FP].occurrences == 2


def test_evidence_holds_finite_rates_only() -> None:
    with pytest.raises(ValidationError):
        FailureRate(estimate=float("nan"), low=0.0, high=1.0)
    with pytest.raises(ValidationError):
        FailureRate(estimate=1.5, low=0.0, high=1.0)


def test_the_file_the_workers_write_is_the_list_ci_reads(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    Quarantine(path, clock=lambda: WHEN).add(
        FP,
        test_id="tests/test_a.py::test_x",
        command="python -m pytest tests/test_a.py::test_x",
        bundle_id="c" * 64,
        evidence=EVIDENCE,
        reason="flaky: reproduced 3 of 20 replays",
        issue_url="https://github.com/acme/app/issues/7",
    )
    qlist, notes = load_quarantine(Settings(store=str(tmp_path), quarantine_file=path), tmp_path)
    assert notes == [] and dict(qlist.entries) == {FP: entry()}
