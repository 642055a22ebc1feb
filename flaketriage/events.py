"""Event messages: what a CI job sends to the service at ``POST /v1/events``.

This is the contract between `flaketriage.ci` (the sender) and the orchestrator (the receiver):
small, versioned by ``schema_version``, unknown fields refused. The body on the wire is the
event's canonical JSON (sorted keys, no spaces, UTF-8), signed with `flaketriage.signing`. The
receiver drops a delivery whose ``event_id`` it has already seen, so a sender may retry freely.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flaketriage.bundle.manifest import Failure, Manifest, Provenance
from flaketriage.errors import ConfigError
from flaketriage.store import Store, local_path, open_store, store_url
from flaketriage.store.base import StoreSettings
from flaketriage.text.os_strings import OsStr

EVENTS_SCHEMA_VERSION = 1
MAX_MESSAGE_CHARS = 1_000
"""A summary's message is cut to this; the bundle keeps the whole one."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreLocation(_Model):
    """Where the receiver finds the bundle: a store directory (``location`` is its absolute path),
    a ``memory://name`` store in the receiver's own process, or an ``s3://bucket/prefix``."""

    kind: Literal["local", "memory", "s3"]
    location: str = Field(min_length=1)

    @model_validator(mode="after")
    def _location_fits_kind(self) -> StoreLocation:
        fits = (
            Path(self.location).is_absolute()
            if self.kind == "local"
            else self.location.startswith(f"{self.kind}://")
        )
        if not fits:
            want = "an absolute path" if self.kind == "local" else f"a {self.kind}:// URL"
            raise ValueError(f"a {self.kind} store's location must be {want}, not {self.location!r}")
        return self

    @classmethod
    def parse(cls, text: str | Path) -> StoreLocation:
        """A store location as `open_store` reads it (a path, made absolute, or a URL); raises
        `ConfigError` for a scheme no store backend reads."""
        url = store_url(text)
        path = local_path(url)
        if path is not None:
            return cls(kind="local", location=str(path))
        scheme = url.partition("://")[0]
        if scheme not in ("memory", "s3"):
            raise ConfigError(
                f"an event cannot name the store {url}: events carry paths, memory:// and s3://"
            )
        return cls(kind="memory" if scheme == "memory" else "s3", location=url)

    @property
    def url(self) -> str:
        """The store's canonical URL, as `flaketriage.store.open_store` takes it."""
        return store_url(self.location)

    def open(self, readonly: bool = True, *, settings: StoreSettings | None = None) -> Store:
        """The store the bundle is in (read-only unless asked), through `open_store` with the
        caller's `settings`."""
        return open_store(self.url, readonly=readonly, settings=settings)


class FailureSummary(_Model):
    """Enough of the failure to title a case before the bundle is fetched."""

    kind: Literal["exception", "exit", "signal", "pattern", "metric", "timeout", "test"]
    exception_type: str | None = None
    message: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    test_id: str | None = None

    @classmethod
    def of(cls, failure: Failure) -> FailureSummary:
        message = failure.message
        if message is not None and len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        return cls(
            kind=failure.kind,
            exception_type=failure.exception_type,
            message=message,
            test_id=failure.test_id,
        )


class FailureEvent(_Model):
    """A failure was captured into a bundle: ``kind = "failure.captured"``."""

    schema_version: Literal[1] = 1
    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex, pattern=r"^[0-9a-f]{32}$")
    """Unique per event (uuid4 hex); the receiver dedupes deliveries by it."""
    kind: Literal["failure.captured"] = "failure.captured"
    bundle_id: str = Field(pattern=r"^[0-9a-f]{64}$")
    fingerprint: str = Field(min_length=1, max_length=128)
    """What the bundle's replays are matched against."""
    identity: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The key of the failure's case where it is not `fingerprint` (`Failure.identity`: a pytest
    test's exception through its code path). Left out of the body while None, so an event without
    one is the same bytes an earlier release sent and read."""
    failure: FailureSummary
    command: tuple[OsStr, ...]
    """The command that reruns the failure (argv, secrets already redacted by the capture)."""
    store: StoreLocation
    provenance: Provenance
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    """When the event was made (UTC); the bundle's manifest says when the failure was captured."""

    @classmethod
    def for_manifest(
        cls, manifest: Manifest, store: StoreLocation, provenance: Provenance | None = None
    ) -> FailureEvent:
        """A new event (fresh ``event_id``) for a bundle in `store`; provenance defaults to the manifest's."""
        return cls(
            bundle_id=manifest.bundle_id,
            fingerprint=manifest.failure.fingerprint,
            identity=manifest.failure.identity,
            failure=FailureSummary.of(manifest.failure),
            command=manifest.command.argv,
            store=store,
            provenance=provenance or manifest.provenance,
        )

    def body(self) -> bytes:
        """The request body: canonical JSON (sorted keys, no whitespace, UTF-8)."""
        data = self.model_dump(mode="json")
        if data["identity"] is None:
            del data["identity"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @property
    def case_identity(self) -> str:
        """The key of the failure's case: `identity`, else `fingerprint`."""
        return self.identity or self.fingerprint
