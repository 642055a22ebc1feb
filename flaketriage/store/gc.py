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

from flaketriage.bundle import REF_PREFIX, read_index, read_manifest
from flaketriage.errors import FlaketriageError
from flaketriage.manifest import Manifest
from flaketriage.store.base import Store


@dataclass
class GarbageReport:
    """What a collection found: bundles and objects dropped (or that would be), and what was kept."""

    bundles: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    kept_bundles: int = 0
    kept_objects: int = 0
    skipped_young: int = 0
    applied: bool = False


def referenced(manifest: Manifest) -> Iterator[str]:
    """Every object key a manifest names (blobs, files, data, the parent is a bundle, not a blob)."""
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
    """Drop bundles older than `older_than` (None: none) not in `keep`, then unreferenced objects."""
    now = now or datetime.now(UTC)
    result = GarbageReport(applied=apply)
    index = read_index(store)
    live: set[str] = set()
    manifests: set[str] = set()
    for summary in index.bundles:
        bundle_id = summary.id
        manifests.add(bundle_id)
        old = older_than is not None and now - summary.created_at > older_than
        if old and bundle_id not in keep:
            result.bundles.append(bundle_id)
            continue
        try:
            live.update(referenced(read_manifest(store, bundle_id)))
        except FlaketriageError:
            continue  # a damaged bundle keeps its objects until someone looks at it
        live.add(bundle_id)
        result.kept_bundles += 1
    if apply:
        for bundle_id in result.bundles:
            store.delete_ref(f"{REF_PREFIX}{bundle_id}")
            store.delete(bundle_id)
    for key in list(store.keys()):
        if key in live:
            result.kept_objects += 1
            continue
        if key in manifests and key not in result.bundles:
            continue  # a manifest whose bundle is kept (its own key is the bundle id)
        age = store.age(key)
        if age is not None and age < grace:
            result.skipped_young += 1
            continue
        result.objects.append(key)
        if apply:
            store.delete(key)
    return result
