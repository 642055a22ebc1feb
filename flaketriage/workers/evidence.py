"""What a triage's recorded replays say, when they ran as rows of their own on many workers
(`flaketriage.workers.pipeline`): the findings, where they hung, and what they cost.

The rows are `ReplayRow`s (or anything with their columns), in replay order; a row still running
(no outcome yet) says nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from flaketriage.workers.cost import PhaseCost, TriageCost
from flaketriage.workers.findings import Finding, Findings
from flaketriage.workers.verdict import Outcome


def findings_of(rows: Iterable[Any]) -> list[Finding]:
    """The findings of the rows (`Findings`): a row records a different failure's fingerprint and
    summary but not its kind, so it is a ``failure``."""
    findings = Findings()
    for row in rows:
        findings.replay(row.outcome, row.summary, fingerprint=row.fingerprint or None, kind="failure")
    return findings.found()


def hang_of(rows: Sequence[Any]) -> str | None:
    """Where the replays hung, from the rows' summaries: a reproduction's first, else any's."""
    hung = [r for r in rows if r.summary and r.outcome in (Outcome.REPRODUCED, Outcome.DIFFERENT)]
    hung = [r for r in hung if r.outcome == Outcome.REPRODUCED] or hung
    return hung[0].summary if hung and hung[0].fingerprint else None


def cost_of(rows: Iterable[Any], *, gpus: int, budget_s: float | None) -> TriageCost:
    """What the finished replays of a triage cost, on `gpus` GPUs, against `budget_s`
    (``FLAKETRIAGE_TRIAGE_BUDGET_S``)."""
    verdict = PhaseCost()
    for row in rows:
        if row.outcome is None or row.outcome == Outcome.ENVIRONMENT:
            continue  # still running, or nothing ran
        verdict.runs += 1
        verdict.cpu_s += row.cpu_s or 0.0
        verdict.gpu_s += row.gpu_s or 0.0
        verdict.wall_s += row.duration_s or 0.0
        verdict.unmeasured += row.cpu_s is None
    return TriageCost(phases={**TriageCost().phases, "verdict": verdict}, gpus=gpus, budget_s=budget_s)
