"""The quarantine document: flaky and order-dependent failures, with their evidence, in one versioned JSON.

``{"version": 1, "entries": {fingerprint: entry}}``, the same bytes wherever it lives: the file the
workers write (`flaketriage.workers.quarantine.file`), the service's ``GET /v1/quarantine`` and the CI
side's cache (`flaketriage.ci.quarantine_list`). Unknown fields are refused and another version is
an error that names it, so a document from a newer flaketriage fails loudly instead of half-read.

An entry forgives a failure (`QuarantineDocument.find`) when it names it (its fingerprint, or one of
its tests), its `variant` pattern covers the run's variant, and its `signatures`, when it has any,
hold the failure's fingerprint. Both fields came in version 1 and are left out of the document
while empty, so a list without them reads and writes the same bytes; a flaketriage older than them
refuses a list that sets them (an unknown field), and runs without a quarantine list until it is
upgraded.

An entry made by hand (`hand_entry`: the dashboard's "quarantine by hand") names a test, the
person or team that answers for it (`owner`) and when it ends (`expires_at`); from then on it
forgives nothing (`QuarantineEntry.refusal` says it expired), wherever the document is read, so a
cached copy cannot keep a test quarantined past its expiry. Both fields are left out while None,
as the variant and signatures are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from flaketriage.errors import ConfigError, QuarantineError
from flaketriage.variant import Variant, checked_variant, variant_covers, variant_key

if TYPE_CHECKING:
    from flaketriage.settings import Settings

VERSION = 1

MAX_TESTS = 50
"""The most tests one entry quarantines (`QuarantineEntry.tests`). A whole run that failed more is
quarantined by its first `MAX_TESTS` ids (sorted) and its reason says how many were left out: a
flaky verdict over hundreds of tests says more about the run than about each test, and should not
hide them all from CI."""

FINGERPRINT_PATTERN = r"^[0-9a-f]{16,128}$"
"""A failure fingerprint as reports name it: lowercase hex, 16 characters or more."""

MAX_SIGNATURES = 50
"""The most failure fingerprints one entry forgives (`QuarantineEntry.signatures`)."""

Signature = Annotated[str, StringConstraints(pattern=FINGERPRINT_PATTERN)]

BY_HAND = "by_hand"
"""The evidence verdict of an entry a person made (`hand_entry`): no triage stands behind it."""
MAX_OWNER = 100
"""The longest owner an entry names (a person's or a team's name)."""


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
    variant: dict[str, str] = Field(default_factory=dict, exclude_if=lambda value: not value)
    """The runs it covers, as a pattern (`flaketriage.variant.variant_covers`): a run whose variant
    has every ``key=value`` it gives (``{"gpu": "NVIDIA A100-SXM4-80GB"}``: that GPU model, any OS
    and Python). Empty: every run. Left out of the document when empty."""
    signatures: tuple[Signature, ...] = Field(
        default=(), max_length=MAX_SIGNATURES, exclude_if=lambda value: not value
    )
    """The failures it forgives, by fingerprint: a failure of its tests with any other fingerprint
    is reported as usual. Empty: any failure of its tests. Left out of the document when empty."""
    owner: str | None = Field(default=None, max_length=MAX_OWNER, exclude_if=lambda value: value is None)
    """Who answers for the entry, for one made by hand (`hand_entry`); None for a verdict's. Left out
    of the document when None."""
    expires_at: AwareDatetime | None = Field(default=None, exclude_if=lambda value: value is None)
    """When the entry stops forgiving failures (one made by hand); None: until it is lifted. Left
    out of the document when None."""
    quarantined_at: AwareDatetime
    updated_at: AwareDatetime

    @property
    def by_hand(self) -> bool:
        """Whether a person made the entry (no triage's evidence, no bundle to rerun)."""
        return self.evidence.verdict == BY_HAND

    def expired(self, now: datetime | None = None) -> bool:
        """Whether the entry's expiry has passed at `now` (default: the present)."""
        return self.expires_at is not None and (now or datetime.now(UTC)) >= self.expires_at

    @field_validator("variant", mode="before")
    @classmethod
    def _checked_variant(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            return value  # pydantic says it is not a dictionary
        try:
            return checked_variant(value, "the entry's variant")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("signatures")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(value))

    def names(self, test_ids: Collection[str], fingerprint: str | None = None) -> bool:
        """Whether this entry is about this failure: its fingerprint, its test, or one of the tests
        of a whole run it quarantines. Whether it forgives it is `refusal`'s to say."""
        return (
            (fingerprint is not None and fingerprint == self.fingerprint)
            or self.test_id in test_ids
            or any(t in test_ids for t in self.tests)
        )

    def refusal(
        self, fingerprint: str | None, variant: Mapping[str, str] | None, now: datetime | None = None
    ) -> str | None:
        """Why this entry does not forgive a failure it names, in words for the session summary, or
        None when it does. An expired entry forgives nothing (at `now`, default the present). An
        unknown `variant` (None) is covered by an empty pattern only, an unknown `fingerprint` by an
        entry without signatures only: a quarantine never hides a failure it cannot tell is the
        one it was meant for."""
        if self.expires_at is not None and self.expired(now):
            owner = f" (owner {self.owner})" if self.owner else ""
            return f"its quarantine{owner} expired at {self.expires_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        if self.variant and (variant is None or not variant_covers(self.variant, variant)):
            run = (
                "this run's variant is unknown"
                if variant is None
                else "this run is " + variant_key({k: variant.get(k, "unknown") for k in self.variant})
            )
            return f"quarantined on {variant_key(self.variant)} only; {run}"
        if self.signatures and fingerprint not in self.signatures:
            forgiven = ", ".join(s[:12] for s in self.signatures)
            this = f"this failure is {fingerprint[:12]}" if fingerprint else "this failure's is unknown"
            return f"quarantined for the failure {forgiven} only; {this}"
        return None


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

    def naming(self, test_ids: Collection[str], fingerprint: str | None = None) -> list[QuarantineEntry]:
        """The entries about this failure (`QuarantineEntry.names`): the one of its fingerprint
        first, then those of any of these test ids, in the document's order."""
        first = self.entries.get(fingerprint) if fingerprint is not None else None
        rest = [e for e in self.entries.values() if e is not first and e.names(test_ids)]
        return [first, *rest] if first is not None else rest

    def find(
        self,
        test_ids: Collection[str],
        fingerprint: str | None = None,
        *,
        variant: Mapping[str, str] | None = None,
        now: datetime | None = None,
    ) -> QuarantineEntry | None:
        """The entry that forgives this failure, or None: the first of `naming` that has not
        expired at `now` (default: the present), whose variant pattern covers `variant` (the
        run's) and whose signatures, if it has any, hold `fingerprint`. A caller that does not know
        the run's variant passes None, and only entries for every variant forgive
        (`QuarantineEntry.refusal`)."""
        named = self.naming(test_ids, fingerprint)
        return next((e for e in named if e.refusal(fingerprint, variant, now) is None), None)

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


DEFAULT_VARIANT_KEYS = ("gpu",)
"""``FLAKETRIAGE_QUARANTINE_VARIANT_KEYS``' default."""


@dataclass(frozen=True)
class EntryScope:
    """What a new entry covers, from the settings: the bundle's variant reduced to `variant_keys`
    (``FLAKETRIAGE_QUARANTINE_VARIANT_KEYS``; none: every variant), and the failure's own
    fingerprint only when `match_signature` (``FLAKETRIAGE_QUARANTINE_MATCH_SIGNATURE``)."""

    variant_keys: tuple[str, ...] = DEFAULT_VARIANT_KEYS
    match_signature: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> EntryScope:
        return cls(settings.resolved_quarantine_variant_keys(), settings.quarantine_match_signature)

    def variant_of(self, variant: Mapping[str, str] | None) -> Variant:
        """The pattern of an entry for a failure seen on `variant` (None: not known, every variant):
        its values for `variant_keys`; a key it has no value for is left out, so covers all."""
        given = variant or {}
        return {k: given[k] for k in sorted(self.variant_keys) if k in given}

    def signatures_of(self, fingerprint: str, tests: Sequence[str] = ()) -> tuple[str, ...]:
        """The signatures of an entry for this failure. An entry for a whole run's `tests` has none:
        its fingerprint is the run's, which no one test's failure in CI has."""
        return (fingerprint,) if self.match_signature and not tests else ()


DEFAULT_SCOPE = EntryScope()
"""The settings' defaults: entries limited to the GPU model, forgiving any failure of their tests."""


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
    variant: Mapping[str, str] | None = None,
    signatures: Sequence[str] = (),
) -> QuarantineEntry:
    """A new entry, or `old` refreshed: new evidence and reason, the bundle added, one more
    occurrence; `issue_url` None keeps the old link, and the quarantine keeps its first date.
    `polluters` are the latest triage's (an order-dependent test's; none for any other); `tests`
    (a whole run's failing tests) join the old entry's, the latest first, up to `MAX_TESTS`.

    `variant` (the pattern, `EntryScope.variant_of`) and `signatures` are the latest failure's,
    widened to keep covering what `old` covered: a refresh never narrows an entry. The pattern
    keeps the pairs both give (a failure quarantined on an A100 that recurs on an H100 is then
    quarantined on every GPU: one pattern cannot name two models), and the signatures join the old
    ones, unless either has none (then any failure is forgiven, as before)."""
    if old is not None:
        variant = {k: v for k, v in (variant or {}).items() if old.variant.get(k) == v}
        signatures = () if not old.signatures or not signatures else (*old.signatures, *signatures)
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
        variant=dict(variant or {}),
        signatures=tuple(dict.fromkeys(signatures))[-MAX_SIGNATURES:],
        owner=old.owner if old is not None else None,
        expires_at=old.expires_at if old is not None else None,
        quarantined_at=old.quarantined_at if old is not None else now,
        updated_at=now,
    )


def hand_fingerprint(test_id: str, variant: Mapping[str, str]) -> str:
    """The key of a test's entry made by hand for runs of `variant` (a pattern): one per test and
    pattern, so quarantining it by hand again updates the entry, and never an automatic entry's
    key (those are failures' fingerprints, which this prefix cannot hash to by chance)."""
    text = f"by-hand\0{test_id}\0{variant_key(variant)}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def hand_entry(
    old: QuarantineEntry | None,
    *,
    test_id: str,
    variant: Mapping[str, str],
    owner: str,
    expires_at: datetime,
    by: str,
    now: datetime,
) -> QuarantineEntry:
    """A test quarantined by hand by `by` (who asked) for runs of `variant`, answered for by
    `owner`, until `expires_at`; `old` (the same test and pattern quarantined by hand before) keeps
    its first date and counts one more time. It has no evidence (`BY_HAND`), no bundle and no
    command: no rerun lifts it, its expiry or a person does."""
    return QuarantineEntry(
        fingerprint=hand_fingerprint(test_id, variant),
        test_id=test_id,
        reason=f"by hand by {by}",
        evidence=QuarantineEvidence(
            verdict=BY_HAND, replays=0, reproductions=0, rate=FailureRate(estimate=0, low=0, high=1)
        ),
        command="",
        bundle_id="",
        occurrences=(old.occurrences if old is not None else 0) + 1,
        variant=dict(variant),
        owner=owner,
        expires_at=expires_at,
        quarantined_at=old.quarantined_at if old is not None else now,
        updated_at=now,
    )
