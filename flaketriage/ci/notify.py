"""Sending events: the signed ``POST /v1/events`` request, its retries, and the outbox fallback.

Sending never fails a CI job: an event that cannot be delivered waits in the outbox
(`flaketriage.ci.outbox`) and the next send, or ``flaketriage notify --flush``, delivers it. Each
bundle's event is remembered in the store (ref ``events/<bundle id>``), so sending the same bundle
again re-sends the same ``event_id`` and the receiver drops the duplicate.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from flaketriage import __version__
from flaketriage.bundle import list_bundles, load_manifest
from flaketriage.ci.outbox import FlushResult, Outbox
from flaketriage.ci.provenance import detect_provenance
from flaketriage.errors import NotifyError, StoreError
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.manifest import Provenance
from flaketriage.settings import Settings
from flaketriage.signing import signed_headers
from flaketriage.store import Store

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Delivery",
    "FlushResult",
    "Notifier",
    "Outbox",
    "event_for_bundle",
    "known_event",
    "merge_provenance",
    "remember_event",
    "send_event",
    "send_or_queue",
    "unsent_bundles",
]

log = logging.getLogger(__name__)

EVENT_REF = "events/"
MAX_DELAY_S = 30.0
"""Longest single wait between attempts; a Retry-After beyond it ends the retries (the event is queued)."""
HOLD_S = 60.0
"""After the service was unreachable, automatic sends queue without trying for this long."""
_RETRY_STATUSES = frozenset({408, 425, 429})
_NO_CI = (None, "local", "unknown-ci")


def send_event(
    url: str,
    event: FailureEvent,
    secret: bytes,
    *,
    timeout_s: float = 5.0,
    retries: int = 4,
    backoff_s: float = 0.5,
) -> None:
    """POST the signed event; retry connection errors, timeouts, 5xx, 408 and 429 with backoff.

    Waits ``backoff_s * 2**n`` with jitter (or the server's Retry-After) between attempts and
    raises `NotifyError` once `retries` retries are spent, or at once on any other status.
    """
    import httpx  # only when something is sent: a capture that sends nothing never pays for it

    body = event.body()
    failure = NotifyError(f"could not send to {url}")
    retry_after: float | None = None
    tried = 0
    with httpx.Client(timeout=timeout_s, headers={"User-Agent": f"flaketriage/{__version__}"}) as client:
        while tried <= retries:
            if tried:
                time.sleep(max(backoff_delay(tried - 1, backoff_s), retry_after or 0.0))
            tried += 1
            headers = {"Content-Type": "application/json", **signed_headers(secret, body)}
            try:
                response = client.post(url, content=body, headers=headers)
            except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
                raise NotifyError(
                    f"cannot send to {url!r} ({exc}); set FLAKETRIAGE_NOTIFY_URL (or --to) to the "
                    "service's https://host/v1/events"
                ) from exc
            except httpx.TransportError as exc:
                failure = NotifyError(f"could not reach {url}: {type(exc).__name__}: {exc or 'no detail'}")
                retry_after = None
                continue
            if response.is_success:
                return
            failure = _status_error(url, response)
            if response.status_code not in _RETRY_STATUSES and response.status_code < 500:
                raise failure
            retry_after = _retry_after(response.headers.get("Retry-After"))
            if retry_after is not None and retry_after > MAX_DELAY_S:
                break  # the service asked for longer than a CI job should wait: queue instead
    raise NotifyError(f"{failure} (gave up after {tried} attempt(s))", status=failure.status)


def backoff_delay(attempt: int, backoff_s: float, rng: random.Random | None = None) -> float:
    """The wait after failed attempt `attempt` (0-based): exponential, half of it random ("equal
    jitter"), so workers that failed together do not retry together; at most `MAX_DELAY_S`."""
    full = min(MAX_DELAY_S, backoff_s * 2.0**attempt)
    return full / 2 + (rng or random).uniform(0, full / 2)


def _retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    reference = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, float(when.timestamp()) - reference)


def _status_error(url: str, response: httpx.Response) -> NotifyError:
    code = response.status_code
    detail = " ".join(response.text.split())[:200]
    hint = ""
    if code in (401, 403):
        hint = "; the service refused the signature: check that FLAKETRIAGE_WEBHOOK_SECRET matches its secret"
    elif code == 404:
        hint = "; check the URL (the events endpoint is https://host/v1/events)"
    elif 300 <= code < 400:
        hint = f"; it redirects to {response.headers.get('Location')!r}: use that URL"
    elif code in (400, 409, 413, 415, 422):
        hint = "; the service refused this event (a newer service may read it: it stays in the outbox)"
    reason = response.reason_phrase or ""
    text = f"{url} answered HTTP {code} {reason}".rstrip()
    return NotifyError(f"{text}{f': {detail}' if detail else ''}{hint}", status=code)


@dataclass(frozen=True)
class Delivery:
    """What became of one event."""

    bundle_id: str
    event_id: str
    status: Literal["sent", "queued"]
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "bundle": self.bundle_id,
            "event_id": self.event_id,
            "status": self.status,
            "error": self.error,
        }


class Notifier:
    """Sends events to one endpoint with one secret, queueing what cannot be sent in `outbox`."""

    def __init__(
        self,
        url: str,
        secret: bytes | None,
        outbox: Outbox,
        *,
        timeout_s: float = 5.0,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        self.url = url
        self.secret = secret
        self.outbox = outbox
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        url: str | None = None,
        secret: bytes | None = None,
        timeout_s: float = 5.0,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> Notifier:
        """A notifier for the configured URL, secret and outbox; `url` and `secret` override them."""
        if secret is None and settings.webhook_secret is not None:
            secret = settings.webhook_secret.get_secret_value().encode()
        return cls(
            url or settings.notify_url or "",
            secret or None,  # an empty secret (a fork's pull request in GitHub Actions) is no secret
            Outbox(settings.resolved_outbox_dir()),
            timeout_s=timeout_s,
            retries=retries,
            backoff_s=backoff_s,
        )

    def send(self, event: FailureEvent) -> None:
        """Send one event now; raises `NotifyError`."""
        if not self.secret:
            raise NotifyError(
                "no webhook secret to sign events with: set FLAKETRIAGE_WEBHOOK_SECRET (or pass "
                "--secret-env NAME)"
            )
        send_event(
            self.url,
            event,
            self.secret,
            timeout_s=self.timeout_s,
            retries=self.retries,
            backoff_s=self.backoff_s,
        )

    def flush(self) -> FlushResult:
        """Send what the outbox holds, oldest first."""
        result = self.outbox.flush(self.send)
        if result.unreachable:
            self.outbox.hold(HOLD_S)
        elif result.sent:
            self.outbox.release()
        return result

    def deliver(self, event: FailureEvent) -> Delivery:
        """Send `event`, or queue it when that fails."""
        try:
            self.send(event)
        except NotifyError as exc:
            return self.queue(event, str(exc), hold=not exc.event_rejected)
        self.outbox.remove(event.event_id)  # a re-sent event that was also waiting there
        self.outbox.release()
        return Delivery(event.bundle_id, event.event_id, "sent")

    def queue(self, event: FailureEvent, reason: str, *, hold: bool = False) -> Delivery:
        self.outbox.put(event)
        if hold:
            self.outbox.hold(HOLD_S)
        return Delivery(event.bundle_id, event.event_id, "queued", reason)


def send_or_queue(settings: Settings, store: Store, bundle_id: str) -> Literal["sent", "queued", "off"]:
    """Send the bundle's event to ``settings.notify_url`` after flushing the outbox.

    For automatic senders such as the pytest plugin. Delivery problems never raise: an event that
    cannot go now is queued (and logged as a warning), and for a minute after the service was
    unreachable events are queued without trying. ``"off"`` when no URL is configured. Raises
    `FlaketriageError` only when the bundle is not in `store` or the outbox cannot be written.
    """
    if not settings.notify_url:
        return "off"
    notifier = Notifier.from_settings(settings)
    event = event_for_bundle(store, bundle_id)
    if notifier.outbox.held():
        delivery = notifier.queue(event, "the service was unreachable moments ago")
    else:
        flushed = notifier.flush()
        if flushed.unreachable:
            delivery = notifier.queue(event, next(iter(flushed.errors.values())))
        else:
            delivery = notifier.deliver(event)
    remember_event(store, event)
    if delivery.status == "queued":
        log.warning(
            "flaketriage: event for bundle %s queued in %s, the next run sends it: %s",
            bundle_id[:12],
            notifier.outbox.directory,
            delivery.error,
        )
    return delivery.status


# -- one event per bundle and store location ------------------------------------------------------
def event_for_bundle(
    store: Store,
    bundle_id: str,
    *,
    location: StoreLocation | None = None,
    env: Mapping[str, str] | None = None,
) -> FailureEvent:
    """The bundle's event for `location` (default: `store` itself).

    The event already made for this bundle and location when there is one (same ``event_id``, so
    the receiver drops a re-send), else a new one. Provenance is the capture's, or this process's
    CI run when the capture did not see one (a bundle captured inside a container).
    """
    manifest = load_manifest(store, bundle_id)
    where = location or StoreLocation.parse(store.url)
    known = known_event(store, manifest.bundle_id)
    if known is not None and known.store == where:
        return known
    current = detect_provenance(os.environ if env is None else env)
    return FailureEvent.for_manifest(manifest, where, merge_provenance(manifest.provenance, current))


def merge_provenance(recorded: Provenance, current: Provenance) -> Provenance:
    """The capture's provenance, unless only the sender knows the CI run."""
    if recorded.ci_provider in _NO_CI and current.ci_provider not in _NO_CI:
        return current.model_copy(update={"host": recorded.host or current.host})
    return recorded


def known_event(store: Store, bundle_id: str) -> FailureEvent | None:
    raw = store.get_ref(EVENT_REF + bundle_id)
    if raw is None:
        return None
    try:
        return FailureEvent.model_validate_json(raw)
    except ValidationError:
        return None  # written by another flaketriage version: make a new event


def remember_event(store: Store, event: FailureEvent) -> None:
    """Record that `event` was sent or queued for its bundle (best effort: a read-only store skips it)."""
    try:
        store.put_ref(EVENT_REF + event.bundle_id, event.body())
    except StoreError as exc:
        log.debug("could not record event %s in %s: %s", event.event_id, store.location, exc)


def unsent_bundles(store: Store, location: StoreLocation | None = None) -> list[str]:
    """Bundles with no event yet for `location` (default: `store` itself), oldest first."""
    where = location or StoreLocation.parse(store.url)
    out = []
    for summary in reversed(list_bundles(store)):
        known = known_event(store, summary.id)
        if known is None or known.store != where:
            out.append(summary.id)
    return out
