"""The findings of a triage: the other failures its replays met, and why some could not run.

A finding is reported, never counted as a reproduction. `Findings` collects them from replays as
they end, whichever way the triage ran: in one task (`flaketriage.workers.triage.SequentialReplays`,
from each `ReplayResult`) or as rows of their own on many workers (`flaketriage.workers.evidence`,
from the recorded `ReplayRow`s). One finding per fingerprint, in the order first met, counting the
replays that met it and saying what the latest said.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flaketriage.workers.verdict import Outcome


@dataclass(frozen=True)
class Finding:
    """A different failure seen during replays: reported, never counted as a reproduction."""

    fingerprint: str
    kind: str
    summary: str
    count: int

    def to_json(self) -> dict[str, Any]:
        """A JSON object that `from_json` turns back into an equal finding."""
        return {
            "fingerprint": self.fingerprint,
            "kind": self.kind,
            "summary": self.summary,
            "count": self.count,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """The finding `to_json` wrote."""
        return cls(
            fingerprint=data["fingerprint"], kind=data["kind"], summary=data["summary"], count=data["count"]
        )


class Findings:
    """The findings of one triage's replays, collected as they end."""

    def __init__(self) -> None:
        self._by_fingerprint: dict[str, Finding] = {}

    def replay(
        self, outcome: Outcome | str | None, summary: str | None, *, fingerprint: str | None, kind: str
    ) -> None:
        """One replay's: a replay that could not run (``environment``) with its reason in `summary`,
        or one that failed otherwise (``different``) with the other failure's `fingerprint`, `kind`
        and `summary`; a reproduction or a pass finds nothing."""
        if outcome == Outcome.DIFFERENT and fingerprint is not None:
            self._count(fingerprint, kind, (summary or "")[:200])
        elif outcome == Outcome.ENVIRONMENT and summary:
            key = "environment:" + hashlib.sha256(summary.encode("utf-8")).hexdigest()[:16]
            self._count(key, "environment", summary[:1000])

    def add(self, finding: Finding) -> None:
        """A finding of a question asked after the replays (the seed's), in place of any before."""
        self._by_fingerprint[finding.fingerprint] = finding

    def _count(self, fingerprint: str, kind: str, summary: str) -> None:
        old = self._by_fingerprint.get(fingerprint)
        count = (old.count if old else 0) + 1
        self._by_fingerprint[fingerprint] = Finding(fingerprint, kind, summary, count)

    def found(self) -> list[Finding]:
        """The findings so far, in the order first met."""
        return list(self._by_fingerprint.values())
