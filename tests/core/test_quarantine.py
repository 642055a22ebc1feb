"""The quarantine document: one model for the workers' file, the service's answer and the CI cache."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from flaketriage.ci.quarantine_list import load_quarantine
from flaketriage.errors import QuarantineError
from flaketriage.quarantine import (
    EntryScope,
    FailureRate,
    QuarantineDocument,
    QuarantineEntry,
    QuarantineEvidence,
    hand_entry,
    hand_fingerprint,
    refreshed_entry,
)
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
        (_doc_with(variant={"GPU": "A100"}), f"entries.{FP}.variant: .*'GPU' is not a variant key"),
        (_doc_with(variant={"gpu": "a,b"}), f"entries.{FP}.variant: .*without ',' or '='"),
        (_doc_with(variant="gpu=A100"), f"entries.{FP}.variant: Input should be a valid dictionary"),
        (_doc_with(signatures=["XYZ"]), f"entries.{FP}.signatures.0: String should match pattern"),
        (_doc_with(signatures=FP), f"entries.{FP}.signatures: Input should be a valid"),
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


# -- variant and signature ---------------------------------------------------------------------------
A100 = {"gpu": "NVIDIA A100", "os": "linux", "python": "3.12"}
CPU = {"gpu": "none", "os": "linux", "python": "3.12"}
OTHER_FP = "ef" * 32


def test_an_entry_limited_to_a_variant_forgives_only_the_runs_it_covers() -> None:
    doc = QuarantineDocument().with_entry(entry(variant={"gpu": "NVIDIA A100"}))
    ids = {"tests/test_a.py::test_x"}
    assert doc.find(ids, FP, variant=A100) == entry(variant={"gpu": "NVIDIA A100"})
    assert doc.find(ids, OTHER_FP, variant=A100) is not None  # by its test: any failure of it
    assert doc.find(ids, FP, variant=CPU) is None
    assert doc.find(ids, FP, variant={"os": "linux"}) is None  # a run that does not say its gpu
    assert doc.find(ids, FP) is None  # a caller that does not know the run's variant
    assert doc.naming(ids, FP) == [entry(variant={"gpu": "NVIDIA A100"})]  # still about it


def test_an_entry_for_every_variant_forgives_every_run_and_an_unknown_one() -> None:
    doc = QuarantineDocument().with_entry(entry())
    ids = {"tests/test_a.py::test_x"}
    assert doc.find(ids, FP, variant=A100) == doc.find(ids, FP, variant=CPU) == doc.find(ids) == entry()


def test_an_entry_with_signatures_forgives_only_those_failures() -> None:
    doc = QuarantineDocument().with_entry(entry(signatures=(FP,)))
    ids = {"tests/test_a.py::test_x"}
    assert doc.find(ids, FP, variant=CPU) is not None
    assert doc.find(ids, OTHER_FP, variant=CPU) is None  # a new way for the test to fail
    assert doc.find(ids, None, variant=CPU) is None  # a failure it cannot tell is the one
    assert doc.find(set(), FP) is not None  # by its fingerprint alone


def test_find_goes_past_an_entry_that_does_not_cover_the_run_to_one_that_does() -> None:
    a100 = entry(variant={"gpu": "NVIDIA A100"})
    cpu = entry("cd" * 32, variant={"gpu": "none"})
    doc = QuarantineDocument().with_entry(a100).with_entry(cpu)
    ids = {"tests/test_a.py::test_x"}
    assert doc.find(ids, FP, variant=A100) == a100
    assert doc.find(ids, FP, variant=CPU) == cpu  # the fingerprint's own entry does not cover it
    assert doc.find(ids, FP, variant={**CPU, "gpu": "NVIDIA H100"}) is None


@pytest.mark.parametrize(
    ("changes", "fingerprint", "variant", "why"),
    [
        (
            {"variant": {"gpu": "NVIDIA A100"}},
            FP,
            CPU,
            "quarantined on gpu=NVIDIA A100 only; this run is gpu=none",
        ),
        (
            {"variant": {"gpu": "NVIDIA A100", "os": "linux"}},
            FP,
            {"os": "macos"},
            "quarantined on gpu=NVIDIA A100,os=linux only; this run is gpu=unknown,os=macos",
        ),
        ({"variant": {"gpu": "NVIDIA A100"}}, FP, None, "only; this run's variant is unknown"),
        (
            {"signatures": (FP,)},
            OTHER_FP,
            CPU,
            f"for the failure {FP[:12]} only; this failure is {OTHER_FP[:12]}",
        ),
        ({"signatures": (FP,)}, None, CPU, f"for the failure {FP[:12]} only; this failure's is unknown"),
        ({"signatures": (FP,), "variant": {"gpu": "none"}}, FP, CPU, None),
    ],
)
def test_a_refusal_says_what_the_entry_covers_and_what_this_run_is(
    changes: dict[str, Any], fingerprint: str | None, variant: dict[str, str] | None, why: str | None
) -> None:
    refusal = entry(**changes).refusal(fingerprint, variant)
    assert refusal == why if why is None else refusal is not None and why in refusal


def test_a_document_without_variant_or_signatures_reads_and_writes_the_same_bytes() -> None:
    # As flaketriage wrote it before entries had a variant or signatures.
    raw = (
        b'{\n  "entries": {\n    "' + FP.encode() + b'": {\n      "bundle_id": "' + b"c" * 64 + b'",\n'
        b'      "bundles": [\n        "' + b"c" * 64 + b'"\n      ],\n'
        b'      "command": "python -m pytest tests/test_a.py::test_x",\n'
        b'      "evidence": {\n        "decided": true,\n        "different": 0,\n        "passes": 17,\n'
        b'        "rate": {\n          "estimate": 0.15,\n          "high": 0.379,\n          "low": 0.032\n'
        b'        },\n        "replays": 20,\n        "reproductions": 3,\n        "verdict": "flaky"\n'
        b'      },\n      "fingerprint": "' + FP.encode() + b'",\n'
        b'      "issue_url": "https://github.com/acme/app/issues/7",\n      "occurrences": 1,\n'
        b'      "quarantined_at": "2024-05-01T12:00:00Z",\n'
        b'      "reason": "flaky: reproduced 3 of 20 replays",\n      "test_id": "tests/test_a.py::test_x",\n'
        b'      "updated_at": "2024-05-01T12:00:00Z"\n    }\n  },\n  "version": 1\n}\n'
    )
    doc = QuarantineDocument.from_json(raw)
    assert doc.entries[FP] == entry()
    assert doc.entries[FP].variant == {} and doc.entries[FP].signatures == ()
    assert doc.to_json() == raw


def test_variant_and_signatures_round_trip() -> None:
    limited = entry(variant={"os": "linux", "gpu": "NVIDIA A100"}, signatures=(FP, OTHER_FP, FP))
    doc = QuarantineDocument().with_entry(limited)
    raw = doc.to_json()
    again = QuarantineDocument.from_json(raw)
    assert again == doc and again.to_json() == raw
    data = json.loads(raw)["entries"][FP]
    assert data["variant"] == {"gpu": "NVIDIA A100", "os": "linux"}
    assert data["signatures"] == [FP, OTHER_FP]  # each once


def _refresh(
    old: QuarantineEntry | None, variant: dict[str, str], signatures: tuple[str, ...]
) -> QuarantineEntry:
    return refreshed_entry(
        old,
        fingerprint=FP,
        test_id="tests/test_a.py::test_x",
        command="python -m pytest tests/test_a.py::test_x",
        bundle_id="d" * 64,
        evidence=EVIDENCE,
        reason="flaky",
        issue_url=None,
        now=WHEN,
        variant=variant,
        signatures=signatures,
    )


def test_a_refresh_widens_an_entry_to_keep_covering_what_it_covered_and_never_narrows_it() -> None:
    first = _refresh(None, {"gpu": "NVIDIA A100"}, (FP,))
    assert (first.variant, first.signatures) == ({"gpu": "NVIDIA A100"}, (FP,))
    same = _refresh(first, {"gpu": "NVIDIA A100"}, (FP,))
    assert (same.variant, same.signatures) == ({"gpu": "NVIDIA A100"}, (FP,))
    # Recurring on an H100: one pattern cannot name both models, so it covers every GPU.
    wider = _refresh(same, {"gpu": "NVIDIA H100"}, (FP,))
    assert wider.variant == {}
    assert _refresh(wider, {"gpu": "NVIDIA A100"}, (FP,)).variant == {}  # and stays so
    assert _refresh(first, {"gpu": "NVIDIA A100"}, ()).signatures == ()  # the setting turned off
    assert _refresh(_refresh(None, {}, ()), {}, (FP,)).signatures == ()  # an old, open entry


def test_the_scope_keeps_the_keys_the_settings_name_and_the_signature_when_asked() -> None:
    scope = EntryScope.from_settings(
        Settings(quarantine_variant_keys="gpu,os", quarantine_match_signature=True)
    )
    assert scope.variant_of({**A100, "shard": "2"}) == {"gpu": "NVIDIA A100", "os": "linux"}
    assert scope.variant_of({"python": "3.12"}) == {}  # nothing known of its keys: every variant
    assert scope.variant_of(None) == {}
    assert scope.signatures_of(FP) == (FP,)
    assert scope.signatures_of(FP, tests=["tests/test_a.py::test_x"]) == ()  # a whole run's
    default = EntryScope.from_settings(Settings())
    assert default == EntryScope() and default.variant_keys == ("gpu",) and not default.match_signature
    assert EntryScope.from_settings(Settings(quarantine_variant_keys="")).variant_of(A100) == {}


def test_the_file_limits_its_entries_to_the_scope(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    scope = EntryScope(variant_keys=("gpu",), match_signature=True)
    Quarantine(path, clock=lambda: WHEN, scope=scope).add(
        FP,
        test_id="tests/test_a.py::test_x",
        command="python -m pytest tests/test_a.py::test_x",
        bundle_id="c" * 64,
        evidence=EVIDENCE,
        reason="flaky: reproduced 3 of 20 replays",
        issue_url="https://github.com/acme/app/issues/7",
        variant=A100,
    )
    qlist, _ = load_quarantine(Settings(store=str(tmp_path), quarantine_file=path), tmp_path)
    assert dict(qlist.entries) == {FP: entry(variant={"gpu": "NVIDIA A100"}, signatures=(FP,))}
    assert qlist.match({"tests/test_a.py::test_x"}, FP, variant=A100) is not None
    assert qlist.match({"tests/test_a.py::test_x"}, FP, variant=CPU) is None
    assert qlist.refused({"tests/test_a.py::test_x"}, FP, variant=CPU) == (
        "quarantined on gpu=NVIDIA A100 only; this run is gpu=none"
    )
    assert qlist.refused({"tests/test_a.py::test_x"}, FP, variant=A100) is None
    assert Quarantine(path).is_quarantined("tests/test_a.py::test_x")  # on some variant


# -- entries made by hand (the dashboard) ---------------------------------------------------------
def test_a_hand_entry_names_its_test_owner_expiry_and_who_made_it() -> None:
    made = hand_entry(
        None,
        test_id="tests/test_a.py::test_x",
        variant={"gpu": "NVIDIA H100"},
        owner="ml-infra",
        expires_at=WHEN + timedelta(days=7),
        by="alice (github)",
        now=WHEN,
    )
    assert made.fingerprint == hand_fingerprint("tests/test_a.py::test_x", {"gpu": "NVIDIA H100"})
    assert re.fullmatch(r"[0-9a-f]{32}", made.fingerprint)
    assert made.fingerprint != hand_fingerprint("tests/test_a.py::test_x", {})
    assert made.by_hand and not entry().by_hand
    assert made.reason == "by hand by alice (github)"
    assert (made.owner, made.expires_at, made.bundle_id, made.occurrences) == (
        "ml-infra", WHEN + timedelta(days=7), "", 1
    )  # fmt: skip
    data = as_json(QuarantineDocument().with_entry(made))["entries"][made.fingerprint]
    assert data["owner"] == "ml-infra" and data["expires_at"] == "2024-05-08T12:00:00Z"
    assert (
        QuarantineDocument.from_json(QuarantineDocument().with_entry(made).to_json()).entries[
            made.fingerprint
        ]
        == made
    )
    again = hand_entry(
        made, test_id=str(made.test_id), variant=made.variant, owner="qa",
        expires_at=WHEN + timedelta(days=1), by="bob (token)", now=WHEN + timedelta(hours=1),
    )  # fmt: skip
    assert (again.fingerprint, again.owner, again.occurrences) == (made.fingerprint, "qa", 2)
    assert again.quarantined_at == WHEN and again.updated_at == WHEN + timedelta(hours=1)


def test_an_entry_without_owner_or_expiry_writes_the_same_bytes_as_before() -> None:
    raw = QuarantineDocument().with_entry(entry()).to_json()
    assert b"owner" not in raw and b"expires_at" not in raw


def test_an_expired_entry_forgives_nothing_and_says_so() -> None:
    expiring = entry(owner="ml-infra", expires_at=WHEN)
    doc = QuarantineDocument().with_entry(expiring)
    before, after = WHEN - timedelta(seconds=1), WHEN
    assert doc.find({"tests/test_a.py::test_x"}, now=before) == expiring
    assert doc.find({"tests/test_a.py::test_x"}, now=after) is None
    assert doc.find({"tests/test_a.py::test_x"}, FP, variant={"gpu": "x"}, now=after) is None
    assert (
        expiring.refusal(None, None, after)
        == "its quarantine (owner ml-infra) expired at 2024-05-01 12:00 UTC"
    )
    assert not entry().expired(WHEN + timedelta(days=10000))
    assert entry(expires_at=datetime(2000, 1, 1, tzinfo=UTC)).expired()  # the present by default


def test_a_refresh_keeps_an_entrys_owner_and_expiry() -> None:
    old = entry(owner="ml-infra", expires_at=WHEN + timedelta(days=3))
    new = refreshed_entry(
        old, fingerprint=FP, test_id=old.test_id, command=old.command, bundle_id="d" * 64,
        evidence=EVIDENCE, reason=old.reason, issue_url=None, now=WHEN + timedelta(days=1),
    )  # fmt: skip
    assert (new.owner, new.expires_at) == ("ml-infra", WHEN + timedelta(days=3))
