"""Copying bundles from one store to another (`copy_bundles`): ``bundle push`` and ``bundle pull``.

Only what the destination lacks is sent, found by one batched existence check. Objects travel as
they are stored (byte for byte, verified on the way), streamed and in parallel threads, so a
checkpoint of any size costs a few buffers of memory. A bundle's manifest is written after all its
blobs and its index entry last: a reader of the destination never lists a bundle whose objects are
missing. A bundle whose copy failed stays unlisted there; what it did send is reused by the next
push, or collected by ``flaketriage gc``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from flaketriage.bundle.io import (
    REF_PREFIX,
    bundle_objects,
    index_entry,
    read_manifest,
    read_summary,
    resolve_id,
)
from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import FlaketriageError, StoreError
from flaketriage.store.base import MAX_MANIFEST_BYTES, Store

DEFAULT_THREADS = 8
"""Objects sent at once."""


@dataclass
class TransferReport:
    """What a copy did: the bundles now listed at the destination, and what it took to get there."""

    source: str
    destination: str
    bundles: list[str] = field(default_factory=list)
    objects_sent: int = 0
    bytes_sent: int = 0
    """Bytes as stored (compressed where the store compressed them)."""
    objects_present: int = 0
    """Objects the destination had already: not sent."""
    refs_written: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "from": self.source,
            "to": self.destination,
            "bundles": self.bundles,
            "objects_sent": self.objects_sent,
            "bytes_sent": self.bytes_sent,
            "objects_present": self.objects_present,
            "refs_written": self.refs_written,
        }


class _Stopped(Exception):
    """Raised inside a copy when the transfer is being interrupted."""


def copy_bundles(
    source: Store,
    dest: Store,
    idents: Iterable[str],
    *,
    parents: bool = False,
    threads: int = DEFAULT_THREADS,
) -> TransferReport:
    """Copy the bundles `idents` (ids or unique prefixes in `source`) to `dest`, with their parents
    (minimized bundles point back to the bundle they came from) when `parents`.

    Raises a `StoreError` naming the bundles that could not be copied, once every other one is
    complete; an interrupt (Ctrl-C) stops the copies in flight and lists nothing new.
    """
    plan = _plan(source, idents, parents)
    report = TransferReport(source=source.location, destination=dest.location)
    sizes: dict[str, int] = {}  # every object but the manifests, and the most it may hold
    for _, manifest in plan:
        for ref in manifest.blobs():
            sizes.setdefault(ref.sha256, ref.size)
        for listed, _ in manifest.file_lists():
            sizes.setdefault(listed.sha256, listed.size)
    manifests = [bundle_id for bundle_id, _ in plan if bundle_id not in sizes]
    wanted = [*sizes, *manifests]
    missing = set(dest.missing(wanted))
    report.objects_present = len(wanted) - len(missing)
    failed: dict[str, BaseException] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def send(key: str, max_size: int) -> None:
        sent = dest.put_stored(key, _until(stop, source.stored_chunks(key, max_size=max_size)))
        with lock:
            report.objects_sent += 1
            report.bytes_sent += sent

    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="flaketriage-transfer")
    try:
        blobs = [(k, sizes[k]) for k in sizes if k in missing]
        failed.update(_run_all(pool, send, blobs))
        complete = [(i, m) for i, m in plan if not any(k in failed for k in bundle_objects(m))]
        heads = [(i, MAX_MANIFEST_BYTES) for i, _ in complete if i in missing and i not in sizes]
        failed.update(_run_all(pool, send, heads))
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)  # each copy in flight stops at its next chunk
        raise
    pool.shutdown(wait=True)
    dest.flush()  # every object durable before an index entry names its bundle
    problems: list[tuple[str, BaseException]] = []
    for bundle_id, manifest in plan:
        error = next((failed[k] for k in bundle_objects(manifest) if k in failed), None)
        if error is not None:
            problems.append((bundle_id, error))
            continue
        if _list(source, dest, bundle_id, manifest):
            report.refs_written += 1
        report.bundles.append(bundle_id)
    if problems:
        bundle_id, error = problems[0]
        raise StoreError(
            f"{len(problems)} of {len(plan)} bundle(s) were not copied to {dest.location} (the others "
            f"were): bundle {bundle_id[:12]}: {error}"
        ) from error
    return report


def _plan(source: Store, idents: Iterable[str], parents: bool) -> list[tuple[str, Manifest]]:
    """The bundles to copy with their verified manifests, each once, a parent before its child."""
    plan: dict[str, Manifest] = {}

    def add(bundle_id: str, chain: Sequence[str]) -> None:
        if bundle_id in plan or bundle_id in chain:
            return
        manifest = read_manifest(source, bundle_id)
        if parents and manifest.parent:
            add(resolve_id(source, manifest.parent), [*chain, bundle_id])
        plan[bundle_id] = manifest

    for ident in idents:
        add(resolve_id(source, ident), [])
    return list(plan.items())


def _run_all(
    pool: ThreadPoolExecutor, work: Callable[[str, int], None], items: list[tuple[str, int]]
) -> dict[str, BaseException]:
    """Run `work` on every (key, size) in the pool; the errors by key. An interrupt propagates."""
    futures: dict[Future[None], str] = {pool.submit(work, key, size): key for key, size in items}
    wait(futures)
    errors: dict[str, BaseException] = {}
    for future, key in futures.items():
        error = future.exception()
        if error is None:
            continue
        if not isinstance(error, FlaketriageError | OSError):
            raise error  # a bug, not a failed copy
        errors[key] = error
    return errors


def _list(source: Store, dest: Store, bundle_id: str, manifest: Manifest) -> bool:
    """Write the index entry of a copied bundle (the source's, or a fresh one when the source's
    is damaged); False when the destination has it already."""
    name = REF_PREFIX + bundle_id
    try:
        read_summary(source, bundle_id)
        entry = source.get_ref(name) or index_entry(manifest)
    except FlaketriageError:
        entry = index_entry(manifest)
    if dest.get_ref(name) == entry:
        return False
    dest.put_ref(name, entry)
    return True


def _until(stop: threading.Event, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """`chunks`, ended by `_Stopped` as soon as `stop` is set (the writer then aborts its write)."""
    for chunk in chunks:
        if stop.is_set():
            raise _Stopped("the transfer was interrupted")
        yield chunk
