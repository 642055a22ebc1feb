"""One collector of findings (`flaketriage.workers.findings`), fed by in-memory replays and by rows."""

from __future__ import annotations

from types import SimpleNamespace

from flaketriage.workers.evidence import findings_of
from flaketriage.workers.findings import Finding, Findings
from flaketriage.workers.verdict import Outcome


def test_findings_count_each_fingerprint_once_in_the_order_first_met_with_the_latest_summary() -> None:
    findings = Findings()
    findings.replay(Outcome.DIFFERENT, "KeyError: 'a'", fingerprint="f1", kind="exception")
    findings.replay(Outcome.ENVIRONMENT, "no such interpreter", fingerprint=None, kind="environment")
    findings.replay(Outcome.REPRODUCED, None, fingerprint=None, kind="exception")
    findings.replay(Outcome.DIFFERENT, "KeyError: 'b'" + "x" * 300, fingerprint="f1", kind="exception")
    found = findings.found()
    assert [(f.fingerprint, f.kind, f.count) for f in found] == [
        ("f1", "exception", 2),
        (found[1].fingerprint, "environment", 1),
    ]
    assert found[0].summary == ("KeyError: 'b'" + "x" * 300)[:200]
    assert found[1].fingerprint.startswith("environment:")


def test_rows_give_the_same_findings_as_the_replays_they_record() -> None:
    rows = [
        SimpleNamespace(outcome="different_failure", summary="KeyError: 'a'", fingerprint="f1"),
        SimpleNamespace(outcome="environment", summary="no such interpreter", fingerprint=None),
        SimpleNamespace(outcome=None, summary=None, fingerprint=None),  # still running
        SimpleNamespace(outcome="different_failure", summary=None, fingerprint=""),  # no fingerprint: nothing
    ]
    live = Findings()
    live.replay(Outcome.DIFFERENT, "KeyError: 'a'", fingerprint="f1", kind="failure")
    live.replay(Outcome.ENVIRONMENT, "no such interpreter", fingerprint=None, kind="environment")
    assert findings_of(rows) == live.found()
    live.add(Finding("seed:pytest-randomly", "seed", "fails under its seed", 3))
    assert live.found()[-1].kind == "seed"
