"""The quarantine list: flaky failures marked as such, with the evidence, in one JSON file.

The file is ``{"version": 1, "entries": {fingerprint: entry}}``. Changes are read-modify-write under
an ``fcntl`` lock beside the file and land by atomic rename, so concurrent reporters never lose an
entry; a file that cannot be parsed is reported, never overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from flaketriage.errors import ReportError
from flaketriage.workers.report.base import ReportRef, check_fingerprint, utc_now
from flaketriage.workers.report.markdown import locked, write_atomic
from flaketriage.workers.verdict import VerdictResult

VERSION = 1


def evidence_of(result: VerdictResult) -> dict[str, Any]:
    """The verdict evidence a quarantine entry keeps: counts and the reproduction-rate interval."""
    return {
        "verdict": str(result.verdict),
        "decided": result.decided,
        "replays": result.replays,
        "reproductions": result.reproductions,
        "passes": result.passes,
        "different": result.different,
        "rate": {"estimate": result.rate.estimate, "low": result.rate.low, "high": result.rate.high},
    }


class Quarantine:
    """The quarantine list in the JSON file at `path` (created on the first `add`)."""

    def __init__(self, path: Path | str, *, clock: Callable[[], datetime] = utc_now) -> None:
        self.path = Path(path)
        self._clock = clock

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.lock")

    # -- changes --------------------------------------------------------------------------------
    def add(
        self,
        fingerprint: str,
        *,
        test_id: str | None,
        command: str,
        bundle_id: str,
        verdict_evidence: Mapping[str, Any],
        reason: str,
    ) -> ReportRef:
        """Quarantine a failure, or refresh its entry: new evidence and reason, the bundle added."""
        check_fingerprint(fingerprint)
        evidence = _json_safe(verdict_evidence, fingerprint)
        with self._locked():
            entries = self._load()
            now = self._clock().isoformat()
            entry = entries.get(fingerprint)
            created = entry is None
            if entry is None:
                entry = {"fingerprint": fingerprint, "quarantined_at": now, "bundles": []}
            if bundle_id not in entry["bundles"]:
                entry["bundles"].append(bundle_id)
            entry.update(
                test_id=test_id,
                command=command,
                bundle_id=bundle_id,
                evidence=evidence,
                reason=reason,
                occurrences=int(entry.get("occurrences", 0)) + 1,
                updated_at=now,
            )
            entries[fingerprint] = entry
            self._save(entries)
        return ReportRef(kind="quarantine", location=str(self.path), created=created)

    def remove(self, fingerprint: str) -> bool:
        """Lift a quarantine; False when the fingerprint was not quarantined."""
        with self._locked():
            entries = self._load()
            if entries.pop(fingerprint, None) is None:
                return False
            self._save(entries)
        return True

    # -- queries --------------------------------------------------------------------------------
    def get(self, fingerprint: str) -> dict[str, Any] | None:
        """A copy of the entry for this fingerprint, or None."""
        return self._load().get(fingerprint)

    def entries(self) -> dict[str, dict[str, Any]]:
        """A copy of every entry, by fingerprint."""
        return self._load()

    def is_quarantined(self, test_id_or_fingerprint: str) -> bool:
        """Whether a fingerprint, or a test id of any entry, is quarantined."""
        entries = self._load()
        if test_id_or_fingerprint in entries:
            return True
        return any(e.get("test_id") == test_id_or_fingerprint for e in entries.values())

    # -- the file -------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReportError(
                f"cannot create {self.path.parent} for the quarantine list ({exc.strerror or exc}); set "
                "FLAKETRIAGE_QUARANTINE_FILE to a writable path"
            ) from exc
        with locked(self.lock_path):
            yield

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(
                f"cannot read the quarantine list {self.path} ({exc}); fix its permissions"
            ) from exc
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise self._corrupt(f"it is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise self._corrupt('expected an object {"version": 1, "entries": {...}}')
        if data.get("version") != VERSION:
            raise ReportError(
                f"the quarantine list {self.path} has version {data.get('version')!r}, this flaketriage "
                f"reads version {VERSION}; upgrade flaketriage to change it"
            )
        entries: dict[str, dict[str, Any]] = data["entries"]
        for fingerprint, entry in entries.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("bundles", []), list):
                raise self._corrupt(f"the entry for {fingerprint!r} is not an object with a bundles list")
            entry.setdefault("bundles", [])
        return entries

    def _corrupt(self, why: str) -> ReportError:
        return ReportError(
            f"the quarantine list {self.path} is damaged: {why}. It was left untouched; fix it by "
            "hand, or delete it to start an empty list (every quarantine in it is then lifted)"
        )

    def _save(self, entries: Mapping[str, Any]) -> None:
        doc = {"version": VERSION, "entries": dict(sorted(entries.items()))}
        write_atomic(self.path, json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _json_safe(evidence: Mapping[str, Any], fingerprint: str) -> dict[str, Any]:
    """A deep copy of `evidence` that JSON can hold (finite numbers only, string keys)."""
    try:
        text = json.dumps(dict(evidence), allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ReportError(
            f"the verdict evidence for {fingerprint} cannot be stored as JSON ({exc}); pass plain "
            "numbers and strings, e.g. quarantine.evidence_of(verdict_result)"
        ) from exc
    safe: dict[str, Any] = json.loads(text)  # the round trip also detaches it from the caller's dict
    return safe
