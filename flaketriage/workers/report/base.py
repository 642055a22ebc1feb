"""The `IssueSink` base: one issue per failure fingerprint, created once and updated on recurrence.

An issue's document is the rendered draft plus a header and an "Occurrences" list, with its
bookkeeping (occurrences, bundles, dates, the idempotency keys already counted, open or closed)
kept as JSON in an HTML comment at the top, followed by a one-line fingerprint marker a tracker's
search can find: invisible on GitHub and in rendered Markdown, parsed back on every update, so any
backend that stores text can keep one issue per fingerprint without a database.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, cast, get_args

from flaketriage.errors import ReportError
from flaketriage.files.lock import locked
from flaketriage.quarantine import FINGERPRINT_PATTERN

ReportKind = Literal["markdown", "memory", "quarantine", "github"]

_META_TAG = "flaketriage-issue"
_META_RE = re.compile(r"<!--\s*" + _META_TAG + r"\s+(\{.*?\})\s*-->", re.DOTALL)
_FINGERPRINT_RE = re.compile(FINGERPRINT_PATTERN)
META_VERSION = 1
MARKER_TAG = "flaketriage-fingerprint"
MAX_KEYS = 50
"""Idempotency keys an issue remembers, newest last: a retried report comes back within minutes,
so the latest fifty are plenty, and the metadata comment stays small."""


@dataclass(frozen=True)
class IssueDraft:
    """What a report says about one failure, before a sink files it."""

    fingerprint: str
    title: str
    body: str
    """Markdown: the evidence of this triage, replaced on each update."""
    labels: tuple[str, ...]
    bundle_id: str
    minimal_bundle_id: str | None
    verdict: str
    key: str | None = None
    """Idempotency key (the triage that reported it): a second upsert with a key the issue already
    counted changes nothing, so a retried report task never counts an occurrence twice. None: every
    upsert counts."""
    evidence: str = ""
    """One paragraph (Markdown) with the verdict and its numbers: what a tracker comments when the
    failure comes again."""
    occurrences: int | None = None
    """The times the failure was seen, as the service's case counts them: the issue says that
    number, so the two agree. None (the CLI, no records): each report counts one more."""


def marker(fingerprint: str) -> str:
    """The text of the hidden marker an issue body carries, which a tracker's search finds."""
    return f"{MARKER_TAG}: {fingerprint}"


@dataclass(frozen=True)
class ReportRef:
    """Where a report went; ``created`` is False when an existing one was updated."""

    kind: ReportKind
    location: str
    """A file path or URL."""
    created: bool

    def to_json(self) -> dict[str, Any]:
        """A JSON object that `from_json` turns back into an equal reference."""
        return {"kind": self.kind, "location": self.location, "created": self.created}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReportRef:
        """The reference `to_json` wrote."""
        kind = data["kind"]
        if kind not in get_args(ReportKind):
            raise ValueError(
                f"not a report kind: {kind!r} (expected one of {', '.join(get_args(ReportKind))})"
            )
        return cls(kind=cast(ReportKind, kind), location=data["location"], created=data["created"])


@dataclass(frozen=True)
class IssueRecord:
    """An issue as a sink keeps it: the latest draft plus what accumulated across occurrences."""

    fingerprint: str
    title: str
    body: str
    labels: tuple[str, ...]
    verdict: str
    bundle_id: str
    """The bundle of the latest occurrence."""
    minimal_bundle_id: str | None
    occurrences: int
    bundles: tuple[str, ...]
    """Every bundle reported for this fingerprint, oldest first, each once."""
    created_at: datetime
    updated_at: datetime
    extra: dict[str, Any] = field(default_factory=dict)
    """Metadata keys written by a newer flaketriage (or kept by one backend), carried through unchanged."""
    keys: tuple[str, ...] = ()
    """The idempotency keys of the latest upserts (at most `MAX_KEYS`), oldest first."""
    state: Literal["open", "closed"] = "open"
    note: str | None = None
    """A line shown under the header: why it was closed, or that it was reopened."""

    @classmethod
    def new(cls, draft: IssueDraft, now: datetime) -> IssueRecord:
        return cls(
            fingerprint=draft.fingerprint,
            title=draft.title,
            body=draft.body,
            labels=draft.labels,
            verdict=draft.verdict,
            bundle_id=draft.bundle_id,
            minimal_bundle_id=draft.minimal_bundle_id,
            occurrences=max(draft.occurrences or 1, 1),
            bundles=(draft.bundle_id,),
            created_at=now,
            updated_at=now,
            keys=(draft.key,) if draft.key else (),
        )

    def counted(self, draft: IssueDraft) -> bool:
        """Whether this draft's upsert already happened (its idempotency key is recorded)."""
        return draft.key is not None and draft.key in self.keys

    def recur(self, draft: IssueDraft, now: datetime) -> IssueRecord:
        """This issue after the same failure came again: fresh evidence, history kept."""
        if draft.fingerprint != self.fingerprint:
            raise ReportError(
                f"cannot update the issue for fingerprint {self.fingerprint} with a draft for "
                f"{draft.fingerprint}; each fingerprint has its own issue"
            )
        if self.counted(draft):
            return self
        bundles = self.bundles if draft.bundle_id in self.bundles else (*self.bundles, draft.bundle_id)
        reopened = self.state == "closed"
        return replace(
            self,
            title=draft.title,
            body=draft.body,
            labels=draft.labels,
            verdict=draft.verdict,
            bundle_id=draft.bundle_id,
            minimal_bundle_id=draft.minimal_bundle_id,
            occurrences=max(draft.occurrences, 1) if draft.occurrences is not None else self.occurrences + 1,
            bundles=bundles,
            updated_at=now,
            keys=(*self.keys, draft.key)[-MAX_KEYS:] if draft.key else self.keys,
            state="open",
            note=f"Reopened {_stamp(now)}: the failure came back after the issue was closed."
            if reopened
            else None,
        )

    def closed(self, comment: str, now: datetime) -> IssueRecord:
        """This issue closed with `comment` (its first line is kept as the note)."""
        line = " ".join(next((ln for ln in comment.splitlines() if ln.strip()), "").split())
        line = line if len(line) <= 300 else line[:299] + "…"
        return replace(self, state="closed", note=f"Closed {_stamp(now)}: {line}".rstrip(": "))

    # -- the text form ------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return {
            **self.extra,
            "version": META_VERSION,
            "fingerprint": self.fingerprint,
            "title": self.title,
            "labels": list(self.labels),
            "verdict": self.verdict,
            "bundle_id": self.bundle_id,
            "minimal_bundle_id": self.minimal_bundle_id,
            "occurrences": self.occurrences,
            "bundles": list(self.bundles),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "keys": list(self.keys),
            "state": self.state,
            "note": self.note,
        }

    def body_text(self) -> str:
        """The issue body a tracker shows: metadata comment, header, evidence, occurrences."""
        meta = json.dumps(self.metadata(), sort_keys=True, ensure_ascii=False)
        # "--" may not appear inside an HTML comment; JSON can carry it escaped instead.
        meta = meta.replace("--", "-\\u002d")
        times = "time" if self.occurrences == 1 else "times"
        header = (
            f"> First seen {_stamp(self.created_at)} · last seen {_stamp(self.updated_at)} · "
            f"seen {self.occurrences} {times} · labels: {', '.join(f'`{lb}`' for lb in self.labels)}"
        )
        if self.note:
            header += f"\n>\n> **{self.note}**"
        occurrences = "\n".join(f"{i}. `{b}`" for i, b in enumerate(self.bundles, 1))
        return (
            f"<!-- {_META_TAG} {meta} -->\n<!-- {marker(self.fingerprint)} -->\n{header}\n\n"
            f"{self.body.rstrip()}\n\n## Occurrences\n\n{occurrences}\n"
        )

    @classmethod
    def parse(cls, text: str, where: str) -> IssueRecord:
        """Read an issue back from its text (as written by `body_text`); `where` names it in errors."""
        match = _META_RE.search(text)
        if match is None:
            raise ReportError(
                f"{where} has no flaketriage metadata comment (<!-- {_META_TAG} {{...}} -->), so its "
                "occurrences cannot be updated; restore the comment, or move the issue away to let "
                "flaketriage open a new one"
            )
        try:
            meta = json.loads(match.group(1))
            record = cls._from_metadata(meta)
        except (ValueError, TypeError, KeyError) as exc:
            raise ReportError(
                f"{where} has a damaged flaketriage metadata comment ({exc!r}); fix the JSON in the "
                "comment at the top, or move the issue away to let flaketriage open a new one"
            ) from exc
        body = _between(text, "\n\n", "\n\n## Occurrences\n", start=match.end())
        return replace(record, body=body)

    @classmethod
    def _from_metadata(cls, meta: dict[str, Any]) -> IssueRecord:
        if not isinstance(meta, dict):
            raise TypeError(f"expected a JSON object, got {type(meta).__name__}")
        if meta.get("version", META_VERSION) > META_VERSION:
            raise ValueError(f"metadata version {meta['version']} is newer than {META_VERSION}")
        known = {
            "version", "fingerprint", "title", "labels", "verdict", "bundle_id", "minimal_bundle_id",
            "occurrences", "bundles", "created_at", "updated_at", "keys", "state", "note",
        }  # fmt: skip
        occurrences = meta["occurrences"]
        if not isinstance(occurrences, int) or occurrences < 1:
            raise ValueError(f"occurrences must be a positive integer, got {occurrences!r}")
        bundles = tuple(str(b) for b in meta["bundles"])
        state = meta.get("state", "open")
        if state not in ("open", "closed"):
            raise ValueError(f"state must be open or closed, got {state!r}")
        note = meta.get("note")
        return cls(
            fingerprint=str(meta["fingerprint"]),
            title=str(meta.get("title", "")),
            body="",
            labels=tuple(str(lb) for lb in meta.get("labels", ())),
            verdict=str(meta.get("verdict", "")),
            bundle_id=str(meta.get("bundle_id") or (bundles[-1] if bundles else "")),
            minimal_bundle_id=meta.get("minimal_bundle_id"),
            occurrences=occurrences,
            bundles=bundles,
            created_at=_parse_time(meta["created_at"]),
            updated_at=_parse_time(meta["updated_at"]),
            extra={k: v for k, v in meta.items() if k not in known},
            keys=tuple(str(k) for k in meta.get("keys", ())),
            state=state,
            note=None if note is None else str(note),
        )


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _parse_time(raw: Any) -> datetime:
    when = datetime.fromisoformat(str(raw))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _between(text: str, after: str, before: str, *, start: int) -> str:
    """The text between the first `after` past `start` and the last `before` (else the end)."""
    begin = text.find(after, start)
    begin = len(text) if begin < 0 else begin + len(after)
    end = text.rfind(before)
    return text[begin : end if end >= begin else len(text)].strip("\n")


def check_fingerprint(fingerprint: str) -> str:
    """A fingerprint safe to name a file or search a tracker with: lowercase hex, 16+ characters."""
    if not isinstance(fingerprint, str) or not _FINGERPRINT_RE.match(fingerprint):
        raise ReportError(
            f"{fingerprint!r} is not a failure fingerprint: expected at least 16 lowercase hex "
            "characters (the failure's fingerprint from the bundle manifest)"
        )
    return fingerprint


def utc_now() -> datetime:
    return datetime.now(UTC)


@contextmanager
def report_lock(lock_path: Path, mode: int) -> Iterator[None]:
    """`flaketriage.files.lock.locked` (a lock file created with `mode`, the store's), a lock file that
    cannot be created raising `ReportError`."""
    with ExitStack() as stack:
        try:
            stack.enter_context(locked(lock_path, mode))
        except OSError as exc:
            raise ReportError(
                f"cannot create the lock file {lock_path} ({exc.strerror or exc}); make its directory "
                "writable or point flaketriage at another one"
            ) from exc
        yield


class IssueSink(ABC):
    """Where issues go: one per fingerprint, updated rather than duplicated when a failure recurs."""

    kind: ReportKind

    @abstractmethod
    def upsert(self, draft: IssueDraft) -> ReportRef:
        """Open the issue for ``draft.fingerprint``, or update it: one more occurrence, the draft's
        bundle added to its occurrences (each bundle listed once), its evidence replaced by the
        draft's, its first-seen date kept."""

    @abstractmethod
    def find(self, fingerprint: str) -> ReportRef | None:
        """The issue for this fingerprint, or None when there is none yet."""

    @abstractmethod
    def get(self, fingerprint: str) -> IssueRecord | None:
        """The issue for this fingerprint as the sink keeps it, or None."""

    def check(self) -> None:
        """Fail now (a `ReportError`) when this sink cannot take issues, before hours of replays
        end in a report that cannot be written. Files check nothing: they fail when written."""
        return None

    @abstractmethod
    def close(self, fingerprint: str, comment: str) -> ReportRef | None:
        """Close the issue for this fingerprint with `comment` (Markdown: why, with the evidence),
        as when its quarantine is lifted; None when there is no issue. Closing a closed issue
        changes nothing; a later upsert of the same fingerprint reopens it."""
