"""Reading webhook payloads: leniently (senders add fields all the time), but what is used is checked.

`field_of` reads a dotted path and says which field was missing or of the wrong type; `Parsed` is
what a delivery asks the service to record, and what it is about (`Parsed.subject`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from flaketriage.errors import PayloadError
from flaketriage.orchestrator.intake import Sighting


@dataclass
class Parsed:
    """What a delivery asks for: the sightings to record, and notes (bundles not found)."""

    handled: bool
    sightings: list[Sighting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    subject: str | None = None
    """What the signed body is about, as the body names it (``workflow_run:<id>:<attempt>``, a
    comment's id and ``updated_at`` ...): the delivery's key, so that the same body sent again under
    another delivery id (a header the signature does not cover) is a duplicate. None: the body names
    nothing of its own, and the sender's delivery id is the key, after `DELIVERY_KEY`."""


DELIVERY_KEY = "delivery:"
"""What a key taken from the sender's delivery id starts with, and no `subject` does: an id chosen to
spell a subject (``workflow_run:<id>:1``) names no body to come."""


def subject(*parts: object) -> str:
    """A `Parsed.subject` of `parts` (ids, actions, timestamps as the body gives them): their text
    while it fits the delivery id's column, else its SHA-256 (a cut key could name two bodies)."""
    text = ":".join(str(part) for part in parts)
    return text if len(text) <= 128 else "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def field_of(data: Any, path: str, kind: type | tuple[type, ...] = str, *, required: bool = True) -> Any:
    value = data
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        if required:
            raise PayloadError(f"the payload has no {path}")
        return None
    if not isinstance(value, kind):
        raise PayloadError(f"{path} must be a {getattr(kind, '__name__', kind)}")
    return value
