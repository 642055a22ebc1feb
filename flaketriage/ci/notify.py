"""Sending events: the signed ``POST /v1/events`` request, its retries, and the outbox fallback.

Sending never fails a CI job. An event that cannot be delivered yet (the service is down, times
out, answers 5xx, 408 or 429) waits in the outbox (`flaketriage.ci.outbox`) and the next send, or
``flaketriage notify --flush``, delivers it. One that never will as things are set up (any other
4xx: a wrong URL, a signature made with another secret, a store the service does not read; or no
secret to sign with) is an `EventRefusedError` naming the setting to change, and is not queued. Each
bundle's event is remembered in the store (ref ``events/<bundle id>``), so sending the same bundle
again re-sends the same ``event_id`` and the receiver drops the duplicate.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from flaketriage import __version__
from flaketriage.bundle.io import list_bundles, load_manifest
from flaketriage.bundle.manifest import Provenance
from flaketriage.capture.provenance import detect_provenance
from flaketriage.ci.outbox import FlushResult, Outbox, Refusal
from flaketriage.errors import EventRefusedError, NotifyError, StoreError
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.files.modes import FileModes
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
    "Refusal",
    "Sending",
    "event_for_bundle",
    "forget_event",
    "is_retryable",
    "known_event",
    "merge_provenance",
    "post_signed",
    "record_deliveries",
    "remember_event",
    "send_bundles",
    "send_event",
    "send_or_queue",
    "status_error",
    "unsent_bundles",
]

log = logging.getLogger(__name__)

EVENT_REF = "events/"
MAX_DELAY_S = 30.0
"""Longest single wait between attempts; a Retry-After beyond it ends the retries (the event is queued)."""
HOLD_S = 60.0
"""After the service was unreachable, automatic sends queue without trying for this long."""
_RETRY_STATUSES = frozenset({408, 425, 429})
ALLOWED_STORES = "FLAKETRIAGE_ALLOWED_STORES"
"""What the service's refusal of an event's store names (`flaketriage.orchestrator.sightings`)."""
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
    """POST the signed event; retry connection errors, timeouts, 5xx, 408, 425 and 429 with backoff.

    Waits ``backoff_s * 2**n`` with jitter (or the server's Retry-After) between attempts and
    raises `NotifyError` once `retries` retries are spent. Any other answer that is not a success
    (a wrong URL or secret, an event the service does not take) is an `EventRefusedError` at once.
    """
    post_signed(url, event.body(), secret, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)


def post_signed(
    url: str,
    body: bytes,
    secret: bytes,
    *,
    timeout_s: float = 5.0,
    retries: int = 4,
    backoff_s: float = 0.5,
) -> httpx.Response:
    """POST `body` signed with `secret`, retrying what may pass later; the successful response.

    Raises `NotifyError` (transient: retries spent) or `EventRefusedError` (retrying cannot help).
    """
    import httpx  # only when something is sent: a capture that sends nothing never pays for it

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
                raise EventRefusedError(
                    f"cannot send to {url!r} ({exc}); set FLAKETRIAGE_NOTIFY_URL to the service's "
                    "https://HOST/v1/events",
                    setting="FLAKETRIAGE_NOTIFY_URL",
                ) from exc
            except httpx.TransportError as exc:
                failure = NotifyError(f"could not reach {url}: {type(exc).__name__}: {exc or 'no detail'}")
                retry_after = None
                continue
            if response.is_success:
                return response
            failure = status_error(url, response)
            if isinstance(failure, EventRefusedError):
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


def is_retryable(status: int) -> bool:
    """Whether an answer with this HTTP status may pass if sent again later: 5xx, 408, 425, 429."""
    return status >= 500 or status in _RETRY_STATUSES


def status_error(url: str, response: httpx.Response) -> NotifyError:
    """The error for a response that is not a success: an `EventRefusedError` naming the setting to
    change, unless `is_retryable`."""
    code = response.status_code
    detail = _detail(response)
    reason = response.reason_phrase or ""
    text = f"{url} answered HTTP {code} {reason}".rstrip() + (f": {detail}" if detail else "")
    if is_retryable(code):
        return NotifyError(text, status=code)
    setting, hint = _refusal_hint(code, detail, response.headers.get("Location"))
    return EventRefusedError(f"{text}; {hint}", status=code, setting=setting)


def _detail(response: httpx.Response) -> str:
    """The service's ``{"detail": ...}`` (or the body's text), on one line and cut short."""
    text = response.text
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("detail"), str):
        text = parsed["detail"]
    return " ".join(text.split())[:400]


def _refusal_hint(code: int, detail: str, location: str | None) -> tuple[str | None, str]:
    """The setting to change for a refusal, and what to do, in words."""
    if code in (401, 403):
        if "clock" in detail:
            return None, "sync this machine's clock (NTP): signatures are valid for 5 minutes"
        if "is not set" in detail:
            return "FLAKETRIAGE_WEBHOOK_SECRET", "set FLAKETRIAGE_WEBHOOK_SECRET on the service"
        return (
            "FLAKETRIAGE_WEBHOOK_SECRET",
            "set FLAKETRIAGE_WEBHOOK_SECRET to the secret the service has (the same on both sides)",
        )
    if 300 <= code < 400:
        return (
            "FLAKETRIAGE_NOTIFY_URL",
            f"it redirects to {location!r}: set FLAKETRIAGE_NOTIFY_URL to that URL",
        )
    if code in (404, 405, 410):
        return (
            "FLAKETRIAGE_NOTIFY_URL",
            "set FLAKETRIAGE_NOTIFY_URL to the service's events endpoint, https://HOST/v1/events",
        )
    if code == 422 and ALLOWED_STORES in detail:
        return (
            "FLAKETRIAGE_STORE",
            "set FLAKETRIAGE_STORE (pytest: --flaketriage-store; notify: --location) to a store the "
            f"service reads, or add this one to the service's {ALLOWED_STORES}",
        )
    if code == 413:
        return "FLAKETRIAGE_MAX_BODY_KB", "raise the service's FLAKETRIAGE_MAX_BODY_KB"
    return None, (
        f"the service does not take this event from flaketriage {__version__}: run the same "
        "flaketriage version on the service and here"
    )


@dataclass(frozen=True)
class Delivery:
    """What became of one event: sent, queued for a later run, or refused for good (not queued)."""

    bundle_id: str
    event_id: str
    status: Literal["sent", "queued", "refused"]
    error: str | None = None
    setting: str | None = None
    """For a refused event, the setting to change (None when no setting would help)."""

    def to_json(self) -> dict[str, object]:
        return {
            "bundle": self.bundle_id,
            "event_id": self.event_id,
            "status": self.status,
            "error": self.error,
            "setting": self.setting,
        }


class Notifier:
    """Sends events to one endpoint with one secret, queueing what cannot be sent yet in `outbox`."""

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
            Outbox(settings.resolved_outbox_dir(), modes=FileModes.of(settings.store_shared)),
            timeout_s=timeout_s,
            retries=retries,
            backoff_s=backoff_s,
        )

    def send(self, event: FailureEvent) -> None:
        """Send one event now; raises `NotifyError` (`EventRefusedError`: retrying cannot help)."""
        if not self.secret:
            raise EventRefusedError(
                "no webhook secret to sign events with: set FLAKETRIAGE_WEBHOOK_SECRET (or pass "
                "--secret-env NAME) to the service's secret",
                setting="FLAKETRIAGE_WEBHOOK_SECRET",
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
        """Send what the outbox holds, oldest first; what is refused for good leaves it."""
        result = self.outbox.flush(self.send)
        if result.unreachable:
            self.outbox.hold(HOLD_S)
        elif result.sent:
            self.outbox.release()
        return result

    def deliver(self, event: FailureEvent) -> Delivery:
        """Send `event`; queue it when that may work later, and drop it when it never will."""
        return self._deliver(event)[0]

    def _deliver(self, event: FailureEvent) -> tuple[Delivery, Refusal | None]:
        try:
            self.send(event)
        except EventRefusedError as exc:
            self.outbox.remove(event.event_id)
            refusal = Refusal.of(event, exc)
            return Delivery(
                event.bundle_id, event.event_id, "refused", refusal.reason, refusal.setting
            ), refusal
        except NotifyError as exc:
            return self.queue(event, str(exc), hold=not exc.event_rejected), None
        self.outbox.remove(event.event_id)  # a re-sent event that was also waiting there
        self.outbox.release()
        return Delivery(event.bundle_id, event.event_id, "sent"), None

    def queue(self, event: FailureEvent, reason: str, *, hold: bool = False) -> Delivery:
        self.outbox.put(event)
        if hold:
            self.outbox.hold(HOLD_S)
        return Delivery(event.bundle_id, event.event_id, "queued", reason)

    def deliver_all(self, events: Sequence[FailureEvent], flushed: FlushResult) -> list[Delivery]:
        """Deliver `events` after `flushed`, the outbox's flush: all are queued when the service was
        unreachable, and all are refused alike once the sender's own setup was refused (a wrong URL
        or secret: each would be refused the same way, so they are not sent)."""
        deliveries: list[Delivery] = []
        setup = next((r for r in flushed.refused if r.of_setup), None)
        for event in events:
            if setup is not None:
                delivery = Delivery(event.bundle_id, event.event_id, "refused", setup.reason, setup.setting)
            elif flushed.unreachable:  # the outbox could not go; neither will these: skip the retries
                delivery = self.queue(event, next(iter(flushed.errors.values())))
            else:
                delivery, refusal = self._deliver(event)
                if refusal is not None and refusal.of_setup:
                    setup = refusal
            deliveries.append(delivery)
        return deliveries


@dataclass
class Sending:
    """What one round of sending did: the outbox's flush, then each new event."""

    flushed: FlushResult
    deliveries: list[Delivery]
    outbox: Path

    @property
    def refusals(self) -> dict[str, list[str]]:
        """Why events were refused for good (one entry per distinct reason) → their event ids."""
        out: dict[str, list[str]] = {}
        for refusal in self.flushed.refused:
            out.setdefault(refusal.reason, []).append(refusal.event.event_id)
        for d in self.deliveries:
            if d.status == "refused":
                out.setdefault(d.error or "refused", []).append(d.event_id)
        return out

    def error_lines(self) -> list[str]:
        """One line per distinct refusal: how many events, why, and the setting to change."""
        return [
            f"{len(ids)} event(s) not sent and not queued (retrying cannot help): {why}; the bundles "
            "stay in the store, `flaketriage notify --new` sends them once that is fixed"
            for why, ids in self.refusals.items()
        ]

    def queued_lines(self) -> list[str]:
        """One line for the events waiting in the outbox for a later run, with the reason."""
        queued = [d for d in self.deliveries if d.status == "queued"]
        if not queued:
            return []
        why = queued[0].error or "not sent"
        return [
            f"{len(queued)} event(s) queued in {self.outbox} ({why}); the next run, or `flaketriage "
            "notify --flush`, sends them"
        ]


def send_bundles(settings: Settings, store: Store, bundle_ids: Sequence[str]) -> Sending | None:
    """Send the bundles' events to ``settings.notify_url`` after flushing the outbox.

    For automatic senders such as the pytest plugin. Delivery problems never raise: an event that
    may go later is queued (for a minute after the service was unreachable, events are queued
    without trying), and one that never will as things are set up is refused and not queued
    (`Sending.error_lines` says what to change). None when no URL is configured. Raises
    `FlaketriageError` only when a bundle is not in `store` or the outbox cannot be written.
    """
    if not settings.notify_url:
        return None
    notifier = Notifier.from_settings(settings)
    events = [event_for_bundle(store, bundle_id) for bundle_id in bundle_ids]
    if notifier.outbox.held():
        flushed = FlushResult()
        deliveries = [notifier.queue(e, "the service was unreachable moments ago") for e in events]
    else:
        flushed = notifier.flush()
        deliveries = notifier.deliver_all(events, flushed)
    record_deliveries(store, flushed, events, deliveries)
    return Sending(flushed, deliveries, notifier.outbox.directory)


def record_deliveries(
    store: Store, flushed: FlushResult, events: Sequence[FailureEvent], deliveries: Sequence[Delivery]
) -> None:
    """Remember the events sent or queued; forget the refused ones, so ``notify --new`` finds
    their bundles unsent once the setup is fixed."""
    for event, delivery in zip(events, deliveries, strict=True):
        if delivery.status == "refused":
            forget_event(store, event)
        else:
            remember_event(store, event)
    for refusal in flushed.refused:
        forget_event(store, refusal.event)


def send_or_queue(
    settings: Settings, store: Store, bundle_id: str
) -> Literal["sent", "queued", "refused", "off"]:
    """`send_bundles` for one bundle: what became of its event (``"off"``: no URL is configured)."""
    sending = send_bundles(settings, store, [bundle_id])
    if sending is None:
        return "off"
    for line in sending.queued_lines():
        log.warning("flaketriage: %s", line)
    for line in sending.error_lines():
        log.error("flaketriage: %s", line)
    return sending.deliveries[0].status


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


def forget_event(store: Store, event: FailureEvent) -> None:
    """Drop the record of `event` for its bundle, if that is the event recorded (best effort)."""
    known = known_event(store, event.bundle_id)
    if known is None or known.event_id != event.event_id:
        return
    try:
        store.delete_ref(EVENT_REF + event.bundle_id)
    except StoreError as exc:
        log.debug("could not forget event %s in %s: %s", event.event_id, store.location, exc)


def remember_event(store: Store, event: FailureEvent) -> None:
    """Record that `event` was sent or queued for its bundle (best effort: a read-only store skips it)."""
    try:
        store.put_ref(EVENT_REF + event.bundle_id, event.body())
    except StoreError as exc:
        log.debug("could not record event %s in %s: %s", event.event_id, store.location, exc)


def unsent_bundles(store: Store, location: StoreLocation | None = None) -> list[str]:
    """Captured bundles no event was made for yet, oldest first (what ``notify --new`` sends).

    A minimized bundle (it names a ``parent``) is the service's own and is never sent: sent, it
    would open a case of its own. A bundle with any recorded event was sent, whichever path or
    flaketriage version sent it: on a store shared between machines its location reads otherwise
    on each, and a second event would count its failure again. Only given `location` does an
    event for another location leave a bundle to send (for that location).
    """
    out = []
    for summary in reversed(list_bundles(store)):
        if summary.parent is not None:
            continue
        if location is None:
            if store.get_ref(EVENT_REF + summary.id) is None:
                out.append(summary.id)
            continue
        known = known_event(store, summary.id)
        if known is None or known.store != location:
            out.append(summary.id)
    return out
