"""Sightings of captured bundles: from our own ``failure.captured`` event, or from a bundle id that a
GitHub check run, issue or Sentry tag names (then its manifest says what failed).

Bundles are read only from the stores the service is configured to read (``allowed_stores``), so a
signed event cannot point a worker at an arbitrary path; a webhook names them by id only (12 to 64 hex
digits, checked before any store is opened), at most ``max_bundles_per_delivery`` different ones per
delivery, and what is said back about them never names a path of the server's.
"""

from __future__ import annotations

import functools
import logging
import re
import shlex
from collections.abc import Sequence
from typing import Any

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import BundleNotFoundError, FlaketriageError, StoreNotAllowed
from flaketriage.events import FailureEvent
from flaketriage.orchestrator.intake import Sighting, Trigger, cause_key
from flaketriage.store import open_store, store_url
from flaketriage.store.base import StoreSettings
from flaketriage.text.titles import clip

BUNDLE_ID = re.compile(r"[0-9a-f]{12,64}")
"""A bundle as a webhook may name it: its id, or a prefix of 12 hex digits or more."""
BUNDLE_LINE = re.compile(
    r"^[ \t]*flaketriage-bundle:[ \t]*([0-9a-f]{12,64})[ \t\r]*$", re.MULTILINE | re.IGNORECASE
)
"""How CI output, an issue body or a check run's summary names a bundle: ``flaketriage-bundle: <id>``,
on one line. Blanks, not ``\\s``: a match that may start on one line and go on over the next tries
every line end after each line start, quadratic in a body of blank lines."""
MAX_BUNDLES = 50
"""The most different bundles one delivery may name (``FLAKETRIAGE_MAX_BUNDLES_PER_DELIVERY``)."""

log = logging.getLogger("flaketriage.receiver")

_GITHUB_REPO = re.compile(r"^https://[^/]+/(?P<repo>[^/]+/[^/]+)/actions/runs/")


class StorePolicy:
    """The stores the service may read, by canonical URL (the first is where bare bundle ids live),
    and how many bundles one delivery may have read there."""

    def __init__(
        self,
        allowed: Sequence[str],
        *,
        max_bundles: int = MAX_BUNDLES,
        settings: StoreSettings | None = None,
    ) -> None:
        self.allowed = [store_url(url) for url in allowed]
        self.max_bundles = max_bundles
        self.settings = settings
        """The service's settings, with which the default store is opened (S3's endpoint)."""
        if not self.allowed:
            raise StoreNotAllowed("no store is allowed: set FLAKETRIAGE_ALLOWED_STORES or FLAKETRIAGE_STORE")
        # Every event names its store: the answer for the few locations senders use is kept (a
        # canonical URL costs path parsing, a look at the working directory, a URI).
        self._checked = functools.lru_cache(maxsize=256)(self._check)

    @property
    def default(self) -> str:
        return self.allowed[0]

    def check(self, url: str) -> str:
        """The canonical URL of `url` if the service may read it; `StoreNotAllowed` otherwise."""
        return self._checked(url)

    def _check(self, url: str) -> str:
        try:
            canonical = store_url(url)
        except FlaketriageError as exc:
            raise StoreNotAllowed(f"store {url!r} is not a store URL: {exc}") from exc
        if canonical not in self.allowed:
            raise StoreNotAllowed(
                f"store {url!r} is not one this service reads; allowed: {', '.join(self.allowed)} "
                "(FLAKETRIAGE_ALLOWED_STORES)"
            )
        return canonical


def repository_of(run_url: str | None) -> str | None:
    match = _GITHUB_REPO.match(run_url or "")
    return match.group("repo") if match else None


def title_of(
    test_id: str | None, command: Sequence[str], kind: str, exc_type: str | None, msg: str | None
) -> str:
    what = test_id or clip(shlex.join(command), 120) or "a run"
    why = exc_type or kind
    message = (msg or "").strip().splitlines()
    # Cut at a word: the case's bundle and its report hold the whole message.
    return f"{what}: {why}" + (f": {clip(message[0].strip(), 160)}" if message else "")


def from_event(event: FailureEvent, policy: StorePolicy) -> Sighting:
    """The sighting an event reports; `StoreNotAllowed` when its store is not one the service reads."""
    # The location, not `event.store.url`: a path no file system could hold is refused by `check`.
    url = policy.check(event.store.location)
    failure = event.failure
    return Sighting(
        fingerprint=event.fingerprint,
        identity=event.identity,
        kind="bundle",
        title=title_of(failure.test_id, event.command, failure.kind, failure.exception_type, failure.message),
        cause_key=cause_key(failure.kind, failure.exception_type, failure.message),
        test_id=failure.test_id,
        job=event.provenance.job,
        repository=repository_of(event.provenance.run_url),
        bundle_id=event.bundle_id,
        store_url=url,
        provenance=event.provenance.model_dump(mode="json", exclude_none=True),
    )


def from_manifest(manifest: Manifest, url: str, *, trigger: Trigger, extra: dict[str, Any]) -> Sighting:
    f = manifest.failure
    provenance = manifest.provenance.model_dump(mode="json", exclude_none=True) | extra
    return Sighting(
        fingerprint=f.fingerprint,
        identity=f.identity,
        kind="bundle",
        title=title_of(f.test_id, manifest.command.argv, f.kind, f.exception_type, f.message),
        cause_key=cause_key(f.kind, f.exception_type, f.message),
        test_id=f.test_id,
        job=manifest.provenance.job,
        repository=repository_of(manifest.provenance.run_url),
        bundle_id=manifest.bundle_id,
        store_url=url,
        provenance=provenance,
        trigger=trigger,
    )


def is_bundle_id(text: str) -> bool:
    """Whether `text` names a bundle as a webhook may (`BUNDLE_ID`, lower case)."""
    return BUNDLE_ID.fullmatch(text) is not None


def bundle_ids(*texts: str | None) -> list[str]:
    """Every ``flaketriage-bundle: <id>`` line in `texts`, in order, without repeats."""
    found = (match.group(1).lower() for text in texts for match in BUNDLE_LINE.finditer(text or ""))
    return list(dict.fromkeys(found))


def resolve_bundles(
    idents: Sequence[str], policy: StorePolicy, *, trigger: Trigger, extra: dict[str, Any]
) -> tuple[list[Sighting], list[str]]:
    """Sightings of the bundles named by id in the default store, the first `policy.max_bundles`
    different ones, and notes: one for each that is not there, and one counting those left out.

    The notes go back to whoever sent the delivery: they name the id, never the store's path (the
    receiver's log has the whole error)."""
    different = list(dict.fromkeys(idents))
    named = [ident for ident in different if is_bundle_id(ident)]
    taken = named[: policy.max_bundles]
    sightings, notes = _read_bundles(taken, policy, trigger=trigger, extra=extra)
    if len(different) > len(named):  # never a path: checked before any store is opened
        notes.append(f"{len(different) - len(named)} named are not bundle ids (12 to 64 hex digits)")
    if len(named) > len(taken):
        notes.append(
            f"{len(named) - len(taken)} more bundles named were left out: one delivery may name at "
            f"most {policy.max_bundles} (FLAKETRIAGE_MAX_BUNDLES_PER_DELIVERY); name them in another"
        )
    return sightings, notes


def _read_bundles(
    idents: Sequence[str], policy: StorePolicy, *, trigger: Trigger, extra: dict[str, Any]
) -> tuple[list[Sighting], list[str]]:
    if not idents:
        return [], []
    try:
        store = open_store(policy.default, readonly=True, settings=policy.settings)
    except FlaketriageError as exc:  # not created yet (nothing captured), or unreadable
        log.warning("the store %s cannot be read: %s", policy.default, exc)
        return [], [
            f"{ident}: the service's store cannot be read (nothing captured yet?)" for ident in idents
        ]
    sightings: list[Sighting] = []
    notes: list[str] = []
    for ident in idents:
        try:
            manifest = load_manifest(store, ident)
        except BundleNotFoundError:
            notes.append(f"{ident}: no such bundle in the service's store (FLAKETRIAGE_STORE); push it there")
            continue
        except FlaketriageError as exc:
            log.warning("bundle %s in %s cannot be read: %s", ident, policy.default, exc)
            notes.append(f"{ident}: the bundle cannot be read from the service's store; its log says why")
            continue
        sightings.append(from_manifest(manifest, policy.default, trigger=trigger, extra=extra))
    return sightings, notes
