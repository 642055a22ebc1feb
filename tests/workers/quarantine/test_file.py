"""The quarantine list: add, refresh, lift and look up flaky failures in a locked JSON file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import flaketriage
from flaketriage.bundle.manifest import Command, Failure, Manifest
from flaketriage.ci.quarantine_list import describe
from flaketriage.errors import ReportError
from flaketriage.quarantine import FailureRate, QuarantineDocument, QuarantineEvidence
from flaketriage.settings import Settings
from flaketriage.store import MemoryStore
from flaketriage.workers.polluters import PolluterSearch
from flaketriage.workers.quarantine.file import Quarantine, evidence_of
from flaketriage.workers.report import IssueDraft, MemoryIssueSink, ReportRef
from flaketriage.workers.triage import TriageResult, report
from flaketriage.workers.verdict import RateInterval, Verdict, VerdictResult

FP = "ab" * 32
OTHER = "cd" * 32
TEST_ID = "tests/test_model.py::test_grad"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now


def evidence(reproductions: int = 3, replays: int = 7) -> QuarantineEvidence:
    return QuarantineEvidence(
        verdict="flaky",
        decided=True,
        replays=replays,
        reproductions=reproductions,
        passes=replays - reproductions,
        different=0,
        rate=FailureRate(estimate=0.43, low=0.1, high=0.82),
    )


def add(q: Quarantine, bundle: str, fingerprint: str = FP, **overrides: object) -> ReportRef:
    kwargs: dict[str, object] = {
        "test_id": TEST_ID,
        "command": "pytest tests/test_model.py",
        "bundle_id": bundle,
        "evidence": evidence(),
        "reason": "flaky: reproduced 3 of 7",
    }
    kwargs.update(overrides)
    return q.add(fingerprint, **kwargs)  # type: ignore[arg-type]


def test_add_creates_then_refreshes_an_entry(tmp_path: Path) -> None:
    path = tmp_path / "state" / "quarantine.json"
    q = Quarantine(path, clock=Clock())
    assert q.entries() == {} and q.get(FP) is None
    first = q.add(
        FP,
        test_id=TEST_ID,
        command="pytest tests/test_model.py",
        bundle_id="a" * 64,
        evidence=evidence(),
        reason="flaky",
    )
    assert (first.kind, first.location, first.created) == ("quarantine", str(path), True)
    second = add(q, "b" * 64, evidence=evidence(4, 9), reason="flaky again", issue_url="issues/ab.md")
    add(q, "b" * 64)
    assert not second.created
    entry = q.get(FP)
    assert entry is not None
    assert entry.bundles == ("a" * 64, "b" * 64)
    assert entry.bundle_id == "b" * 64
    assert entry.evidence == evidence()
    assert entry.occurrences == 3
    assert entry.issue_url == "issues/ab.md"  # kept by the refresh that knew no link
    assert entry.quarantined_at == datetime(2024, 5, 1, 12, 1, tzinfo=UTC)
    assert entry.updated_at == datetime(2024, 5, 1, 12, 3, tzinfo=UTC)
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and list(doc["entries"]) == [FP]
    assert doc["entries"][FP]["quarantined_at"] == "2024-05-01T12:01:00Z"
    assert sorted(p.name for p in path.parent.iterdir()) == [".quarantine.json.lock", "quarantine.json"]


def test_is_quarantined_by_fingerprint_or_test_id_until_lifted(tmp_path: Path) -> None:
    q = Quarantine(tmp_path / "q.json")
    add(q, "a" * 64)
    add(q, "a" * 64, fingerprint=OTHER, test_id=None, command="python train.py")
    assert q.is_quarantined(FP) and q.is_quarantined(TEST_ID) and q.is_quarantined(OTHER)
    assert not q.is_quarantined("tests/test_model.py::test_other")
    assert q.remove(FP) is True
    assert q.remove(FP) is False
    assert not q.is_quarantined(FP) and not q.is_quarantined(TEST_ID)
    assert list(q.entries()) == [OTHER]


def test_entries_are_copies(tmp_path: Path) -> None:
    q = Quarantine(tmp_path / "q.json")
    add(q, "a" * 64)
    q.entries().pop(FP)
    entry = q.get(FP)
    assert entry is not None and entry.bundles == ("a" * 64,)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected an object"),
        ('{"version": 1, "entries": {"abab": "not an object"}}', "entries.abab: Input should be"),
        ('{"entries": {}}', "its version is None, expected 1"),
    ],
)
def test_a_damaged_file_is_reported_and_left_alone(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "q.json"
    path.write_text(content)
    q = Quarantine(path)
    with pytest.raises(ReportError, match=f"{re.escape(str(path))} is damaged: .*{message}.*delete it"):
        add(q, "a" * 64)
    with pytest.raises(ReportError):
        q.is_quarantined(FP)
    assert path.read_text() == content


def test_a_newer_file_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text('{"version": 2, "entries": {}}')
    with pytest.raises(ReportError, match=r"version 2.*upgrade flaketriage"):
        Quarantine(path).entries()


def test_a_bad_fingerprint_is_refused(tmp_path: Path) -> None:
    q = Quarantine(tmp_path / "q.json")
    with pytest.raises(ReportError, match="not a failure fingerprint"):
        add(q, "a" * 64, fingerprint="nope")
    assert not (tmp_path / "q.json").exists()


def test_evidence_of_a_verdict_result(tmp_path: Path) -> None:
    result = VerdictResult(
        verdict=Verdict.FLAKY,
        decided=True,
        replays=7,
        reproductions=3,
        passes=4,
        different=0,
        rate=RateInterval(estimate=3 / 7, low=0.099, high=0.816),
    )
    q = Quarantine(tmp_path / "q.json")
    add(q, "a" * 64, evidence=evidence_of(result))
    entry = q.get(FP)
    assert entry is not None
    assert json.loads((tmp_path / "q.json").read_text())["entries"][FP]["evidence"] == {
        "verdict": "flaky",
        "decided": True,
        "replays": 7,
        "reproductions": 3,
        "passes": 4,
        "different": 0,
        "rate": {"estimate": 3 / 7, "low": 0.099, "high": 0.816},
    }


_ADDS = """
import sys
from flaketriage.quarantine import FailureRate, QuarantineEvidence
from flaketriage.workers.quarantine.file import Quarantine
q = Quarantine(sys.argv[1])
ev = QuarantineEvidence(verdict="flaky", decided=True, replays=2, reproductions=1, passes=1, different=0,
                        rate=FailureRate(estimate=0.5, low=0.01, high=0.99))
for i in range(int(sys.argv[3])):
    fp = format(int(sys.argv[2]) * 1000 + i, "016x")
    q.add(fp, test_id=None, command="c", bundle_id="b", evidence=ev, reason="r")
    bundle = f"{sys.argv[2]}-{i}"
    q.add("ab" * 32, test_id=None, command="c", bundle_id=bundle, evidence=ev, reason="r")
"""


def test_concurrent_processes_lose_no_entry(tmp_path: Path) -> None:
    root = Path(flaketriage.__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    path = tmp_path / "q.json"
    procs = [
        subprocess.Popen([sys.executable, "-c", _ADDS, str(path), str(n), "10"], env=env) for n in range(4)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    entries = Quarantine(path).entries()
    assert len(entries) == 41
    assert entries[FP].occurrences == 40 and len(entries[FP].bundles) == 40


def test_a_flaky_verdict_links_the_issue_opened_earlier(
    tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    # A test's failure: one with no test identity is reported as an issue at once (test_runner_quarantine).
    failure = Failure(kind="test", test_id=TEST_ID, fingerprint="ab" * 32, signature="pytest|t|Error|")
    manifest = make_manifest(failure=failure)
    fp = manifest.failure.fingerprint
    verdict = VerdictResult(
        verdict=Verdict.FLAKY,
        decided=True,
        replays=20,
        reproductions=3,
        passes=17,
        different=0,
        rate=RateInterval(estimate=0.15, low=0.032, high=0.379),
    )
    result = TriageResult(bundle_id=manifest.bundle_id, verdict=verdict)
    q = Quarantine(tmp_path / "q.json")
    sink = MemoryIssueSink()
    report(MemoryStore(), manifest, result, sink, q)
    first = q.get(fp)
    assert first is not None and first.issue_url is None  # no issue yet: no link
    assert first.evidence == evidence_of(verdict)
    draft = IssueDraft(
        fingerprint=fp,
        title="ZeroDivisionError",
        body="...",
        labels=(),
        bundle_id=manifest.bundle_id,
        minimal_bundle_id=None,
        verdict="deterministic",
    )
    sink.upsert(draft)
    report(MemoryStore(), manifest, result, sink, q)
    linked = q.get(fp)
    assert linked is not None and linked.issue_url == MemoryIssueSink.location_for(fp)
    assert linked.occurrences == 2


# -- order-dependent tests ------------------------------------------------------------------------
VICTIM = "tests/test_cache.py::test_reads_empty"
POLLUTER = "tests/test_warm.py::test_fills_cache"


def _order_dependent(manifest: Manifest, search: PolluterSearch | None) -> TriageResult:
    verdict = VerdictResult(
        verdict=Verdict.ORDER_DEPENDENT,
        decided=True,
        replays=5,
        reproductions=0,
        passes=5,
        different=0,
        rate=RateInterval(estimate=0.0, low=0.0, high=0.522),
    )
    return TriageResult(bundle_id=manifest.bundle_id, verdict=verdict, polluter_search=search)


FOUND = PolluterSearch(
    preceding=8, reproduced_in_order=True, polluters=(POLLUTER,), confirmations=4, confirm_runs=4
)


@pytest.fixture
def victim(make_manifest: Callable[..., Manifest]) -> Manifest:
    return make_manifest(
        command=Command(argv=("python", "-m", "pytest", VICTIM), cwd="/work/project"),
        failure=Failure(kind="test", test_id=VICTIM, fingerprint=FP, signature="AssertionError|test_cache"),
    )


def test_an_order_dependent_victim_is_quarantined_with_its_polluters_named(
    tmp_path: Path, victim: Manifest
) -> None:
    q, sink = Quarantine(tmp_path / "q.json"), MemoryIssueSink()
    ref = report(MemoryStore(), victim, _order_dependent(victim, FOUND), sink, q)
    assert ref is not None and ref.location == MemoryIssueSink.location_for(FP)  # the issue, as before
    entry = q.get(FP)
    assert entry is not None and entry.test_id == VICTIM and entry.polluters == (POLLUTER,)
    assert (
        entry.reason
        == f"order_dependent: passes alone; fails after {POLLUTER} (polluter: it leaves state behind)"
    )
    assert entry.command == f"python -m pytest -p no:randomly {POLLUTER} {VICTIM}"
    assert entry.issue_url == MemoryIssueSink.location_for(FP) and entry.evidence.verdict == "order_dependent"
    # What the pytest plugin shows beside the QUARANTINED test: the polluter, and the issue.
    assert POLLUTER in describe(entry) and MemoryIssueSink.location_for(FP) in describe(entry)


def test_the_team_can_turn_off_quarantining_order_dependent_tests(tmp_path: Path, victim: Manifest) -> None:
    q, sink = Quarantine(tmp_path / "q.json", order_dependent=False), MemoryIssueSink()
    report(MemoryStore(), victim, _order_dependent(victim, FOUND), sink, q)
    assert q.get(FP) is None and sink.find(FP) is not None  # the issue still names the polluters
    assert Settings().quarantine_order_dependent
    assert not Settings(quarantine_order_dependent="false").quarantine_order_dependent  # type: ignore[arg-type]


def test_no_quarantine_without_a_search_and_a_run_twice_test_names_itself(
    tmp_path: Path, victim: Manifest
) -> None:
    q = Quarantine(tmp_path / "q.json")
    report(MemoryStore(), victim, _order_dependent(victim, None), MemoryIssueSink(), q)
    assert q.get(FP) is None
    itself = replace(FOUND, polluters=(VICTIM,), itself=True)
    report(MemoryStore(), victim, _order_dependent(victim, itself), MemoryIssueSink(), q)
    entry = q.get(FP)
    assert entry is not None and "fails when run twice in one process" in entry.reason
    assert entry.command == f"python -m pytest -p no:randomly --count 2 {VICTIM}"


def test_a_list_without_polluters_reads_and_writes_as_before(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    add(Quarantine(path), "b1")
    data = json.loads(path.read_text())
    assert "polluters" not in data["entries"][FP]  # an older flaketriage (the CI side) reads it
    assert QuarantineDocument.from_json(path.read_bytes()).entries[FP].polluters == ()
    add(Quarantine(path), "b2", polluters=[POLLUTER])
    assert json.loads(path.read_text())["entries"][FP]["polluters"] == [POLLUTER]
