"""`MemoryIssueSink`: issues kept in a dictionary, for tests and in-process pipelines."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from flaketriage.workers.report.base import (
    IssueDraft,
    IssueRecord,
    IssueSink,
    ReportRef,
    check_fingerprint,
    utc_now,
)


class MemoryIssueSink(IssueSink):
    """Issues by fingerprint, in memory; thread-safe."""

    kind = "memory"

    def __init__(self, *, clock: Callable[[], datetime] = utc_now) -> None:
        self.issues: dict[str, IssueRecord] = {}
        self._clock = clock
        self._lock = threading.Lock()

    @staticmethod
    def location_for(fingerprint: str) -> str:
        return f"memory:{fingerprint[:16]}"

    def upsert(self, draft: IssueDraft) -> ReportRef:
        fingerprint = check_fingerprint(draft.fingerprint)
        with self._lock:
            existing = self.issues.get(fingerprint)
            now = self._clock()
            record = IssueRecord.new(draft, now) if existing is None else existing.recur(draft, now)
            self.issues[fingerprint] = record
        return ReportRef(kind="memory", location=self.location_for(fingerprint), created=existing is None)

    def close(self, fingerprint: str, comment: str) -> ReportRef | None:
        fingerprint = check_fingerprint(fingerprint)
        with self._lock:
            record = self.issues.get(fingerprint)
            if record is None:
                return None
            if record.state != "closed":
                self.issues[fingerprint] = record.closed(comment, self._clock())
        return ReportRef(kind="memory", location=self.location_for(fingerprint), created=False)

    def find(self, fingerprint: str) -> ReportRef | None:
        if check_fingerprint(fingerprint) not in self.issues:
            return None
        return ReportRef(kind="memory", location=self.location_for(fingerprint), created=False)

    def get(self, fingerprint: str) -> IssueRecord | None:
        return self.issues.get(check_fingerprint(fingerprint))
