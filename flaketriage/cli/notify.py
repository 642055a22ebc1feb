"""``flaketriage notify``: send bundles' events to the service, and flush the outbox."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from flaketriage.cli.console import JsonOption, StoreOption, err, labelled, settings_for
from flaketriage.errors import ConfigError

if TYPE_CHECKING:
    from flaketriage.ci.notify import Notifier, Sending


def notify(
    bundles: Annotated[
        list[str] | None,
        typer.Argument(
            help="Bundle ids (or unique prefixes) to send.", metavar="BUNDLE...", show_default=False
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to", help="The events endpoint (default: FLAKETRIAGE_NOTIFY_URL).", show_default=False
        ),
    ] = None,
    secret_env: Annotated[
        str | None,
        typer.Option(
            "--secret-env",
            help="Read the signing secret from this environment variable (default: "
            "FLAKETRIAGE_WEBHOOK_SECRET).",
            show_default=False,
        ),
    ] = None,
    new: Annotated[bool, typer.Option("--new", help="Send every bundle that has no event yet.")] = False,
    flush: Annotated[
        bool, typer.Option("--flush", help="Send the outbox (done before any send anyway).")
    ] = False,
    location: Annotated[
        str | None,
        typer.Option(
            "--location",
            help="Where the service can fetch the bundles, when they were uploaded elsewhere "
            "(s3://bucket/prefix or a path). Default: the store.",
            show_default=False,
        ),
    ] = None,
    retries: Annotated[int, typer.Option(min=0, help="Retries per event on errors worth retrying.")] = 4,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for each request.")] = 5.0,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="Exit 1 when an event was queued or refused (default: 0)."),
    ] = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send signed failure events to the service. What cannot be sent yet waits in the outbox; what
    the service refuses for good (a wrong URL or secret, a store it does not read) is an error line
    naming the setting to change. Exits 0 either way, unless --strict."""
    from flaketriage.ci.notify import Notifier, Sending, event_for_bundle, record_deliveries, unsent_bundles
    from flaketriage.events import StoreLocation
    from flaketriage.store import open_store

    if not (bundles or new or flush):
        raise ConfigError("nothing to send: give BUNDLE ids, --new (every unsent bundle) or --flush")
    settings = settings_for(store)
    url = to or settings.notify_url
    if not url:
        raise ConfigError(
            "no events endpoint: pass --to https://HOST/v1/events or set FLAKETRIAGE_NOTIFY_URL"
        )
    secret = None
    if secret_env is not None:
        secret = os.environ.get(secret_env, "").encode()
        if not secret:
            err.print(f"[yellow]warning:[/yellow] {escape(secret_env)} is not set; events cannot be signed")
    notifier = Notifier.from_settings(settings, url=url, secret=secret, timeout_s=timeout, retries=retries)

    st = open_store(settings.store, shared=settings.store_shared, settings=settings)
    where = StoreLocation.parse(location) if location else None
    ids = list(bundles or [])
    if new:
        ids += [b for b in unsent_bundles(st, where) if b not in ids]
    events = [event_for_bundle(st, ident, location=where) for ident in ids]

    flushed = notifier.flush()
    deliveries = notifier.deliver_all(events, flushed)
    record_deliveries(st, flushed, events, deliveries)
    sending = Sending(flushed, deliveries, notifier.outbox.directory)
    _report(sending, notifier, as_json)
    if strict and (flushed.kept or sending.refusals or any(d.status != "sent" for d in deliveries)):
        raise typer.Exit(1)


def _report(sending: Sending, notifier: Notifier, as_json: bool) -> None:
    flushed, deliveries, outbox = sending.flushed, sending.deliveries, sending.outbox
    if as_json:
        payload = {
            "url": notifier.url,
            "events": [d.to_json() for d in deliveries],
            "flushed": flushed.to_json(),
            "outbox": str(outbox),
            "pending": len(notifier.outbox.pending()),
        }
        print(json.dumps(payload, sort_keys=True))
    if flushed.sent:
        err.print(f"sent {len(flushed.sent)} queued event(s) from {escape(str(outbox))}")
    for event_id, why in flushed.errors.items():
        err.print(labelled("warning:", "yellow", f"queued event {event_id[:12]} not sent: {why}"))
    if flushed.unreachable and len(flushed.kept) > 1:
        err.print(f"{len(flushed.kept)} event(s) stay queued in {escape(str(outbox))}")
    if not (deliveries or flushed.sent or flushed.kept or flushed.refused):
        err.print(f"nothing to send: the outbox {escape(str(outbox))} is empty")
    for path in flushed.unreadable:
        err.print(labelled("warning:", "yellow", f"{path} is not an event flaketriage reads; delete it"))
    for d in deliveries:
        if d.status == "sent":
            err.print(f"sent bundle {d.bundle_id[:12]} (event {d.event_id[:12]}) to {escape(notifier.url)}")
        elif d.status == "queued":
            err.print(
                labelled(
                    "warning:",
                    "yellow",
                    f"bundle {d.bundle_id[:12]} not sent: {d.error or ''}; queued in {outbox}, "
                    "`flaketriage notify --flush` sends it",
                )
            )
    for line in sending.error_lines():  # last, where they are seen
        err.print(labelled("error:", "red", line))
