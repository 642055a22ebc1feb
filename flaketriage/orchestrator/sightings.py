"""Sightings of captured bundles: from our own ``failure.captured`` event, or from a bundle id that a
GitHub check run, issue or Sentry tag names (then its manifest says what failed).

Bundles are read only from the stores the service is configured to read (``allowed_stores``), so a
signed event cannot point a worker at an arbitrary path.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Sequence
from typing import Any

from flaketriage.bundle import load_manifest
from flaketriage.errors import FlaketriageError
from flaketriage.events import FailureEvent
from flaketriage.manifest import Manifest
from flaketriage.orchestrator.intake import Sighting, Trigger, cause_key
from flaketriage.store import open_store, store_url
from flaketriage.titles import clip

BUNDLE_LINE = re.compile(r"^\s*flaketriage-bundle:\s*([0-9a-f]{12,64})\s*$", re.MULTILINE | re.IGNORECASE)
"""How CI output, an issue body or a check run's summary names a bundle: ``flaketriage-bundle: <id>``."""

_GITHUB_REPO = re.compile(r"^https://[^/]+/(?P<repo>[^/]+/[^/]+)/actions/runs/")


class StoreNotAllowed(FlaketriageError):
    """An event names a store the service is not configured to read."""


class StorePolicy:
    """The stores the service may read, by canonical URL; the first is where bare bundle ids live."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self.allowed = [store_url(url) for url in allowed]
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


def bundle_ids(*texts: str | None) -> list[str]:
    """Every ``flaketriage-bundle: <id>`` line in `texts`, in order, without repeats."""
    found: list[str] = []
    for text in texts:
        for match in BUNDLE_LINE.finditer(text or ""):
            ident = match.group(1).lower()
            if ident not in found:
                found.append(ident)
    return found


def resolve_bundles(
    idents: Sequence[str], policy: StorePolicy, *, trigger: Trigger, extra: dict[str, Any]
) -> tuple[list[Sighting], list[str]]:
    """Sightings of the bundles named by id in the default store, and a note for each not found."""
    sightings: list[Sighting] = []
    missing: list[str] = []
    if not idents:
        return sightings, missing
    try:
        store = open_store(policy.default, readonly=True)
    except FlaketriageError as exc:  # not created yet (nothing captured), or unreadable
        return sightings, [f"{ident}: {exc}" for ident in idents]
    for ident in idents:
        try:
            manifest = load_manifest(store, ident)
        except FlaketriageError as exc:
            missing.append(f"{ident}: {exc}")
            continue
        sightings.append(from_manifest(manifest, policy.default, trigger=trigger, extra=extra))
    return sightings, missing
