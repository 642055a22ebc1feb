"""The quarantine document: flaky and order-dependent failures, with their evidence, in one versioned JSON.

``{"version": 1, "entries": {fingerprint: entry}}``, the same bytes wherever it lives: the file the
workers write (`flaketriage.workers.quarantine.file`), the service's ``GET /v1/quarantine`` and the CI
side's cache (`flaketriage.ci.quarantine_list`). Unknown fields are refused and another version is
an error that names it, so a document from a newer flaketriage fails loudly instead of half-read.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from flaketriage.errors import QuarantineError

VERSION = 1

MAX_TESTS = 50
"""The most tests one entry quarantines (`QuarantineEntry.tests`). A whole run that failed more is
quarantined by its first `MAX_TESTS` ids (sorted) and its reason says how many were left out: a
flaky verdict over hundreds of tests says more about the run than about each test, and should not
hide them all from CI."""

FINGERPRINT_PATTERN = r"^[0-9a-f]{16,128}$"
"""A failure fingerprint as reports name it: lowercase hex, 16 characters or more."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FailureRate(_Model):
    """The estimated reproduction rate and its confidence interval, each in [0, 1]."""

    estimate: float = Field(ge=0, le=1)
    low: float = Field(ge=0, le=1)
    high: float = Field(ge=0, le=1)


class QuarantineEvidence(_Model):
    """What the verdict that quarantined the failure saw.

    Lists written before this model kept only replays, reproductions and the rate; the rest is None
    there.
    """

    verdict: str = "flaky"
    decided: bool | None = None
    """The sequential test reached its verdict (False: it stopped at the replay limit)."""
    replays: int = Field(ge=0)
    reproductions: int = Field(ge=0)
    passes: int | None = Field(default=None, ge=0)
    different: int | None = Field(default=None, ge=0)
    """Replays that failed differently: reported as findings, never counted as reproductions."""
    rate: FailureRate


class QuarantineEntry(_Model):
    """One quarantined failure, refreshed on every recurrence."""

    fingerprint: str = Field(pattern=FINGERPRINT_PATTERN)
    test_id: str | None = None
    """The test's node id when the failure is a test: CI matches by it or by the fingerprint."""
    tests: tuple[str, ...] = Field(default=(), exclude_if=lambda value: not value)
    """For a bundle captured as a whole test run (``capture -- pytest tests/``), every test it failed
    (`flaketriage.failure.runner_results`, at most `MAX_TESTS`): CI matches any of them. Left out of
    the document when empty, so a list without one reads as it always did."""
    reason: str
    evidence: QuarantineEvidence
    """Of the latest triage."""
    command: str
    """The command that reruns the failure, shell-quoted."""
    bundle_id: str
    """The latest bundle."""
    bundles: tuple[str, ...] = ()
    """Every bundle of the failure, oldest first."""
    occurrences: int = Field(ge=1)
    issue_url: str | None = None
    """Where people read about it: the issue's URL or the Markdown issue file, when one exists."""
    polluters: tuple[str, ...] = Field(default=(), exclude_if=lambda value: not value)
    """For an ``order_dependent`` test, the tests it fails after when they run first (for one that
    fails alone, the state-setters it needs; for one that fails run twice, itself); the reason says
    which. Left out of the document when empty, so a list without one reads as it always did."""
    quarantined_at: AwareDatetime
    updated_at: AwareDatetime


class QuarantineDocument(_Model):
    """The whole list, keyed by fingerprint."""

    version: Literal[1] = 1
    entries: dict[str, QuarantineEntry] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keyed_by_fingerprint(self) -> QuarantineDocument:
        for key, entry in self.entries.items():
            if key != entry.fingerprint:
                raise ValueError(f"the entry under {key!r} has fingerprint {entry.fingerprint!r}")
        return self

    def find(self, test_ids: Collection[str], fingerprint: str | None = None) -> QuarantineEntry | None:
        """The entry for this failure's fingerprint, else the first one for any of these test ids
        (its test's, or one of the tests of a whole run it quarantines)."""
        if fingerprint is not None and fingerprint in self.entries:
            return self.entries[fingerprint]
        return next(
            (
                e
                for e in self.entries.values()
                if e.test_id in test_ids or any(t in test_ids for t in e.tests)
            ),
            None,
        )

    def with_entry(self, entry: QuarantineEntry) -> QuarantineDocument:
        """This document with `entry` added or replacing the one of its fingerprint."""
        return QuarantineDocument(entries={**self.entries, entry.fingerprint: entry})

    def without(self, fingerprint: str) -> QuarantineDocument:
        return QuarantineDocument(entries={k: e for k, e in self.entries.items() if k != fingerprint})

    def to_json(self) -> bytes:
        """The document as written: sorted keys, two-space indent, UTF-8, a final newline."""
        text = json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True, ensure_ascii=False)
        return (text + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes | str, where: str = "the quarantine document") -> QuarantineDocument:
        """Parse a document; `QuarantineError` says what is wrong with it, naming it by `where`."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise QuarantineError(f"{where} is damaged: it is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise QuarantineError(
                f'{where} is damaged: expected an object {{"version": {VERSION}, "entries": {{...}}}}'
            )
        version = data.get("version")
        if isinstance(version, int) and version > VERSION:
            raise QuarantineError(
                f"{where} has version {version}, this flaketriage reads version {VERSION}; "
                "upgrade flaketriage to read it",
                damaged=False,
            )
        if version != VERSION:
            raise QuarantineError(f"{where} is damaged: its version is {version!r}, expected {VERSION}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise QuarantineError(f"{where} is damaged: {_summary(exc)}") from exc


def _summary(exc: ValidationError, most: int = 3) -> str:
    """The first few problems, one phrase each: ``entries.ab12.reason: Field required``."""
    errors = exc.errors()
    parts = [(".".join(str(p) for p in e["loc"]) or "document") + f": {e['msg']}" for e in errors[:most]]
    more = f" (and {len(errors) - most} more)" if len(errors) > most else ""
    return "; ".join(parts) + more


def refreshed_entry(
    old: QuarantineEntry | None,
    *,
    fingerprint: str,
    test_id: str | None,
    command: str,
    bundle_id: str,
    evidence: QuarantineEvidence,
    reason: str,
    issue_url: str | None,
    now: datetime,
    polluters: Sequence[str] = (),
    tests: Sequence[str] = (),
) -> QuarantineEntry:
    """A new entry, or `old` refreshed: new evidence and reason, the bundle added, one more
    occurrence; `issue_url` None keeps the old link, and the quarantine keeps its first date.
    `polluters` are the latest triage's (an order-dependent test's; none for any other); `tests`
    (a whole run's failing tests) join the old entry's, the latest first, up to `MAX_TESTS`."""
    bundles = old.bundles if old is not None else ()
    return QuarantineEntry(
        fingerprint=fingerprint,
        test_id=test_id,
        reason=reason,
        evidence=evidence,
        command=command,
        bundle_id=bundle_id,
        bundles=bundles if bundle_id in bundles else (*bundles, bundle_id),
        occurrences=(old.occurrences if old is not None else 0) + 1,
        issue_url=issue_url or (old.issue_url if old is not None else None),
        polluters=tuple(polluters),
        tests=tuple(
            sorted(list(dict.fromkeys([*tests, *(old.tests if old is not None else ())]))[:MAX_TESTS])
        ),
        quarantined_at=old.quarantined_at if old is not None else now,
        updated_at=now,
    )
