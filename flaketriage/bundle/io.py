"""Bundles in a store: write (blobs first, manifest last), resolve ids, load, list and verify.

A manifest is itself a blob whose key is the bundle id, and the ``bundles/<id>`` ref that lists it
is written only after the manifest: a bundle that is listed is complete. Its file lists are objects
of their own, written just before it and read back (verified, bounded) by `read_manifest`, the one
way to load a manifest; `bundle_objects` names every object a bundle needs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime

from flaketriage.bundle.manifest import FileListRef, Manifest
from flaketriage.bundle.safety import manifest_problems
from flaketriage.errors import BundleError, BundleNotFoundError, FlaketriageError, ObjectNotFoundError
from flaketriage.store import Store
from flaketriage.store.base import MAX_MANIFEST_BYTES
from flaketriage.text.os_strings import shell_join

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
            command=shell_join(manifest.command.argv),
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
        # The detail is the status (``exit:1``) or pytest's refusal after it (``exit:4 (pytest
        # usage error): ERROR: not found: ...``): the status is said once, the message after it.
        said = f"exit {f.exit_code}"
        detail = (f.detail or "").removeprefix(f"exit:{f.exit_code}").strip()
        if detail:
            return f"{said} {detail}" if detail.startswith("(") else f"{said}: {detail}"
        return f"{said}: {f.message}" if f.message else said
    return f"{f.kind}: {f.detail or ''}".strip().rstrip(":")


def write_bundle(store: Store, manifest: Manifest) -> str:
    """Write the manifest after checking every blob it names is present; return the bundle id.

    Its file lists are written first (nothing when the store has them: an unchanged workspace
    shares them), then the manifest; the store makes all of it durable (`Store.flush`) before the
    index entry lists the bundle.
    """
    missing = [ref.sha256 for ref in manifest.blobs() if not store.has(ref.sha256)]
    if missing:
        raise BundleError(
            f"refusing to write a manifest that names {len(missing)} blob(s) missing from the store "
            f"(first: {missing[0]}); write the blobs first"
        )
    for _, listed in manifest.file_lists():
        store.put_bytes(listed)
    raw = manifest.canonical_json()
    ref = store.put_bytes(raw)
    store.flush()
    store.put_ref(REF_PREFIX + ref.sha256, index_entry(manifest))
    return ref.sha256


def bundle_objects(manifest: Manifest) -> Iterator[str]:
    """Every object key a bundle needs, each once, in the order a copy must write them: the blobs
    (files, data, logs, checkpoint), the file-list objects that list the files, then the manifest
    itself (its key is the bundle id). `manifest` as `read_manifest` returns it (lists loaded)."""
    seen: set[str] = set()
    keys = [ref.sha256 for ref in manifest.blobs()]
    keys += [ref.sha256 for ref, _ in manifest.file_lists()]
    for key in [*keys, manifest.bundle_id]:
        if key not in seen:
            seen.add(key)
            yield key


def index_entry(manifest: Manifest) -> bytes:
    """The ``bundles/<id>`` ref that lists a bundle: its summary as JSON."""
    return json.dumps(BundleSummary.of(manifest).to_json(), sort_keys=True).encode()


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
    return read_manifest(store, resolve_id(store, ident))


def read_manifest(store: Store, bundle_id: str) -> Manifest:
    """The verified manifest under the full id `bundle_id`, read with the `MAX_MANIFEST_BYTES` cap."""
    try:
        raw = store.get_bytes(
            bundle_id,
            max_size=MAX_MANIFEST_BYTES,
            why=f"{MAX_MANIFEST_BYTES} bytes, the most a manifest may hold (real ones are kilobytes)",
        )
    except ObjectNotFoundError as exc:
        raise BundleNotFoundError(
            f"bundle {bundle_id} is listed but its manifest is missing from {store.location}"
        ) from exc
    where = f"manifest of bundle {bundle_id[:12]}"
    manifest = Manifest.from_json(raw, where=where, load_list=lambda ref: _read_file_list(store, ref, where))
    if manifest.bundle_id != bundle_id:
        raise BundleError(
            f"manifest of bundle {bundle_id[:12]} does not re-encode to its id (got "
            f"{manifest.bundle_id[:12]}); it was written by an incompatible flaketriage"
        )
    return manifest


def _read_file_list(store: Store, ref: FileListRef, where: str) -> bytes:
    """A file-list object's bytes, verified, and never more than the manifest records for it (nor
    `MAX_MANIFEST_BYTES`)."""
    what = f"the file list {ref.sha256[:12]} of {where}"
    if ref.size > MAX_MANIFEST_BYTES:
        raise BundleError(
            f"{what} is recorded with {ref.size} bytes, more than the {MAX_MANIFEST_BYTES} a file list may "
            "hold (real ones are kilobytes to a few megabytes); the bundle is damaged or hostile"
        )
    try:
        raw = store.get_bytes(ref.sha256, max_size=ref.size)
    except ObjectNotFoundError as exc:
        raise BundleError(
            f"{what} is missing from {store.location}, so the bundle's files are unknown; restore the "
            "store from a copy, or re-capture the failure"
        ) from exc
    if len(raw) != ref.size:
        raise BundleError(f"{what} has {len(raw)} bytes, the manifest says {ref.size}; the bundle is damaged")
    return raw


def list_bundles(store: Store) -> list[BundleSummary]:
    """Every bundle in the store, newest first (damaged index entries left out: see `read_index`)."""
    return read_index(store).bundles


@dataclass
class BundleIndex:
    """The store's bundle index: the bundles it lists, newest first, and its damaged entries."""

    bundles: list[BundleSummary] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """One message per entry that cannot be listed (unreadable, or naming a missing manifest)."""


def read_index(store: Store) -> BundleIndex:
    """Every bundle the index lists; an entry that cannot be read never hides the others."""
    index = BundleIndex()
    for name in sorted(store.list_refs(REF_PREFIX)):
        try:
            index.bundles.append(read_summary(store, name[len(REF_PREFIX) :]))
        except FlaketriageError as exc:
            index.problems.append(str(exc))
    index.bundles.sort(key=lambda s: (s.created_at, s.id), reverse=True)
    return index


def read_summary(store: Store, bundle_id: str) -> BundleSummary:
    """The index entry of `bundle_id`; a `BundleError` when it is damaged or its manifest is missing."""
    entry = f"the index entry {REF_PREFIX}{bundle_id}"
    if len(bundle_id) != 64 or any(c not in "0123456789abcdef" for c in bundle_id):
        raise BundleError(
            f"the index entry {REF_PREFIX + bundle_id!r:.120} does not name a bundle (its name is not a "
            f"64-hex id); remove it from the store's refs/{REF_PREFIX} (flaketriage never writes one)"
        )
    if not store.has(bundle_id):
        raise BundleError(
            f"{entry} names a bundle whose manifest is missing from {store.location}; the bundle "
            "cannot be used: restore the store from a copy, or re-capture the failure"
        )
    raw = store.get_ref(REF_PREFIX + bundle_id)
    try:
        summary = _summary(json.loads(raw or b""))
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise BundleError(
            f"{entry} is damaged (not the bundle summary flaketriage writes: {exc!s:.80}); "
            f"`flaketriage bundle verify {bundle_id[:12]}` checks the bundle itself: re-capture the "
            "failure, or restore the store from a copy"
        ) from exc
    if summary.id != bundle_id:
        raise BundleError(
            f"{entry} describes another bundle ({summary.id!r:.20}); the index is damaged: re-capture "
            "the failure, or restore the store from a copy"
        )
    return summary


def _summary(data: object) -> BundleSummary:
    """A summary from its JSON, every field of the type it must have (a ValueError otherwise)."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    text = {"id", "kind", "command", "fingerprint", "failure", "created_at"}
    optional = {"test_id", "parent"}
    if set(data) != text | optional:
        raise ValueError(f"fields {sorted(set(data) ^ (text | optional))} missing or unknown")
    for key in text:
        if not isinstance(data[key], str):
            raise ValueError(f"{key} is not a string")
    for key in optional:
        if data[key] is not None and not isinstance(data[key], str):
            raise ValueError(f"{key} is neither a string nor null")
    return BundleSummary(**{**data, "created_at": datetime.fromisoformat(data["created_at"])})


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
    """Check a bundle: its index entry, its manifest (hash, schema, and what
    `flaketriage.bundle.safety` refuses to restore: paths, commit, command), and every blob it names
    (re-hashed, streamed, never past the size the manifest records).

    An `ident` that names no bundle raises; everything wrong with the bundle itself is a problem.
    """
    bundle_id = resolve_id(store, ident)
    report = VerifyReport(bundle_id=bundle_id)
    summary: BundleSummary | None = None
    try:
        summary = read_summary(store, bundle_id)
    except FlaketriageError as exc:
        report.problems.append(str(exc))
    try:
        manifest = read_manifest(store, bundle_id)
    except FlaketriageError as exc:
        if store.has(bundle_id):  # a missing manifest is already said by the index check
            report.problems.append(str(exc))
        return report
    expected = BundleSummary.of(manifest)
    # Before OsStr arguments, the command was written with shlex.join: either form is this bundle's.
    older = replace(expected, command=shlex.join(manifest.command.argv))
    if summary is not None and summary not in (expected, older):
        report.problems.append(
            f"the index entry {REF_PREFIX}{bundle_id} does not match the bundle's manifest, so "
            "`bundle list` shows something else than the bundle holds; re-capture the failure"
        )
    report.problems += manifest_problems(manifest)
    report.blobs += len(manifest.file_lists())  # read and verified with the manifest
    for ref in manifest.blobs():
        report.blobs += 1
        try:
            size = store.verify(ref.sha256, max_size=ref.size)
        except FlaketriageError as exc:
            report.problems.append(str(exc))
            continue
        report.bytes += size
        if size != ref.size:
            report.problems.append(f"blob {ref.sha256} has {size} bytes, the manifest says {ref.size}")
    return report
