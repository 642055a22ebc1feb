"""Reading webhook payloads: leniently (senders add fields all the time), but what is used is checked.

`field_of` reads a dotted path and says which field was missing or of the wrong type; `Parsed` is
what a delivery asks the service to record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flaketriage.orchestrator.intake import Sighting


class PayloadError(ValueError):
    """A payload without a field its event must have; answered with 422 naming the field."""


@dataclass
class Parsed:
    """What a delivery asks for: the sightings to record, and notes (bundles not found)."""

    handled: bool
    sightings: list[Sighting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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
