"""Garbage collection of a store: mark what the kept bundles reference, sweep the rest.

`collect` is a plain function over any `Store` (the shape of dvc-data's ``gc``): bundles older than
a cut-off that nobody keeps are dropped (their index entry, then their manifest), then every object
no remaining manifest references is deleted, except objects younger than a grace period, so a
capture writing its blobs at the same moment (blobs first, manifest last) never loses one. A dry
run (the default) deletes nothing and says what it would.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from flaketriage.bundle.io import REF_PREFIX, bundle_objects, read_manifest, read_summary
from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import FlaketriageError
from flaketriage.store.base import MAX_MANIFEST_BYTES, Store


@dataclass
class GarbageReport:
    """What a collection found: bundles and objects dropped (or that would be), and what was kept."""

    bundles: list[str] = field(default_factory=list)
    """Bundles dropped: their index entry and manifest."""
    objects: list[str] = field(default_factory=list)
    """Objects no remaining manifest references (the dropped bundles' manifests are not among them)."""
    kept_bundles: int = 0
    kept_objects: int = 0
    skipped_young: int = 0
    applied: bool = False
    swept: bool = True
    """False when some kept bundle's references could not be read: then no object was deleted."""
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "applied": self.applied,
            "bundles": self.bundles,
            "objects": self.objects,
            "kept_bundles": self.kept_bundles,
            "kept_objects": self.kept_objects,
            "skipped_young": self.skipped_young,
            "swept": self.swept,
            "problems": self.problems,
        }


def referenced(manifest: Manifest) -> Iterator[str]:
    """Every object key a manifest names: `bundle_objects` (blobs, the file-list objects and the
    files they list, the manifest itself), and any other SHA-256 in its JSON (annotations); the
    parent is a bundle, not a blob."""
    yield from bundle_objects(manifest)
    yield from _keys(json.loads(manifest.model_dump_json()))


def _keys(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        sha = value.get("sha256")
        if isinstance(sha, str) and len(sha) == 64:
            yield sha
        for item in value.values():
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


def collect(
    store: Store,
    *,
    keep: Collection[str] = (),
    older_than: timedelta | None = None,
    grace: timedelta = timedelta(hours=1),
    apply: bool = False,
    now: datetime | None = None,
) -> GarbageReport:
    """Drop bundles older than `older_than` (None: none) not in `keep`, then unreferenced objects.

    A kept bundle keeps its parent (a minimized bundle's origin) too. A bundle whose index entry
    cannot be dated is kept. When a kept bundle's manifest cannot be read at all (corrupt), its
    references are unknown and no object is deleted: `GarbageReport.problems` says which.
    """
    now = now or datetime.now(UTC)
    result = GarbageReport(applied=apply)
    kept, dropped = _sort_bundles(store, set(keep), older_than, now)
    live = _mark(store, kept, dropped, result)
    result.bundles = sorted(dropped)
    result.kept_bundles = len(kept)
    if apply:
        for bundle_id in result.bundles:  # unlisted first: a reader never sees half a bundle
            store.delete_ref(f"{REF_PREFIX}{bundle_id}")
    for key in list(store.keys()):
        if key in live:
            result.kept_objects += 1
        elif key in dropped:
            if apply:
                store.delete(key)  # a dropped bundle's manifest
        elif result.swept:
            age = store.age(key)
            if age is not None and age < grace:
                result.skipped_young += 1
                continue
            result.objects.append(key)
            if apply:
                store.delete(key)
    return result


def _sort_bundles(
    store: Store, keep: set[str], older_than: timedelta | None, now: datetime
) -> tuple[list[str], set[str]]:
    """The bundles the index lists, split into kept and dropped (old and not in `keep`)."""
    kept: list[str] = []
    dropped: set[str] = set()
    for name in sorted(store.list_refs(REF_PREFIX)):
        bundle_id = name[len(REF_PREFIX) :]
        if len(bundle_id) != 64 or any(c not in "0123456789abcdef" for c in bundle_id):
            continue  # not an entry flaketriage writes; `bundle list` warns about it
        try:
            created = read_summary(store, bundle_id).created_at
        except FlaketriageError:
            created = None  # damaged, or its manifest is missing: never dropped for its age
        old = created is not None and older_than is not None and now - created > older_than
        if old and bundle_id not in keep:
            dropped.add(bundle_id)
        else:
            kept.append(bundle_id)
    return kept, dropped


def _mark(store: Store, kept: list[str], dropped: set[str], result: GarbageReport) -> set[str]:
    """Every object the kept bundles reference (and their manifests); a dropped bundle that is a
    kept one's parent is kept after all."""
    live: set[str] = set()
    queue = list(kept)
    while queue:
        bundle_id = queue.pop()
        live.add(bundle_id)
        found = _references(store, bundle_id)
        if found is None:
            result.swept = False
            result.problems.append(
                f"the manifest of bundle {bundle_id} cannot be read, so the objects it references are "
                "unknown and no object was deleted; `flaketriage bundle verify` says what is wrong: "
                "restore it from a copy, or delete its index entry refs/bundles/<id>"
            )
            continue
        keys, parent = found
        live.update(keys)
        if parent in dropped:
            dropped.discard(parent)
            kept.append(parent)
            queue.append(parent)
    return live


def _references(store: Store, bundle_id: str) -> tuple[set[str], str | None] | None:
    """The keys a bundle's manifest references and its parent; None when the manifest is unreadable.

    A manifest this flaketriage refuses (another schema version, a field it checks) still names its
    blobs in its JSON, which is read as it is rather than lose them.
    """
    if not store.has(bundle_id):
        return set(), None  # listed, but its manifest is gone: it keeps nothing
    try:
        manifest = read_manifest(store, bundle_id)
        return set(referenced(manifest)), manifest.parent
    except FlaketriageError:
        pass
    try:
        data = json.loads(store.get_bytes(bundle_id, max_size=MAX_MANIFEST_BYTES))
        keys = set(_keys(data))
        for listed in _file_lists(data):  # the files it lists are referenced too
            keys.update(_keys(json.loads(store.get_bytes(listed, max_size=MAX_MANIFEST_BYTES))))
    except (FlaketriageError, ValueError, RecursionError):
        return None  # a list that cannot be read: its files are unknown
    parent = data.get("parent") if isinstance(data, dict) else None
    return keys, parent if isinstance(parent, str) else None


def _file_lists(value: object) -> Iterator[str]:
    """The keys of the file-list objects (``file_list`` references) in a manifest's JSON."""
    if isinstance(value, dict):
        ref = value.get("file_list")
        if isinstance(ref, dict) and isinstance(ref.get("sha256"), str):
            yield ref["sha256"]
        for item in value.values():
            yield from _file_lists(item)
    elif isinstance(value, list):
        for item in value:
            yield from _file_lists(item)
