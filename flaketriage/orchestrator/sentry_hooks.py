"""Sentry webhooks (integration platform): ``event_alert`` and ``issue`` resources open or update a case.

The failure is fingerprinted in the same space as captured bundles (`fingerprint_exception`): the
exception type as Python prints it, the message, and the frames (Sentry lists them oldest first,
as a traceback does), so a production error of the same exception in the same code path as a
bundle captured in CI lands on the same case. A ``flaketriage.bundle.io`` tag (Sentry sends tags as
``[key, value]`` pairs) starts a triage of that bundle; one that is not a bundle id is refused. Other
resources (``metric_alert``, ``installation``, ...) are acknowledged and ignored.

A delivery is recorded by what its body is about (`Parsed.subject`), not by ``Request-ID``, which
Sentry's signature does not cover: an alert by its event's id (one event is one occurrence, however
many rules alert on it), an issue by its id, the action and its ``lastSeen`` (a regression comes
with a later one).
"""

from __future__ import annotations

from typing import Any

from flaketriage.errors import PayloadError
from flaketriage.failure.fingerprint import fingerprint_exception
from flaketriage.orchestrator.intake import Sighting, cause_key
from flaketriage.orchestrator.payloads import Parsed, field_of, subject
from flaketriage.orchestrator.sightings import StorePolicy, is_bundle_id, resolve_bundles

BUNDLE_TAG = "flaketriage.bundle"
_UNQUALIFIED = {None, "", "builtins", "__builtin__", "exceptions", "__main__"}


def parse(resource: str, payload: dict[str, Any], policy: StorePolicy) -> Parsed:
    """The sightings of one Sentry delivery (``Sentry-Hook-Resource`` = `resource`), and what it is
    about."""
    action = payload.get("action")
    if resource == "event_alert":
        parsed = _event_alert(payload, policy)
        event_id = field_of(payload, "data.event.event_id", (str, int), required=False)
        parsed.subject = subject(resource, event_id) if event_id else None
    elif resource == "issue" and action in ("created", "unresolved"):
        parsed = _issue(payload)
        issue_id = field_of(payload, "data.issue.id", (str, int), required=False)
        last_seen = field_of(payload, "data.issue.lastSeen", required=False) or ""
        parsed.subject = subject(resource, issue_id, action, last_seen) if issue_id else None
    else:
        parsed = Parsed(handled=False)
    return parsed


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _qualified(exc: dict[str, Any]) -> str:
    kind = exc.get("type")
    if not isinstance(kind, str) or not kind:
        raise PayloadError("data.event.exception.values[-1].type must be a non-empty string")
    module = exc.get("module")
    return kind if not isinstance(module, str) or module in _UNQUALIFIED else f"{module}.{kind}"


def _frames(exc: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """(file, function) pairs oldest first, and the roots that make files project-relative."""
    stack: dict[str, Any] = exc["stacktrace"] if isinstance(exc.get("stacktrace"), dict) else {}
    pairs: list[tuple[str, str]] = []
    roots: list[str] = []
    frames = stack.get("frames") or []
    if not isinstance(frames, list):
        raise PayloadError("data.event.exception.values[-1].stacktrace.frames must be a list")
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = _text(frame.get("filename"))
        abs_path = _text(frame.get("abs_path"))
        function = _text(frame.get("function")) or "?"
        path = abs_path or filename
        if abs_path and filename and not filename.startswith("/") and abs_path.endswith("/" + filename):
            roots.append(abs_path[: -len(filename) - 1])
        if path:
            pairs.append((path, function))
    return pairs, roots


def _tags(event: dict[str, Any]) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in field_of(event, "tags", list, required=False) or []:
        if isinstance(item, list | tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            tags[item[0]] = item[1]
        elif (
            isinstance(item, dict) and isinstance(item.get("key"), str) and isinstance(item.get("value"), str)
        ):
            tags[item["key"]] = item["value"]
    return tags


def _event_alert(payload: dict[str, Any], policy: StorePolicy) -> Parsed:
    event = field_of(payload, "data.event", dict)
    values = field_of(event, "exception.values", list, required=False) or []
    exceptions = [v for v in values if isinstance(v, dict)]
    tags = _tags(event)
    provenance = {
        "source": "sentry",
        "event_id": event.get("event_id"),
        "web_url": field_of(event, "web_url", required=False)
        or field_of(payload, "data.web_url", required=False),
        "release": event.get("release") if isinstance(event.get("release"), str) else None,
        "environment": event.get("environment") if isinstance(event.get("environment"), str) else None,
        "rule": field_of(payload, "data.triggered_rule", required=False),
    }
    provenance = {k: v for k, v in provenance.items() if v is not None}
    parsed = Parsed(handled=True)
    if exceptions:
        last = exceptions[-1]
        exc_type = _qualified(last)
        message = _text(last.get("value"))
        frames, roots = _frames(last)
        info = fingerprint_exception(exc_type, message, frames, roots)
        title = event.get("title") if isinstance(event.get("title"), str) else f"{exc_type}: {message}"
        parsed.sightings.append(
            Sighting(
                fingerprint=info.fingerprint,
                kind="sentry",
                title=f"sentry: {title}",
                cause_key=cause_key("exception", exc_type, message),
                provenance=provenance,
                trigger="never",
            )
        )
    elif not tags.get(BUNDLE_TAG):
        raise PayloadError("data.event has neither exception.values nor a flaketriage.bundle.io tag")
    bundle = tags.get(BUNDLE_TAG)
    if bundle:
        found, missing = resolve_bundles([_bundle_id(bundle)], policy, trigger="auto", extra=provenance)
        parsed.sightings.extend(found)
        parsed.notes.extend(missing)
    return parsed


def _bundle_id(tag: str) -> str:
    ident = tag.strip().lower()
    if not is_bundle_id(ident):
        raise PayloadError(
            f"data.event.tags: {BUNDLE_TAG} must name a bundle by its id, 12 to 64 hex digits (as "
            f"flaketriage.capture.sentry sets it), not {tag[:80]!a}; fix the tag where it is set"
        )
    return ident


def _issue(payload: dict[str, Any]) -> Parsed:
    issue = field_of(payload, "data.issue", dict)
    metadata = issue.get("metadata") if isinstance(issue.get("metadata"), dict) else {}
    exc_type = metadata.get("type") if isinstance(metadata.get("type"), str) else None
    message = _text(metadata.get("value"))
    if not exc_type:
        return Parsed(handled=False)  # a message or performance issue: nothing to replay or match
    frames: list[tuple[str, str]] = []
    if isinstance(metadata.get("filename"), str) and isinstance(metadata.get("function"), str):
        frames.append((metadata["filename"], metadata["function"]))
    info = fingerprint_exception(exc_type, message, frames)
    provenance = {
        "source": "sentry",
        "issue_id": str(issue.get("id")),
        "web_url": issue.get("web_url") or issue.get("permalink"),
    }
    return Parsed(
        handled=True,
        sightings=[
            Sighting(
                fingerprint=info.fingerprint,
                kind="sentry",
                title=f"sentry: {issue.get('title') or exc_type}",
                cause_key=cause_key("exception", exc_type, message),
                provenance={k: v for k, v in provenance.items() if v},
                trigger="never",
            )
        ],
    )
