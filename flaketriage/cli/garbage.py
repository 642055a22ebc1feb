"""``flaketriage gc``: drop old bundles nobody keeps, then the objects no bundle references."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from flaketriage.cli.console import JsonOption, StoreOption, err, labelled, out, plain, settings_for
from flaketriage.errors import ConfigError

if TYPE_CHECKING:
    from flaketriage.store.gc import GarbageReport

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks", "": "days"}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``; a bare number is days."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(
            f"--older-than {text!r:.40} is not a duration: write a number with s, m, h, d or w "
            "(30d, 12h); a bare number is days"
        )
    return timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})


def gc(
    store: StoreOption = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Drop bundles captured longer ago than this (30d, 12h; a bare number is days) that no "
            "open case or quarantine entry keeps. Default: FLAKETRIAGE_GC_OLDER_THAN_DAYS.",
            show_default=False,
        ),
    ] = None,
    apply: Annotated[bool, typer.Option("--apply", help="Delete (without it: a dry run).")] = False,
    grace: Annotated[
        float,
        typer.Option("--grace", min=0, help="Hours: an object written more recently is never deleted."),
    ] = 1.0,
    as_json: JsonOption = False,
) -> None:
    """Collect the store's garbage: old bundles nobody keeps, then unreferenced objects (a dry run
    unless --apply); exit 1 when a manifest could not be read, so no object was deleted."""
    from flaketriage.store import open_store
    from flaketriage.store.gc import collect
    from flaketriage.store.retention import retained_bundles, service_database

    settings = settings_for(store)
    cutoff = timedelta(days=settings.gc_older_than_days)
    if older_than is not None:
        cutoff = parse_duration(older_than)
    st = open_store(settings.store, readonly=not apply, shared=settings.store_shared, settings=settings)
    database = service_database(settings)
    try:
        keep = retained_bundles(settings, database)
    finally:
        if database is not None:
            database.dispose()
    report = collect(st, keep=keep, older_than=cutoff, grace=timedelta(hours=grace), apply=apply)
    if as_json:
        out.print_json(json.dumps({"store": st.location, "retained": len(keep), **report.to_json()}))
    else:
        _say(report, st.location, grace)
    if not report.swept:
        raise typer.Exit(1)


def _say(report: GarbageReport, where: str, grace: float) -> None:
    for problem in report.problems:
        err.print(labelled("warning:", "yellow", problem))
    verb = "dropped" if report.applied else "would drop"
    line = (
        f"{where}: {verb} {len(report.bundles)} bundle(s) and {len(report.objects)} unreferenced object(s); "
        f"kept {report.kept_bundles} bundle(s) and {report.kept_objects} object(s)"
    )
    if report.skipped_young:
        line += f"; {report.skipped_young} object(s) younger than {grace:g} h left alone"
    if not report.applied and (report.bundles or report.objects):
        line += " (run with --apply to delete)"
    out.print(plain(line))
