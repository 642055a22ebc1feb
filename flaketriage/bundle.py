"""Bundles in a store: write (blobs first, manifest last), resolve ids, load, list and verify.

A manifest is itself a blob whose key is the bundle id, and the ``bundles/<id>`` ref that lists it
is written only after the manifest: a bundle that is listed is complete.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime

from flaketriage.errors import BundleError, BundleNotFoundError, FlaketriageError, ObjectNotFoundError
from flaketriage.manifest import Manifest
from flaketriage.store import Store

REF_PREFIX = "bundles/"


@dataclass(frozen=True)
class BundleSummary:
    """One line of ``bundle list``: enough to choose a bundle without loading its manifest."""

    id: str
    created_at: datetime
    kind: str
    command: str
    test_id: str | None
    fingerprint: str
    failure: str
    parent: str | None

    @classmethod
    def of(cls, manifest: Manifest) -> BundleSummary:
        return cls(
            id=manifest.bundle_id,
            created_at=manifest.created_at,
            kind=manifest.kind,
            command=shlex.join(manifest.command.argv),
            test_id=manifest.failure.test_id,
            fingerprint=manifest.failure.fingerprint,
            failure=describe_failure(manifest),
            parent=manifest.parent,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "created_at": self.created_at.isoformat(),
            "kind": self.kind,
            "command": self.command,
            "test_id": self.test_id,
            "fingerprint": self.fingerprint,
            "failure": self.failure,
            "parent": self.parent,
        }


def describe_failure(manifest: Manifest) -> str:
    """A one-line description of how the run failed."""
    f = manifest.failure
    if f.exception_type:
        return f"{f.exception_type}: {f.message or ''}".strip().rstrip(":")
    if f.kind == "signal":
        return f"killed by {f.signal}"
    if f.kind == "exit":
        return f"exit {f.exit_code}" + (f": {f.detail}" if f.detail else "")
    return f"{f.kind}: {f.detail or ''}".strip().rstrip(":")


def write_bundle(store: Store, manifest: Manifest) -> str:
    """Write the manifest after checking every blob it names is present; return the bundle id."""
    missing = [ref.sha256 for ref in manifest.blobs() if not store.has(ref.sha256)]
    if missing:
        raise BundleError(
            f"refusing to write a manifest that names {len(missing)} blob(s) missing from the store "
            f"(first: {missing[0]}); write the blobs first"
        )
    raw = manifest.canonical_json()
    ref = store.put_bytes(raw)
    summary = BundleSummary.of(manifest).to_json()
    store.put_ref(REF_PREFIX + ref.sha256, json.dumps(summary, sort_keys=True).encode())
    return ref.sha256


def resolve_id(store: Store, ident: str) -> str:
    """The full id of the bundle named by `ident` (a full id or a unique prefix of at least 4)."""
    ident = ident.strip().lower()
    if len(ident) == 64 and store.get_ref(REF_PREFIX + ident) is not None:
        return ident
    if len(ident) < 4 or any(c not in "0123456789abcdef" for c in ident):
        raise BundleNotFoundError(
            f"{ident!r} is not a bundle id: give the 64-hex id or a prefix of at least 4 hex "
            "characters (see `flaketriage bundle list`)"
        )
    matches = [name[len(REF_PREFIX) :] for name in store.list_refs(REF_PREFIX)]
    matches = [m for m in matches if m.startswith(ident)]
    if not matches:
        raise BundleNotFoundError(
            f"no bundle {ident} in the store at {store.location}; `flaketriage bundle list` shows "
            "what is there (or pass --store)"
        )
    if len(matches) > 1:
        raise BundleError(f"{ident} matches {len(matches)} bundles; give more characters of the id")
    return matches[0]


def load_manifest(store: Store, ident: str) -> Manifest:
    """The verified manifest of a bundle (its bytes must hash to the bundle id)."""
    bundle_id = resolve_id(store, ident)
    try:
        raw = store.get_bytes(bundle_id)
    except ObjectNotFoundError as exc:
        raise BundleNotFoundError(
            f"bundle {bundle_id} is listed but its manifest is missing from {store.location}"
        ) from exc
    manifest = Manifest.from_json(raw, where=f"manifest of bundle {bundle_id[:12]}")
    if manifest.bundle_id != bundle_id:
        raise BundleError(
            f"manifest of bundle {bundle_id[:12]} does not re-encode to its id (got "
            f"{manifest.bundle_id[:12]}); it was written by an incompatible flaketriage"
        )
    return manifest


def list_bundles(store: Store) -> list[BundleSummary]:
    """Every bundle in the store, newest first."""
    out: list[BundleSummary] = []
    for name in store.list_refs(REF_PREFIX):
        raw = store.get_ref(name)
        if raw is None:
            continue
        try:
            data = json.loads(raw)
            data["created_at"] = datetime.fromisoformat(data["created_at"])
            out.append(BundleSummary(**data))
        except (ValueError, TypeError, KeyError):
            continue  # an unreadable index entry never hides the others; `verify` reports it
    out.sort(key=lambda s: (s.created_at, s.id), reverse=True)
    return out


@dataclass
class VerifyReport:
    """What `verify_bundle` checked and what it found wrong."""

    bundle_id: str
    blobs: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_bundle(store: Store, ident: str) -> VerifyReport:
    """Re-hash the manifest and every blob it names."""
    manifest = load_manifest(store, ident)
    report = VerifyReport(bundle_id=manifest.bundle_id)
    for ref in manifest.blobs():
        report.blobs += 1
        try:
            data = store.get_bytes(ref.sha256)
        except FlaketriageError as exc:
            report.problems.append(str(exc))
            continue
        report.bytes += len(data)
        if len(data) != ref.size:
            report.problems.append(f"blob {ref.sha256} has {len(data)} bytes, the manifest says {ref.size}")
    return report
